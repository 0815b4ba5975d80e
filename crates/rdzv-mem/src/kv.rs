//! [`MemKv`]: the in-memory backend. One lock around [`State`]; leases on tokio time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rdzv_core::kv::{
    Capabilities, CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, LeaseId,
    PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, SizeLimit, WatchScope, WatchStream,
};
use rdzv_core::{Kv, KvError, KvResult};
use tokio::time::Instant;

use crate::reaper::{self, ReaperSignal};
use crate::shared::Shared;
use crate::state::State;
use crate::watch;

/// Default number of revisions of event history a [`MemKv`] retains.
pub const DEFAULT_HISTORY_LIMIT: usize = 100_000;

/// The shortest lease TTL: shorter requests are rounded up to it.
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(1);

/// Default largest key a [`MemKv`] stores, in bytes (4 KiB): far above any key rdzv
/// builds, small enough that a runaway key is caught.
pub const DEFAULT_MAX_KEY_SIZE: usize = 4 * 1024;

/// Default largest value a [`MemKv`] stores, in bytes (1.5 MiB, etcd's default request
/// limit), so that what works on `mem://` also fits on etcd.
pub const DEFAULT_MAX_VALUE_SIZE: usize = 3 * 512 * 1024;

/// An in-memory [`Kv`] with the complete semantics of docs/KV.md: one store-wide revision
/// counter, preconditions whose failure returns the current key, leases on tokio time,
/// watches from any retained revision and a bounded event history.
///
/// Leases run on [`tokio::time::Instant`], so under `tokio::time::pause()` expiry is
/// deterministic: a lease expires exactly `ttl` after its grant (or last keep-alive) of the
/// virtual clock. A background task (started by the first lease grant or watch, ended when the store
/// is dropped) deletes the keys of expired leases even if nobody calls the store; every
/// call also expires overdue leases first, so results never depend on when that task ran.
///
/// History keeps the last [`MemKvBuilder::history_limit`] revisions; a watch from an older
/// revision, or from one before [`Kv::compact`], fails with [`KvError::Compacted`].
///
/// Keys are at most [`DEFAULT_MAX_KEY_SIZE`] bytes and values at most
/// [`DEFAULT_MAX_VALUE_SIZE`] (both settable with [`MemKvBuilder`]): a larger write (a put
/// or an increment) fails with [`KvError::TooLarge`] and stores nothing.
pub struct MemKv {
    pub(crate) shared: Arc<Shared>,
    signal: Arc<ReaperSignal>,
    limits: Limits,
}

/// The size limits of one store.
#[derive(Debug, Clone, Copy)]
struct Limits {
    key: SizeLimit,
    value: SizeLimit,
}

impl Limits {
    /// Fails with [`KvError::TooLarge`] if `key` or `value` is over its limit.
    fn check(&self, key: &[u8], value: &[u8]) -> KvResult<()> {
        self.key.check(key.len())?;
        self.value.check(value.len())
    }
}

impl Default for Limits {
    fn default() -> Self {
        let limit = |what, limit, raise| SizeLimit { backend: "mem", what, limit, raise: Some(raise) };
        Limits {
            key: limit("a key", DEFAULT_MAX_KEY_SIZE, "MemKv::builder().max_key_size(bytes)"),
            value: limit("a value", DEFAULT_MAX_VALUE_SIZE, "MemKv::builder().max_value_size(bytes)"),
        }
    }
}

/// Builder of a [`MemKv`] with non-default settings.
#[derive(Debug, Clone)]
pub struct MemKvBuilder {
    history_limit: usize,
    limits: Limits,
}

impl MemKvBuilder {
    /// Retain the events of at most `revisions` revisions (at least 1); a watch from an
    /// older revision fails with [`KvError::Compacted`]. Default: [`DEFAULT_HISTORY_LIMIT`].
    pub fn history_limit(mut self, revisions: usize) -> Self {
        self.history_limit = revisions.max(1);
        self
    }

    /// Refuse keys longer than `bytes` with [`KvError::TooLarge`]. Default:
    /// [`DEFAULT_MAX_KEY_SIZE`].
    pub fn max_key_size(mut self, bytes: usize) -> Self {
        self.limits.key.limit = bytes;
        self
    }

    /// Refuse values longer than `bytes` with [`KvError::TooLarge`]. Default:
    /// [`DEFAULT_MAX_VALUE_SIZE`].
    pub fn max_value_size(mut self, bytes: usize) -> Self {
        self.limits.value.limit = bytes;
        self
    }

    /// Builds the store. Needs no runtime; the lease reaper starts with the first lease.
    pub fn build(self) -> MemKv {
        MemKv {
            shared: Arc::new(Shared::new(State::new(self.history_limit))),
            signal: Arc::new(ReaperSignal::default()),
            limits: self.limits,
        }
    }
}

