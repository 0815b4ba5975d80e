//! # rdzv-core
//!
//! The backend-agnostic heart of rdzv: the [`Kv`] contract every backend implements (with
//! its conveniences in [`KvExt`] and [`Session`]), the errors, the parameters and URL
//! parsing, the backend registry, and the rendezvous protocol itself.

pub mod error;
pub mod ids;
pub mod kv;
pub mod params;

pub use error::{BoxError, ConfigError, KvError, RendezvousError};
pub use kv::*;
pub use params::RendezvousParams;
pub mod ext;
pub mod session;

pub use ext::KvExt;
pub use session::Session;
pub mod registry;
pub mod url;

pub use registry::{BackendFactory, Registry};
pub use url::{Endpoint, RendezvousUrl, RunAddress, Secret};
pub mod rendezvous;

pub use rendezvous::{
    Participant, RendezvousHandler, RendezvousInfo, RoundBroken, RoundTimings, Sizing, State, free_port,
};
#[cfg(feature = "testing")]
pub mod testing;
