//! [`FaultyKv`]: a fault-injection wrapper around any backend, for testing how callers cope
//! with a slow or failing store. Faults are switched on and off at run time through the
//! shared handle; random choices come from a seeded RNG, so a run is reproducible as long as
//! the calls arrive in the same order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Layer;
use crate::error::KvError;
use crate::kv::{
    CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, Event, GetResponse, Kv, KvResult,
    LeaseId, PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};

/// Latency added before each call reaches the wrapped backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Latency {
    /// No added latency.
    #[default]
    None,
    /// Exactly this long.
    Fixed(Duration),
    /// Uniformly random between `min` and `max` inclusive, from the seeded RNG.
    Uniform {
        /// Shortest delay.
        min: Duration,
        /// Longest delay.
        max: Duration,
    },
}

#[derive(Debug)]
struct Config {
    latency: Latency,
    /// The absolute call number (1-based) that fails.
    fail_at: Option<u64>,
    /// The operation whose next call fails.
    fail_op: Option<&'static str>,
    /// The operation whose next call never answers.
    hang_op: Option<&'static str>,
    fail_probability: f64,
    drop_watch_after: Option<usize>,
    fail_after_applying: bool,
    rng: SmallRng,
}

/// Wraps any backend and injects faults: added latency, [`KvError::Unavailable`] on the n-th
/// call or with a probability, and watch streams that end with `Unavailable` (a "dropped
/// connection") after k events or on demand.
///
/// Every method of [`Kv`] except `name` and `capabilities` counts as one call (a batch of
/// [`Kv::lease_keep_alive_many`] too: it reaches the wrapped backend's batch, and an injected
/// failure fails every lease of it, as an unreachable server does). A failed call
/// does not reach the wrapped backend, unless [`FaultyKv::set_fail_after_applying`] makes
/// it take effect and lose only its answer. Faults apply from the moment they are set; all
/// of them are off initially and after [`FaultyKv::clear`].
#[derive(Debug)]
pub struct FaultyKv {
    inner: Arc<dyn Kv>,
    config: Mutex<Config>,
    calls: AtomicU64,
    /// Bumped by [`FaultyKv::drop_open_watches`]; every open watch ends when it changes.
    cut: tokio::sync::watch::Sender<u64>,
}

