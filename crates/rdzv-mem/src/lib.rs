//! # rdzv-mem
//!
//! The in-memory backend of rdzv, [`MemKv`].
//!
//! [`MemKv`] implements the whole [`Kv`](rdzv_core::Kv) contract (docs/KV.md) in one process:
//! revisions, preconditions, leases on tokio time (deterministic under
//! `tokio::time::pause()`), watches from any retained revision, a bounded history and
//! compaction. [`MemKv::named`] returns process-wide shared instances, which
//! [`MemFactory`] serves for `mem://<name>/…` URLs.
//!
//! To test how callers cope with a slow or failing store, wrap it in
//! [`rdzv_core::layer::FaultyKv`].
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use futures::StreamExt;
//! use rdzv_core::Kv;
//! use rdzv_core::kv::{EventKind, PutMode, PutOptions, PutOutcome, WatchScope};
//! use rdzv_mem::MemKv;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rdzv_core::KvError> {
//! tokio::time::pause(); // leases follow the (virtual) tokio clock
//! let kv = Arc::new(MemKv::new());
//!
//! // Create-if-absent: the second attempt learns the winner's key instead of an error.
//! let first = kv.put(b"job/leader", b"a", PutOptions::new(PutMode::Create)).await?;
//! assert!(first.is_written());
//! let second = kv.put(b"job/leader", b"b", PutOptions::new(PutMode::Create)).await?;
//! let PutOutcome::Conflict { current: Some(winner) } = second else { panic!("expected a conflict") };
//! assert_eq!(winner.value, &b"a"[..]);
//!
//! // A key bound to a lease disappears, with a delete event, when the lease expires.
//! let lease = kv.lease_grant(Duration::from_secs(5)).await?;
//! kv.put(b"job/worker", b"1", PutOptions::OVERWRITE.with_lease(Some(lease))).await?;
//! let mut events = kv.watch(b"job/worker", WatchScope::Key, kv.revision()).await?;
//! assert_eq!(events.next().await.expect("the put")?.kind, EventKind::Put);
//! // Waiting lets the paused clock run to the lease's deadline.
//! let deleted = events.next().await.expect("the expiry")?;
//! assert_eq!(deleted.kind, EventKind::Delete);
//! assert!(kv.get(b"job/worker").await?.kv.is_none());
//! # Ok(())
//! # }
//! ```

mod factory;
mod kv;
mod named;
mod reaper;
mod shared;
mod state;
mod watch;

pub use factory::MemFactory;
pub use kv::{
    DEFAULT_HISTORY_LIMIT, DEFAULT_MAX_KEY_SIZE, DEFAULT_MAX_VALUE_SIZE, MIN_LEASE_TTL, MemKv, MemKvBuilder,
};
