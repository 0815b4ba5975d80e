//! The [`Store`] handle: a backend, a root prefix, a scope and a default timeout, and the
//! plumbing every operation shares (key layout, deadlines). The operations themselves are
//! in their own files (`key_ops.rs`, `counter.rs`, `queue.rs`, `barrier.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdzv_core::Kv;
use rdzv_core::kv::show_key;
use rdzv_core::kv::{LeaseId, PutMode, PutOptions};
use tokio::time::Instant;

use crate::error::StoreError;
use crate::layout;

/// The timeout of blocking calls unless [`Store::set_timeout`] says otherwise: 300 s, as
/// in c10d.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A c10d-style key-value store (PyTorch's `Store` API) over any [`Kv`] backend.
///
/// A `Store` is a cheap handle (`Clone`, `Send`, `Sync`): a backend, a *root* prefix under
/// which all its data lives on the backend, a *scope* (the prefix added by
/// [`with_prefix`](Store::with_prefix), empty at first) and the timeout of its blocking calls.
/// Clones share the backend and the data; each clone has its own timeout.
///
/// Keys and values are arbitrary bytes. Every operation is bounded by a deadline (the store
/// timeout, or the timeout passed to `wait`/`barrier`) and fails with
/// [`StoreError::Timeout`] when it passes; blocking calls (`get`, `multi_get`, `wait`,
/// blocking `queue_pop`, `barrier`) watch the awaited key from a known revision and never
/// poll.
///
/// To open a Store from a URL (`etcd://…`, `redis://…`, `mem://…`) without a rendezvous,
/// use the facade crate `rdzv`, which knows every backend; this crate only needs a
/// backend instance.
#[derive(Clone)]
pub struct Store {
    kv: Arc<dyn Kv>,
    root: Arc<[u8]>,
    scope: Arc<[u8]>,
    timeout: Duration,
    lease: Option<LeaseId>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.kv.name())
            .field("root", &show_key(&self.root))
            .field("scope", &show_key(&self.scope))
            .field("timeout", &self.timeout)
            .field("lease", &self.lease)
            .finish()
    }
}

impl Store {
    /// A Store keeping its data under `root` on `kv` (e.g. `b"myjob/v_3/kv/"`; end it with
    /// a separator, since it is used as a plain byte prefix). Two Stores with the same
    /// backend and root see the same data; Stores whose roots are not prefixes of one
    /// another never see each other's data. The timeout starts at [`DEFAULT_TIMEOUT`].
    pub fn new(kv: Arc<dyn Kv>, root: impl Into<Vec<u8>>) -> Store {
        Store {
            kv,
            root: root.into().into(),
            scope: Arc::from(&b""[..]),
            timeout: DEFAULT_TIMEOUT,
            lease: None,
        }
    }

    /// This handle, writing every key under `lease` (`None`: no lease, the data stays until
    /// deleted). A round's Store is bound to its run's lease, so that its data goes
    /// `run_ttl` after the run's last worker. Writes fail with the backend's "lease not
    /// found" error once the lease is gone. Counters then use compare-and-swap rather than a
    /// backend's native increment, which cannot attach a lease.
    pub fn with_lease(mut self, lease: Option<LeaseId>) -> Store {
        self.lease = lease;
        self
    }

    /// The lease this handle's writes are bound to, if any.
    pub fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    /// The options of a write under `mode`, bound to this handle's lease.
    pub(crate) fn write(&self, mode: PutMode) -> PutOptions {
        PutOptions { mode, lease: self.lease }
    }

    /// c10d's `PrefixStore(prefix, store)`: a view of this Store in which every key `k`
    /// (user keys, queues and barriers alike) is `prefix/k` of this Store. Views nest
    /// (`s.with_prefix("a").with_prefix("b")` uses `a/b/k`), and a view cannot reach keys
    /// outside its prefix. `num_keys` and `list_keys` of a view count only the keys under
    /// its prefix, listed without it. The view inherits this handle's timeout.
    pub fn with_prefix(&self, prefix: impl AsRef<[u8]>) -> Store {
        let mut scope = self.scope.to_vec();
        scope.extend_from_slice(prefix.as_ref());
        scope.push(b'/');
        Store { scope: scope.into(), ..self.clone() }
    }

