//! The rendezvous handler (docs/PROTOCOL.md): what a worker holds to take part in a run.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{KvError, RendezvousError};
use crate::ext::KvExt;
use crate::kv::{DeleteMode, Kv, PutMode};
use crate::params::RendezvousParams;
use crate::session::Session;

use super::keys::RunKeys;
use super::monitor::{Monitor, RoundBroken, RoundStatus, Watched};
use super::round::{Attempt, Completed, Context, RoundTimings};
use super::run_lease::{RunLease, cas_with_run_lease, put_with_run_lease};
use super::state::{Participant, State};

type Result<T> = std::result::Result<T, RendezvousError>;

/// The outcome of [`RendezvousHandler::next_rendezvous`]: this worker's place in a completed
/// round. Every member of the round holds the same `version`, `world_size` and
/// `participants`; ranks are `0..world_size`, each held by exactly one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousInfo {
    /// The run.
    pub run_id: String,
    /// The round's number; only grows for one worker.
    pub version: u64,
    /// This worker's rank: its index in `participants`.
    pub rank: usize,
    /// The number of members.
    pub world_size: usize,
    /// The members in rank order.
    pub participants: Vec<Participant>,
    /// The key prefix of the round's Store (`…/rdzv/v_<N>/kv/`).
    pub store_prefix: Vec<u8>,
    /// How long the phases took.
    pub timings: RoundTimings,
}

/// One worker's handle on a run: forms rounds with the other workers, tells when a round
/// breaks, and leaves when shut down or dropped.
///
/// Cheap to clone (all clones are the same worker). Calls of `next_rendezvous` on one
/// worker are serialized. Dropping the last clone leaves like [`shutdown`](Self::shutdown),
/// in the background.
#[derive(Clone, Debug)]
pub struct RendezvousHandler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ctx: Context,
    worker: tokio::sync::Mutex<Worker>,
    status: watch::Sender<RoundStatus>,
    shut_down: CancellationToken,
}

/// What one worker holds between calls.
#[derive(Debug, Default)]
struct Worker {
    session: Option<Session>,
    membership: Option<(Completed, Monitor)>,
}

impl RendezvousHandler {
    /// A handler for `params.run_id` on `kv`. Starts this worker's session lease, so an
    /// unreachable backend fails here with [`RendezvousError::Unavailable`].
    pub async fn new(kv: Arc<dyn Kv>, params: RendezvousParams) -> Result<Self> {
        params.validate()?;
        let keys = RunKeys::new(&params.prefix, &params.run_id);
        let node = params.node_id.clone().unwrap_or_else(default_node_id);
        let addr = params.local_addr.clone().unwrap_or_else(host_name);
        let me = Participant { node, addr, pid: std::process::id(), port: None };
        let run_lease = RunLease::new(kv.clone(), &keys, params.run_ttl);
        let session = Session::start(kv.clone(), params.keep_alive_ttl).await?;
        let ctx = Context { kv, params, keys, me, run_lease };
        let worker = Worker { session: Some(session), membership: None };
        Ok(RendezvousHandler {
            inner: Arc::new(Inner {
                ctx,
                worker: tokio::sync::Mutex::new(worker),
                status: watch::Sender::new(RoundStatus::default()),
                shut_down: CancellationToken::new(),
            }),
        })
    }

