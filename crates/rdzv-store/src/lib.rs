//! # rdzv-store
//!
//! A c10d-style [`Store`] (the API of PyTorch's `torch.distributed.Store`, so that people
//! who know `TCPStore` know this one) over any rdzv backend: etcd v3, Redis or memory. It
//! is written once against the [`Kv`](rdzv_core::Kv) contract.
//!
//! | operation | semantics |
//! |---|---|
//! | [`set`](Store::set) | insert or overwrite; wakes every waiter on the key |
//! | [`get`](Store::get) | **blocks** until the key exists or the store timeout (300 s) passes |
//! | [`add`](Store::add) | atomic counter (missing = 0), stored as decimal text |
//! | [`compare_set`](Store::compare_set), [`compare_set_checked`](Store::compare_set_checked) | compare-and-set with c10d's missing-key rule |
//! | [`wait`](Store::wait), [`check`](Store::check) | block until keys exist / whether they exist |
//! | [`delete_key`](Store::delete_key), [`num_keys`](Store::num_keys), [`list_keys`](Store::list_keys) | |
//! | [`multi_get`](Store::multi_get), [`multi_set`](Store::multi_set), [`append`](Store::append) | |
//! | [`queue_push`](Store::queue_push), [`queue_pop`](Store::queue_pop), [`queue_len`](Store::queue_len) | FIFO queues; each item popped exactly once |
//! | [`barrier`](Store::barrier) | all-ranks barrier, O(1) backend writes per rank |
//! | [`with_prefix`](Store::with_prefix) | c10d's `PrefixStore` |
//!
//! Keys and values are arbitrary bytes. Blocking calls watch the awaited key from a known
//! revision (they never poll), and every call has a deadline: see [`StoreError::Timeout`].
//!
//! A finished rendezvous hands each worker a Store scoped to its round. To use a Store on
//! its own, build it from any backend with [`Store::new`]; opening one from a URL
//! (`rdzv::open_store(url)`) lives in the facade crate `rdzv`, which knows every backend.
//! Its data carries no lease: it stays on the backend until deleted. The Store's semantics,
//! key layout and lifetime are described in `docs/STORE.md`.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use rdzv_mem::MemKv;
//! use rdzv_store::Store;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rdzv_store::StoreError> {
//! let store = Store::new(Arc::new(MemKv::new()), "myjob/").with_timeout(Duration::from_secs(10));
//!
//! // A worker blocks on the master's address until rank 0 publishes it.
//! let worker = store.clone();
//! let waiting = tokio::spawn(async move { worker.get("MASTER_ADDR").await });
//! store.set("MASTER_ADDR", "10.0.0.1").await?;
//! assert_eq!(waiting.await.expect("the worker task")?, b"10.0.0.1");
//!
//! // Counters are atomic and stored as decimal text.
//! assert_eq!(store.add("arrived", 1).await?, 1);
//! assert_eq!(store.add("arrived", 2).await?, 3);
//! assert_eq!(store.get("arrived").await?, b"3");
//!
//! // A PrefixStore is a view: its key `x` is the parent's `trainer/x`.
//! let trainer = store.with_prefix("trainer");
//! trainer.set("x", [0u8, 255]).await?;
//! assert_eq!(store.get("trainer/x").await?, [0u8, 255]);
//!
//! // Queues hand each item to exactly one popper.
//! store.queue_push("jobs", "a").await?;
//! assert_eq!(store.queue_pop("jobs", false).await?, b"a");
//! assert!(matches!(
//!     store.queue_pop("jobs", false).await,
//!     Err(rdzv_store::StoreError::QueueEmpty { .. })
//! ));
//! # Ok(())
//! # }
//! ```

mod barrier;
mod counter;
mod error;
mod key_ops;
mod layout;
mod queue;
mod store;

#[cfg(feature = "testing")]
pub mod testing;

pub use counter::CompareSet;
pub use error::StoreError;
pub use store::{DEFAULT_TIMEOUT, Store};
