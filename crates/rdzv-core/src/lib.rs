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
    Participant, RendezvousHandler, RendezvousInfo, RoundBroken, RoundChanges, RoundTimings, RunOutcome,
    Waiting,
};

/// The protocol's pure core (docs/PROTOCOL.md): the decision tables and the state machine of
/// one `next_rendezvous` call, which do no I/O, with the values they work on (the state
/// value, the key layout). [`RendezvousHandler`] drives them against a [`Kv`]; they are
/// public so that tests, tools that read a run's keys (`rdzv status`) and other executors
/// can use them directly.
pub mod protocol {
    pub use crate::rendezvous::decide;
    pub use crate::rendezvous::forget;
    /// (Public, in this module, because the facade's bootstrap uses it too: rank 0 picks a
    /// `MASTER_PORT` with it when it offered none; so would another executor filling a
    /// worker's descriptor.)
    pub use crate::rendezvous::free_port;
    pub use crate::rendezvous::machine::{
        Action, Bind, Call, Completed, Input, Leaving, Leftovers, Machine, Observed,
    };
    pub use crate::rendezvous::{Joiner, LastRound, RunKeys, State};
}

#[cfg(feature = "testing")]
pub mod testing;