    /// Blocks until a round completes with this worker in it, and returns its place in it.
    ///
    /// If this worker is a member of a running round, it first leaves it (the others learn
    /// at once). Fails with [`RendezvousError::Closed`] if the run is or becomes closed,
    /// [`RendezvousError::Timeout`] if no round completes within the `timeout` parameter,
    /// [`RendezvousError::LeaseLost`] if this worker's session lease is lost meanwhile (the
    /// next call starts a new session), [`RendezvousError::State`] on a corrupt value.
    pub async fn next_rendezvous(&self) -> Result<RendezvousInfo> {
        let inner = &*self.inner;
        let ctx = &inner.ctx;
        let mut worker = inner.worker.lock().await;
        if inner.shut_down.is_cancelled() {
            return Err(RendezvousError::Shutdown);
        }
        let deadline = Instant::now() + ctx.params.timeout;
        // Leave the running round, unless its monitor already saw it end (then there is
        // nothing to end, and a swap would only be a wasted write).
        let ended = matches!(inner.status.borrow().broken, Some(RoundBroken::Ended | RoundBroken::Closed));
        let previous = worker.membership.take().and_then(|(round, monitor)| {
            drop(monitor);
            self.publish(None, Some(RoundBroken::Left));
            (!ended).then_some(round)
        });
        if worker.session.as_ref().is_none_or(Session::is_lost) {
            worker.session = None;
            worker.session = Some(Session::start(ctx.kv.clone(), ctx.params.keep_alive_ttl).await?);
        }
        let Some(session) = worker.session.as_ref() else { return Err(RendezvousError::LeaseLost) };
        let lost = session.lost();
        let mut attempt = Attempt::new(ctx, session.lease());
        let outcome = tokio::select! {
            r = tokio::time::timeout_at(deadline, attempt.run(previous.as_ref())) => Some(r),
            _ = lost.cancelled() => None,
        };
        let result = match outcome {
            Some(Ok(result)) => result,
            Some(Err(_elapsed)) => Err(RendezvousError::Timeout {
                run_id: ctx.params.run_id.clone(),
                phase: attempt.phase.to_string(),
                after: ctx.params.timeout,
            }),
            None => Err(RendezvousError::LeaseLost),
        };
        let round = match result {
            Ok(round) => round,
            Err(e) => {
                if let Some(key) = attempt.pending_join.take() {
                    // Withdraw, so that this worker is not frozen into a round as a ghost.
                    let cleanup = ctx.kv.delete(&key, DeleteMode::Any);
                    let _ = tokio::time::timeout(Duration::from_millis(500), cleanup).await;
                }
                if matches!(e, RendezvousError::LeaseLost) {
                    worker.session = None;
                }
                return Err(e);
            }
        };
        let info = RendezvousInfo {
            run_id: ctx.params.run_id.clone(),
            version: round.version,
            rank: round.rank,
            world_size: round.participants.len(),
            participants: round.participants.clone(),
            store_prefix: ctx.keys.store(round.version),
            timings: round.timings,
        };
        if let Some(lease) = round.run_lease {
            ctx.run_lease.adopt(lease);
        }
        self.publish(Some(round.version), None);
        let watched = Watched {
            kv: ctx.kv.clone(),
            keys: ctx.keys.clone(),
            version: round.version,
            world_size: round.participants.len(),
            final_revision: round.final_revision,
        };
        let monitor = Monitor::spawn(watched, lost, inner.status.clone());
        worker.membership = Some((round, monitor));
        Ok(info)
    }

    /// Resolves when the round this worker belongs to is over, with the reason: a member is
    /// gone, the round was ended, the run was closed, or this worker's lease was lost.
    /// Resolves at once with [`RoundBroken::NoRound`] if it is in no round, and with
    /// [`RoundBroken::Left`] if it leaves meanwhile.
    pub async fn round_broken(&self) -> RoundBroken {
        let mut status = self.inner.status.subscribe();
        loop {
            {
                let now = status.borrow_and_update();
                if let Some(reason) = &now.broken {
                    return reason.clone();
                }
                if now.version.is_none() {
                    return RoundBroken::NoRound;
                }
            }
            if status.changed().await.is_err() {
                return RoundBroken::Left;
            }
        }
    }

    /// How many workers wait for the next round while the current one runs (0 when no
    /// round is running). An agent uses it to decide to re-rendezvous and admit them.
    pub async fn num_nodes_waiting(&self) -> Result<usize> {
        let ctx = &self.inner.ctx;
        match self.state().await? {
            Some(State::Final { version, .. }) => {
                Ok(ctx.kv.count(&ctx.keys.waiting(version), None).await? as usize)
            }
            _ => Ok(0),
        }
    }

