//! # rdzv
//!
//! Rendezvous for distributed jobs: the workers of a job meet through a key-value store
//! (etcd v3, Redis, or memory), agree on membership, each get a rank and the world size,
//! and share a c10d-style [`Store`] for bootstrapping. When a worker dies, leaves or
//! arrives late, the group notices and forms a new round.
//!
//! The backend is chosen by the URL's scheme:
//! `etcd://host:2379/<run_id>?min_workers=2&max_workers=8`, `etcds://…` (TLS),
//! `redis://host:6379/<run_id>?…`, `rediss://…`, or `mem://<name>/<run_id>?…` (in-process).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two workers of job "job42" (in one process here; normally one per machine).
//! let url = "mem://doc/job42?min_workers=2&max_workers=4&last_call_timeout=1s";
//! let a = rdzv::connect(url).await?;
//! let b = rdzv::connect(url).await?;
//! let (ra, rb) = tokio::try_join!(a.next_rendezvous(), b.next_rendezvous())?;
//! assert_eq!((ra.info.world_size, rb.info.world_size), (2, 2));
//! assert_eq!(ra.info.rank + rb.info.rank, 1); // ranks 0 and 1
//! assert_eq!(ra.bootstrap, rb.bootstrap); // MASTER_ADDR / MASTER_PORT, from rank 0
//!
//! // The round's Store, shared by its members.
//! ra.store.set("ready", b"1").await?;
//! assert_eq!(rb.store.get("ready").await?, b"1");
//!
//! assert_eq!(a.num_nodes_waiting().await?, 0);
//! b.shutdown().await?; // b leaves; the run stays open…
//! println!("{:?}", a.round_broken().await); // …and a is told its round broke
//! a.set_closed().await?; // the run is over, for everyone
//! # Ok(())
//! # }
//! ```

mod bootstrap;
pub mod health;
mod registry;
mod rendezvous;
pub mod segment;

// One path per item: what a user of rdzv names is here; a backend's author (the `Kv`
// contract, the protocol) depends on `rdzv-core` itself.
pub use bootstrap::{Bootstrap, MASTER_ADDR_KEY, MASTER_PORT_KEY};
pub use rdzv_core::params::{HealthParams, RankOrder};
pub use rdzv_core::{
    ConfigError, Exclusion, Participant, RendezvousError, RendezvousHandler, RendezvousInfo,
    RendezvousParams, RoundBroken, RoundChanges, RoundTimings, RunOutcome, Waiting,
};
pub use rdzv_mem as mem;
pub use rdzv_store::{Store, StoreError};
pub use registry::registry;
pub use rendezvous::{Rendezvous, Round};

/// The README's examples, run as doc tests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Joins the run named by `url` as one worker: parses the URL (see the crate docs), connects
/// the backend (one shared client per process and server), and starts this worker's
/// session. Errors: [`RendezvousError::Config`] for a bad URL or option (one clear
/// sentence), [`RendezvousError::Unavailable`] when the server cannot be reached.
pub async fn connect(url: &str) -> Result<Rendezvous, RendezvousError> {
    let (kv, params) = registry().connect(url).await?;
    Rendezvous::new(kv, params).await
}

/// A [`Store`] on its own, without a rendezvous, under the run named by `url`
/// (`<prefix>/run_<run_id>/store/`); rendezvous options like `min_workers` are not needed
/// (the URL is read as a [`RunAddress`](rdzv_core::url::RunAddress)).
pub async fn open_store(url: &str) -> Result<Store, RendezvousError> {
    let (kv, address) = registry().connect_backend(url).await?;
    Ok(Store::new(kv, format!("{}store/", address.keys().root()).into_bytes()))
}
