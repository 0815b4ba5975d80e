//! The rendezvous parameters' helpers: the option table that names them in URLs (with the
//! reference's aliases), the duration syntax, the defaults, and [`RankOrder`]. The
//! parameters themselves are [`RendezvousParams`], at the crate
//! root (docs/OPTIONS.md lists every option).

pub(crate) mod rules;

pub use rules::{
    DEFAULT_MEMBERS_INLINE_BYTES, DEFAULT_PREFIX, HealthParams, MAX_DURATION, OPTIONS, RankOrder,
    canonical_option_name, is_rendezvous_option, option_names, parse_duration,
};

// `RendezvousParams` has its one public path at the crate root.
pub(crate) use rules::{RendezvousParams, insert_option};
