//! # rdzv-core
//!
//! The backend-agnostic heart of rdzv: the [`Kv`] contract every backend implements (its
//! values in [`kv`], its conveniences in [`KvExt`] and [`Session`]), the errors, the
//! parameters ([`RendezvousParams`], helpers in [`params`]) and URLs ([`RendezvousUrl`],
//! helpers in [`url`]), the identifier rule ([`ids`]), the backend [`Registry`], and the
//! rendezvous itself ([`RendezvousHandler`]; its pure core in [`protocol`]).

mod error;
pub mod events;
mod ext;
pub mod ids;
pub mod kv;
pub mod layer;
pub mod metrics;
pub mod params;
pub mod per_process;
mod registry;
mod rendezvous;
pub mod retry;
mod session;
#[cfg(test)]
mod stub;
pub mod url;
pub mod wait;

// Every public item has one path: the types most code names are here at the root, the rest
// in the named modules (`kv`, `url`, `params`, `ids`, `protocol`, …).

// The backend contract (its values are in `kv`), its conveniences, and the errors.
pub use error::{BoxError, ConfigError, KvError, RendezvousError};
pub use ext::KvExt;
pub use kv::contract::{Kv, KvResult};
pub use session::{RefreshFailed, Session};

// Parameters and URLs (their helpers are in `params` and `url`), and the backends chosen by
// URL scheme.
pub use params::rules::RendezvousParams;
pub use registry::{BackendFactory, Registry};
pub use url::parse::RendezvousUrl;

// The rendezvous: the worker's handle and what it tells about rounds.
pub use rendezvous::{
    Exclusion, Participant, RendezvousHandler, RendezvousInfo, RoundBroken, RoundChanges, RoundTimings,
    RunOutcome, Waiting,
};

/// **Unstable**: the protocol's pure core (docs/PROTOCOL.md), for what needs it beside
/// [`RendezvousHandler`] — tools that read a run's keys (`rdzv status`: the state value and
/// the key layout), the protocol's own tests, another executor of the state machine of one
/// `next_rendezvous` call. Its items may change in any release, without notice; a program
/// that takes part in a run uses [`RendezvousHandler`] (or the `rdzv` facade) instead.
pub mod protocol {
    /// (The facade's bootstrap uses it too: rank 0 picks a `MASTER_PORT` with it when it
    /// offered none; so would another executor filling a worker's descriptor.)
    pub use crate::rendezvous::free_port;
    pub use crate::rendezvous::{Current, Joiner, LastRound, RunKeys, SegmentRuns, State};
    // The state machine and what it needs to be driven by hand.
    pub use crate::rendezvous::decide::{Candidate, LEAVE_STAGGER_STEP, Sizing, leave_delay};
    pub use crate::rendezvous::machine::{
        Action, Bind, Call, Completed, Input, Leaving, Leftovers, Machine, Observed,
    };
    // Which old rounds a round's creator deletes, and in what pieces.
    pub use crate::rendezvous::forget::{
        FORGET_WAIT_FOR, Forgotten, KEYS_PER_DELETE, MAX_ROUNDS_FORGOTTEN_AT_ONCE, PAUSE_BETWEEN_DELETES,
        record_after, rounds_to_forget,
    };
}

#[cfg(feature = "testing")]
pub mod testing;
