//! The rendezvous parameters' helpers: the option table that names them in URLs (with the
//! reference's aliases), the duration syntax, the defaults, and [`RankOrder`]. The
//! parameters themselves are [`RendezvousParams`], at the crate
//! root (docs/OPTIONS.md lists every option).

pub(crate) mod rules;

pub use rules::{
    BASE_KEEP_ALIVE_TTL, DEFAULT_MEMBERS_INLINE_BYTES, DEFAULT_PREFIX, HealthParams, MAX_DURATION, OPTIONS,
    RankOrder, WORKERS_PER_KEEP_ALIVE_SECOND, canonical_option_name, default_keep_alive_ttl,
    is_rendezvous_option, option_names, parse_duration,
};

// `RendezvousParams` has its one public path at the crate root.
pub(crate) use rules::{RendezvousParams, insert_option};