    /// The timeout of this handle's blocking calls (and the deadline of every other call).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the timeout of this handle (other clones keep theirs).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// This handle with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Store {
        self.timeout = timeout;
        self
    }

    /// The backend.
    pub fn kv(&self) -> &Arc<dyn Kv> {
        &self.kv
    }

    /// The root prefix given to [`Store::new`].
    pub fn root(&self) -> &[u8] {
        &self.root
    }

    /// The scope added by [`with_prefix`](Store::with_prefix) (`b"a/b/"`; empty if none).
    pub fn scope(&self) -> &[u8] {
        &self.scope
    }

    pub(crate) fn user_key(&self, key: &[u8]) -> Vec<u8> {
        layout::user_key(&self.root, &self.scope, key)
    }

    pub(crate) fn user_prefix(&self) -> Vec<u8> {
        layout::user_prefix(&self.root, &self.scope)
    }

    pub(crate) fn queue_prefix(&self, key: &[u8]) -> Vec<u8> {
        layout::queue_prefix(&self.root, &self.scope, key)
    }

    pub(crate) fn barrier_prefix(&self, key: &[u8]) -> Vec<u8> {
        layout::barrier_prefix(&self.root, &self.scope, key)
    }

    /// Runs `work` with a deadline of `timeout` from now; when it passes, the work is
    /// dropped (cancelling its watches) and the error names `operation` and `keys`.
    pub(crate) async fn bounded<T>(
        &self,
        operation: &'static str,
        keys: &[&[u8]],
        timeout: Duration,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(deadline_after(timeout), work).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout {
                operation,
                keys: keys.iter().map(|k| k.to_vec()).collect(),
                after: timeout,
            }),
        }
    }
}

impl Store {
    /// [`Store::bounded`] for an operation that is not safe to repeat: `work` calls
    /// [`Sent::mark`] before each write whose effect a failure would leave in doubt. A
    /// failure after that — the deadline, or a retryable backend error (the answer was lost,
    /// not the request refused) — is [`StoreError::OutcomeUnknown`], so that nobody repeats
    /// a write that may have been applied.
    pub(crate) async fn bounded_write<T, F, Fut>(
        &self,
        operation: &'static str,
        keys: &[&[u8]],
        timeout: Duration,
        work: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(Sent) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let sent = Sent::default();
        let unknown = |reason: String| StoreError::OutcomeUnknown {
            operation,
            keys: keys.iter().map(|k| k.to_vec()).collect(),
            reason,
        };
        match self.bounded(operation, keys, timeout, work(sent.clone())).await {
            Err(StoreError::Timeout { after, .. }) if sent.is_marked() => {
                Err(unknown(format!("no answer came within the timeout of {after:?}")))
            }
            Err(StoreError::Backend(e)) if sent.is_marked() && e.is_retryable() => {
                Err(unknown(format!("it failed: {e}")))
            }
            other => other,
        }
    }
}

/// Whether an operation has sent a write (see [`Store::bounded_write`]); clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sent(Arc<std::sync::atomic::AtomicBool>);

impl Sent {
    /// A write is about to be sent.
    pub(crate) fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The write was declined without taking effect.
    pub(crate) fn clear(&self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    fn is_marked(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `timeout` from now, or a date decades away if that does not fit in an [`Instant`].
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(60 * 60 * 24 * 365 * 30))
}

/// The bytes of each key of `keys`.
pub(crate) fn collect_keys<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Vec<Vec<u8>> {
    keys.into_iter().map(|k| k.as_ref().to_vec()).collect()
}