impl FaultyKv {
    /// Wraps `inner`, with no fault switched on; `seed` fixes every random choice.
    pub fn new(inner: Arc<dyn Kv>, seed: u64) -> Arc<FaultyKv> {
        Arc::new(FaultyKv {
            inner,
            config: Mutex::new(Config {
                latency: Latency::None,
                fail_at: None,
                fail_op: None,
                hang_op: None,
                fail_probability: 0.0,
                drop_watch_after: None,
                fail_after_applying: false,
                rng: SmallRng::seed_from_u64(seed),
            }),
            calls: AtomicU64::new(0),
            cut: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Kv> {
        &self.inner
    }

    /// How many calls were made so far (failed ones included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Adds `latency` to every call from now on.
    pub fn set_latency(&self, latency: Latency) {
        self.config().latency = latency;
    }

    /// Makes the `n`-th call from now fail with `Unavailable` (1: the very next call; 0:
    /// cancel). Once only.
    pub fn fail_nth_call(&self, n: u64) {
        self.config().fail_at = (n > 0).then(|| self.calls() + n);
    }

    /// Makes the next call of `operation` fail with `Unavailable`, once. Operations are named
    /// after the [`Kv`] methods: `"get"`, `"range"`, `"put"`, `"delete"`, `"delete_prefix"`
    /// (which [`Kv::delete_prefix_limited`] counts as too), `"lease_grant"`, `"lease_keep_alive"`, `"lease_keep_alive_many"`, `"lease_revoke"`,
    /// `"watch"`, `"compact"`, `"count_at_revision"`, `"create_counted"`, `"increment"`; any other name never
    /// matches.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rdzv_core::Kv;
    /// # use rdzv_core::kv::PutOptions;
    /// # use rdzv_core::layer::FaultyKv;
    /// # async fn demo(backend: Arc<dyn Kv>) -> Result<(), rdzv_core::KvError> {
    /// let faulty = FaultyKv::new(backend, 1);
    /// faulty.fail_next("delete_prefix");
    /// faulty.put(b"a/1", b"x", PutOptions::OVERWRITE).await?;
    /// assert!(faulty.delete_prefix(b"a/").await.is_err());
    /// assert_eq!(faulty.delete_prefix(b"a/").await?.deleted, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fail_next(&self, operation: &'static str) {
        self.config().fail_op = Some(operation);
    }

    /// Makes the next call of `operation` (named as for [`fail_next`](Self::fail_next)) never
    /// answer, once: a request stuck on a connection that went silent, which its caller
    /// waits for until it gives up. It does not reach the wrapped backend; [`clear`](Self::clear)
    /// cancels a hang not yet taken, not one under way.
    pub fn hang_next(&self, operation: &'static str) {
        self.config().hang_op = Some(operation);
    }

    /// Makes every call fail with `Unavailable` with probability `p` (clamped to 0..=1).
    pub fn set_failure_probability(&self, p: f64) {
        self.config().fail_probability = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    }

    /// Watches opened from now on end with `Unavailable` after delivering `k` events
    /// (`None`: never).
    pub fn drop_watches_after(&self, k: Option<usize>) {
        self.config().drop_watch_after = k;
    }

    /// Ends every watch open now with `Unavailable`, as if the connection had dropped.
    pub fn drop_open_watches(&self) {
        self.cut.send_modify(|generation| *generation += 1);
    }

    /// Whether an injected failure happens after the call reached the backend (`true`: the
    /// operation takes effect but its answer is lost, as when a connection drops after the
    /// request was sent) or before (`false`, the default: nothing happens).
    pub fn set_fail_after_applying(&self, after: bool) {
        self.config().fail_after_applying = after;
    }

    /// Switches every fault off (the RNG keeps its state).
    pub fn clear(&self) {
        let mut config = self.config();
        config.latency = Latency::None;
        config.fail_at = None;
        config.fail_op = None;
        config.hang_op = None;
        config.fail_probability = 0.0;
        config.drop_watch_after = None;
        config.fail_after_applying = false;
    }

    fn config(&self) -> MutexGuard<'_, Config> {
        self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs one call of `operation` with the configured latency and failure.
    async fn call<T>(&self, operation: &str, call: impl Future<Output = KvResult<T>>) -> KvResult<T> {
        let (delay, fail, number, after, hang) = {
            let mut config = self.config();
            let number = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let hang = config.hang_op == Some(operation);
            if hang {
                config.hang_op = None;
            }
            let mut fail = config.fail_at == Some(number);
            if fail {
                config.fail_at = None;
            }
            if config.fail_op == Some(operation) {
                config.fail_op = None;
                fail = true;
            }
            if config.fail_probability > 0.0 {
                let p = config.fail_probability;
                fail |= config.rng.random_bool(p);
            }
            let delay = match config.latency {
                Latency::None => Duration::ZERO,
                Latency::Fixed(d) => d,
                Latency::Uniform { min, max } => {
                    let (lo, hi) = (min.min(max), min.max(max));
                    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                    Duration::from_nanos(config.rng.random_range(nanos(lo)..=nanos(hi)))
                }
            };
            (delay, fail, number, config.fail_after_applying, hang)
        };
        if hang {
            return std::future::pending().await;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if !fail {
            return call.await;
        }
        let when = if after {
            // The operation happens; only its answer is lost.
            let _ = call.await;
            "after reaching the backend"
        } else {
            "before reaching the backend"
        };
        Err(self.unavailable(format!("injected failure of call #{number} ({operation}) {when}")))
    }

    fn unavailable(&self, message: String) -> KvError {
        KvError::Unavailable {
            backend: self.inner.name(),
            endpoint: "fault-injection".into(),
            message,
            source: None,
        }
    }
}

/// The state of one wrapped watch stream.
struct Dropping {
    inner: WatchStream,
    left: Option<usize>,
    cut: Option<tokio::sync::watch::Receiver<u64>>,
    error: Option<KvError>,
}

#[async_trait]
impl Layer for FaultyKv {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        self.call("get", self.inner.get(key)).await
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        self.call("range", self.inner.range(prefix, options)).await
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        self.call("put", self.inner.put(key, value, options)).await
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        self.call("delete", self.inner.delete(key, mode)).await
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        self.call("delete_prefix", self.inner.delete_prefix(prefix)).await
    }

    /// Faulted as a `"delete_prefix"`.
    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        self.call("delete_prefix", self.inner.delete_prefix_limited(prefix, limit)).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        self.call("lease_grant", self.inner.lease_grant(ttl)).await
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        self.call("lease_keep_alive", self.inner.lease_keep_alive(lease)).await
    }

    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        let batch = async { Ok(self.inner.lease_keep_alive_many(leases).await) };
        match self.call("lease_keep_alive_many", batch).await {
            Ok(answers) => answers,
            Err(e) => leases.iter().map(|_| Err(e.duplicate())).collect(),
        }
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        self.call("lease_revoke", self.inner.lease_revoke(lease)).await
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        let mut cut = self.cut.subscribe();
        cut.mark_unchanged();
        let state = Dropping {
            inner: self.call("watch", self.inner.watch(key, scope, start_revision)).await?,
            left: self.config().drop_watch_after,
            cut: Some(cut),
            error: Some(self.unavailable("injected drop of the watch connection".into())),
        };
        Ok(Box::pin(futures::stream::unfold(state, next_event)))
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        self.call("compact", self.inner.compact(revision)).await
    }

    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        self.call("count_at_revision", self.inner.count_at_revision(prefix, revision)).await
    }

    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        self.call("create_counted", self.inner.create_counted(key, value, lease, tally, tally_lease)).await
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        self.call("increment", self.inner.increment(key, delta)).await
    }
}

/// The next item of a wrapped watch: the inner stream's, until the event budget is spent
/// or the connection is cut; then one `Unavailable` error, then the end.
async fn next_event(mut s: Dropping) -> Option<(KvResult<Event>, Dropping)> {
    let error = s.error.take()?;
    if s.left == Some(0) {
        return Some((Err(error), s));
    }
    let item = loop {
        let Some(cut) = s.cut.as_mut() else {
            break s.inner.next().await;
        };
        tokio::select! {
            changed = cut.changed() => match changed {
                Ok(()) => return Some((Err(error), s)),
                // The FaultyKv is gone: nobody can cut this stream any more.
                Err(_) => s.cut = None,
            },
            item = s.inner.next() => break item,
        }
    };
    let item = item?;
    s.error = Some(error);
    if let Some(left) = s.left.as_mut() {
        *left -= 1;
    }
    Some((item, s))
}