    /// Whether the run is closed.
    pub async fn is_closed(&self) -> Result<bool> {
        Ok(matches!(self.state().await?, Some(State::Closed)))
    }

    /// Closes the run for every worker: every current and future `next_rendezvous` of it
    /// fails with [`RendezvousError::Closed`].
    pub async fn set_closed(&self) -> Result<()> {
        let ctx = &self.inner.ctx;
        let closed = State::Closed.to_bytes();
        cas_with_run_lease(&ctx.run_lease, &*ctx.kv, &ctx.keys.state(), |_| Some(closed.clone())).await?;
        tracing::info!(run_id = %ctx.params.run_id, "run closed");
        Ok(())
    }

    /// Leaves: revokes this worker's session lease, so its keys vanish at once and the other
    /// members see it gone. Does **not** close the run. Later calls fail with
    /// [`RendezvousError::Shutdown`].
    pub async fn shutdown(&self) -> Result<()> {
        let inner = &*self.inner;
        inner.shut_down.cancel();
        let mut worker = inner.worker.lock().await;
        if worker.membership.take().is_some() {
            self.publish(None, Some(RoundBroken::Left));
        }
        if let Some(session) = worker.session.take() {
            session.close().await?;
        }
        Ok(())
    }

    /// Publishes `value` for round `version` of the run; readable by
    /// [`load_extra_data`](Self::load_extra_data). Lives as long as the run.
    pub async fn store_extra_data(&self, version: u64, key: &str, value: &[u8]) -> Result<()> {
        let ctx = &self.inner.ctx;
        let k = ctx.keys.extra_data(version, key);
        put_with_run_lease(&ctx.run_lease, &*ctx.kv, &k, value, PutMode::Overwrite).await?;
        Ok(())
    }

    /// Reads extra data of round `version`, waiting until it is published or `timeout`
    /// passes ([`RendezvousError::Timeout`]).
    pub async fn load_extra_data(&self, version: u64, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let ctx = &self.inner.ctx;
        let k = ctx.keys.extra_data(version, key);
        match ctx.kv.wait_for_key(&k, Instant::now() + timeout).await {
            Ok(kv) => Ok(kv.value),
            Err(KvError::Timeout { .. }) => Err(RendezvousError::Timeout {
                run_id: ctx.params.run_id.clone(),
                phase: format!("waiting for extra data `{key}` of round {version}"),
                after: timeout,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.inner.ctx.params.run_id
    }

    /// This worker's descriptor (node id, address, pid).
    pub fn participant(&self) -> &Participant {
        &self.inner.ctx.me
    }

    /// The parameters.
    pub fn params(&self) -> &RendezvousParams {
        &self.inner.ctx.params
    }

    /// The backend's name (`"etcd"`, `"redis"`, `"mem"`, …).
    pub fn backend_name(&self) -> &'static str {
        self.inner.ctx.kv.name()
    }

    /// The backend, e.g. to open the round's Store on it.
    pub fn backend(&self) -> Arc<dyn Kv> {
        self.inner.ctx.kv.clone()
    }

    /// The key layout of this run.
    pub fn keys(&self) -> &RunKeys {
        &self.inner.ctx.keys
    }

    async fn state(&self) -> Result<Option<State>> {
        let ctx = &self.inner.ctx;
        let read = ctx.kv.get(&ctx.keys.state()).await?;
        read.kv.map(|kv| State::parse(&kv.key, &kv.value)).transpose()
    }

    fn publish(&self, version: Option<u64>, broken: Option<RoundBroken>) {
        self.inner.status.send_replace(RoundStatus { version, broken });
    }
}

/// `<host>-<pid>-<random>`: unique per process and handler.
fn default_node_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    format!("{}-{}-{:06x}", host_name(), std::process::id(), hasher.finish() & 0xff_ffff)
}

/// This machine's host name, or `localhost` if it cannot be found.
pub(crate) fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