impl Default for MemKvBuilder {
    fn default() -> Self {
        MemKvBuilder { history_limit: DEFAULT_HISTORY_LIMIT, limits: Limits::default() }
    }
}

impl Default for MemKv {
    fn default() -> Self {
        MemKv::new()
    }
}

impl MemKv {
    /// An empty store with default settings.
    pub fn new() -> Self {
        MemKv::builder().build()
    }

    /// A builder for a store with non-default settings.
    pub fn builder() -> MemKvBuilder {
        MemKvBuilder::default()
    }

    /// The current store revision (0 before the first write).
    pub fn revision(&self) -> Revision {
        self.state().revision()
    }

    /// The oldest revision a watch can still start from.
    pub fn oldest_revision(&self) -> Revision {
        self.state().first_available()
    }

    /// How many watch streams are open (dropped streams are removed at once).
    pub fn watcher_count(&self) -> usize {
        self.shared.lock().watcher_count()
    }

    /// Locks the state after expiring overdue leases.
    fn state(&self) -> MutexGuard<'_, State> {
        let mut state = self.shared.lock();
        state.expire_leases(Instant::now());
        state
    }

    /// Makes sure a reaper runs, in the current runtime (the one that ran an earlier reaper
    /// may have shut down since). Outside a tokio runtime there is none, and leases expire
    /// only when the store is called.
    fn ensure_reaper(&self) {
        if tokio::runtime::Handle::try_current().is_ok() && !self.signal.running.swap(true, Ordering::SeqCst)
        {
            reaper::spawn(Arc::downgrade(&self.shared), self.signal.clone());
        }
    }
}

impl std::fmt::Debug for MemKv {
    /// A summary; the keys and history could be large.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("MemKv")
            .field("revision", &state.revision())
            .field("oldest_revision", &state.first_available())
            .field("watchers", &state.watcher_count())
            .finish_non_exhaustive()
    }
}

impl Drop for MemKv {
    fn drop(&mut self) {
        self.signal.closed.store(true, Ordering::SeqCst);
        self.signal.notify.notify_one();
    }
}

#[async_trait]
impl Kv for MemKv {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_increment: true,
            counted_create: true,
            min_lease_ttl: MIN_LEASE_TTL,
            ..Capabilities::default()
        }
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        let state = self.state();
        Ok(GetResponse { kv: state.get(key), revision: state.revision() })
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        Ok(self.state().range(prefix, options))
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        self.limits.check(key, value)?;
        self.state().put(key, value, options)
    }

    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        self.limits.check(key, value)?;
        self.limits.check(tally, b"")?;
        self.state().create_counted(key, value, lease, tally, tally_lease)
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        Ok(self.state().delete(key, mode))
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        if prefix.is_empty() {
            return Err(KvError::InvalidArgument(
                "delete_prefix needs a non-empty prefix; delete keys one by one to clear everything".into(),
            ));
        }
        Ok(self.state().delete_prefix(prefix, usize::MAX))
    }

    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        rdzv_core::kv::check_delete_piece(prefix, limit)?;
        Ok(self.state().delete_prefix(prefix, limit))
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        let ttl = ttl.max(MIN_LEASE_TTL);
        let id = self.state().lease_grant(ttl, Instant::now())?;
        self.ensure_reaper();
        // The new lease may be the next to expire.
        self.signal.notify.notify_one();
        Ok(id)
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        let ttl = self.state().lease_keep_alive(lease, Instant::now())?;
        self.ensure_reaper();
        Ok(ttl)
    }

    /// All under one lock, at one instant.
    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        let now = Instant::now();
        let answers = {
            let mut state = self.state();
            leases.iter().map(|&lease| state.lease_keep_alive(lease, now)).collect()
        };
        self.ensure_reaper();
        answers
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        self.state().lease_revoke(lease)
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        // A watcher waiting for an expiry needs a reaper in its runtime.
        self.ensure_reaper();
        let mut state = self.state();
        watch::open(&mut state, &self.shared, key, scope, start_revision)
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        self.state().compact(revision)
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        // The value is at most 20 digits: only the key can be too large.
        self.limits.check(key, b"")?;
        let mut state = self.state();
        let current = match state.get(key) {
            None => 0,
            Some(kv) => {
                std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse::<i64>().ok()).ok_or_else(|| {
                    KvError::InvalidArgument(format!(
                        "cannot increment `{}`: its value is not a decimal integer",
                        rdzv_core::kv::show_key(key)
                    ))
                })?
            }
        };
        let next = current.checked_add(delta).ok_or_else(|| {
            KvError::InvalidArgument(format!(
                "incrementing `{}` ({current}) by {delta} overflows a 64-bit integer",
                rdzv_core::kv::show_key(key)
            ))
        })?;
        state.put(key, next.to_string().as_bytes(), PutOptions::OVERWRITE)?;
        Ok(Some(next))
    }
}
