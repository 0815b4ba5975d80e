//! [`FaultyKv`]: a fault-injection wrapper around any backend, for testing how callers cope
//! with a slow or failing store. Faults are switched on and off at run time through the
//! shared handle; random choices come from a seeded RNG, so a run is reproducible as long as
//! the calls arrive in the same order.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{Answer, Decorator, Request};
use crate::error::KvError;
use crate::kv::{Event, Kv, KvResult, Op, WatchStream};

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
    fail_op: Option<Op>,
    /// The operation whose next call never answers.
    hang_op: Option<Op>,
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

    /// Makes the next call of `operation` fail with `Unavailable`, once.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rdzv_core::Kv;
    /// # use rdzv_core::kv::{Op, PutOptions};
    /// # use rdzv_core::layer::FaultyKv;
    /// # async fn demo(backend: Arc<dyn Kv>) -> Result<(), rdzv_core::KvError> {
    /// let faulty = FaultyKv::new(backend, 1);
    /// faulty.fail_next(Op::DeletePrefix);
    /// faulty.put(b"a/1", b"x", PutOptions::OVERWRITE).await?;
    /// assert!(faulty.delete_prefix(b"a/").await.is_err());
    /// assert_eq!(faulty.delete_prefix(b"a/").await?.deleted, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fail_next(&self, operation: Op) {
        self.config().fail_op = Some(operation);
    }

    /// Makes the next call of `operation` never answer, once: a request stuck on a
    /// connection that went silent, which its caller waits for until it gives up. It does not
    /// reach the wrapped backend; [`clear`](Self::clear) cancels a hang not yet taken, not one
    /// under way.
    pub fn hang_next(&self, operation: Op) {
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
    async fn call<T>(&self, operation: Op, call: impl Future<Output = KvResult<T>>) -> KvResult<T> {
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

impl Decorator for FaultyKv {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn around<T: Answer>(
        &self,
        request: Request,
        call: impl Future<Output = KvResult<T>> + Send,
    ) -> KvResult<T> {
        self.call(request.op, call).await
    }

    /// Cut after the configured number of events, or when [`drop_open_watches`](Self::drop_open_watches)
    /// is called.
    fn events(&self, stream: WatchStream) -> WatchStream {
        let mut cut = self.cut.subscribe();
        cut.mark_unchanged();
        let state = Dropping {
            inner: stream,
            left: self.config().drop_watch_after,
            cut: Some(cut),
            error: Some(self.unavailable("injected drop of the watch connection".into())),
        };
        Box::pin(futures::stream::unfold(state, next_event))
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
