//! # rdzv-core
//!
//! The backend-agnostic heart of rdzv: the [`Kv`] contract every backend implements (with
//! its conveniences in [`KvExt`] and [`Session`]), the errors, the parameters and URL
//! parsing, the backend registry, and the rendezvous protocol itself.

mod error;
pub mod events;
mod ext;
mod ids;
mod kv;
pub mod layer;
pub mod metrics;
mod params;
mod per_process;
mod registry;
mod rendezvous;
mod retry;
mod session;
#[cfg(test)]
mod stub;
mod url;
pub mod wait;

// The backend contract: the trait, its types, its conveniences and errors.
/// The byte buffer of [`KeyValue::value`] (re-exported from the `bytes` crate): cheap to clone,
/// derefs to `[u8]`.
pub use bytes::Bytes;
pub use error::{BoxError, ConfigError, KvError, RendezvousError};
pub use ext::{KvExt, Watch, show_key};
pub use kv::*;
pub use per_process::PerProcess;
pub use retry::{retry_delays, retry_while_busy};
pub use session::{RefreshFailed, Session};

// Parameters, URLs and identifiers.
pub use ids::{ID_PUNCTUATION, ID_RULE, MAX_ID_LEN, is_id_char, validate_id};
pub use params::{
    DEFAULT_PREFIX, MAX_DURATION, OPTIONS, RankOrder, RendezvousParams, canonical_option_name, insert_option,
    is_rendezvous_option, option_names, parse_duration,
};
pub use url::{
    Endpoint, PASSWORD_ENV, RendezvousUrl, RunAddress, Secret, URL_OPTIONS, parse_endpoint, redact_url_text,
};

// Backends chosen by URL scheme.
pub use registry::{BackendFactory, Registry};

// The rendezvous.
pub use rendezvous::{
    Joiner, LastRound, Participant, RendezvousHandler, RendezvousInfo, RoundBroken, RoundChanges,
    RoundTimings, RunKeys, RunOutcome, Sizing, State, Waiting, free_port,
};

/// The protocol's pure core (docs/PROTOCOL.md): the decision tables and the state machine of
/// one `next_rendezvous` call, which do no I/O. [`RendezvousHandler`] drives them against a
/// [`Kv`]; they are public so that tests (and other executors) can drive them directly.
pub mod protocol {
    pub use crate::rendezvous::decide;
    pub use crate::rendezvous::machine::{
        Action, Bind, Call, Completed, Input, Leaving, Leftovers, Machine, Observed,
    };
}

#[cfg(feature = "testing")]
pub mod testing;
