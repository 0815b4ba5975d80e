//! [`Rendezvous`]: the handler of `rdzv-core` plus the round's Store and bootstrap info.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use rdzv_core::events::{Event, EventKind};
use rdzv_core::protocol::RunKeys;
use rdzv_core::{
    Exclusion, Kv, Participant, RendezvousError, RendezvousHandler, RendezvousInfo, RendezvousParams,
    RoundBroken, RunOutcome, Waiting,
};
use rdzv_store::Store;

use crate::bootstrap::{self, Bootstrap};
use crate::health::{Gate, MemberWatch};

/// The least time rank 0 gives the publication of the bootstrap keys before it carries on
/// and keeps trying in the background, even when the call's deadline is nearly spent.
const MIN_BOOTSTRAP_TIME: Duration = Duration::from_secs(1);

/// A worker's handle on a run: forms rounds with the other workers
/// ([`next_rendezvous`](Rendezvous::next_rendezvous), which also hands out the round's Store
/// and bootstrap info), tells when a round breaks, and leaves when shut down or dropped.
///
/// Its other calls ([`round_broken`](Rendezvous::round_broken),
/// [`num_nodes_waiting`](Rendezvous::num_nodes_waiting), [`set_closed`](Rendezvous::set_closed),
/// [`shutdown`](Rendezvous::shutdown), …) are its [`RendezvousHandler`]'s, which
/// [`handler`](Rendezvous::handler) gives for code that drives the protocol itself (its
/// `next_rendezvous` returns the bare [`RendezvousInfo`]).
///
/// With a health gate (the `health_check` option, [`RendezvousParams::health`]): each
/// `next_rendezvous` joins only once the node's checks pass (until then the node stays out,
/// excluded, checking again every interval), withdraws if a check fails while it waits, and
/// while the round runs a check runs every interval; after `health_check_failures` failures
/// in a row the worker leaves the round ([`RoundBroken::Unhealthy`]) and is excluded, and the
/// others re-form at once (docs/PROTOCOL.md "Health gates").
///
/// Cheap to clone (all clones are the same worker). Dropping the last clone leaves like
/// [`shutdown`](RendezvousHandler::shutdown), in the background.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    handler: RendezvousHandler,
    gate: Option<Arc<Gate>>,
    /// The watch over this worker's health while it is a member (with a gate).
    watch: Arc<Mutex<Option<MemberWatch>>>,
}

/// This worker's place in a completed round, with what it needs to work in it.
#[derive(Clone, Debug)]
pub struct Round {
    /// Who is in the round and where this worker stands: `info.rank`, `info.world_size`,
    /// `info.participants`, `info.version`, how long the phases took (`info.timings`).
    pub info: RendezvousInfo,
    /// The round's private Store (keys under `info.store_prefix`, `…/v_<N>/kv/`), bound to
    /// the run lease.
    pub store: Store,
    /// Rank 0's address and a free port, for the training processes' collectives.
    pub bootstrap: Bootstrap,
}

impl Rendezvous {
    /// A worker of `params.run_id` on an already-built backend. Starts this worker's session
    /// lease, so an unreachable backend fails here with [`RendezvousError::Unavailable`]; a
    /// health check that names an unknown built-in fails with [`RendezvousError::Config`].
    ///
    /// A `segment` of `auto` is this node's NVLink domain ([`crate::segment::nvlink_domain`]);
    /// a node without one fails here with [`RendezvousError::Config`].
    pub async fn new(kv: Arc<dyn Kv>, mut params: RendezvousParams) -> Result<Rendezvous, RendezvousError> {
        if params.segment.as_deref() == Some(crate::segment::AUTO) {
            params.segment = Some(crate::segment::nvlink_domain().await?);
        }
        let health = params.health.clone();
        let handler = RendezvousHandler::new(kv, params).await?;
        let gate = health.map(|health| Gate::new(&handler, &health)).transpose()?.map(Arc::new);
        Ok(Rendezvous { handler, gate, watch: Arc::default() })
    }

    /// Blocks until a round completes with this worker in it, and hands out the round's
    /// Store and bootstrap info (rank 0 also publishes `MASTER_ADDR`/`MASTER_PORT` in it).
    ///
    /// If this worker is a member of a running round, it first leaves it (the others learn
    /// at once). Backend errors are retried until the deadline (the `timeout` parameter).
    /// Fails with [`RendezvousError::Closed`] if the run is or becomes closed,
    /// [`RendezvousError::Timeout`] if no round completes in time,
    /// [`RendezvousError::Shutdown`] if [`shutdown`](RendezvousHandler::shutdown) is called
    /// meanwhile, [`RendezvousError::State`] on a corrupt value. A failed or cancelled call withdraws
    /// what it wrote, so it leaves no ghost behind (see
    /// [`RendezvousHandler::next_rendezvous`]).
    ///
    /// With a health gate, the call first waits until this node's checks pass, however long
    /// that takes (the deadline runs from the join that follows); a check that cannot run at
    /// all the first time (the shell's "not found") fails it with [`RendezvousError::Config`].
    pub async fn next_rendezvous(&self) -> Result<Round, RendezvousError> {
        self.stop_watch();
        let (info, started) = match &self.gate {
            // Boxed: running the checks takes about 5 KiB of state, which every call would
            // otherwise carry, gate or not (98,304 calls at once in a large round).
            Some(gate) => Box::pin(gate.join(&self.handler)).await?,
            None => (self.handler.next_rendezvous().await?, Instant::now()),
        };
        let deadline = started + self.handler.params().timeout;
        // Rank 0's address and port come with the participant list; only rank 0 writes them
        // to the Store, so no member waits on another here. (Racing this against
        // `round_broken` once let rank 0 abandon a complete round its peers had already
        // finished and left.) What is left of the call's deadline bounds it: the round is
        // complete, so nothing here may fail the call and make the caller destroy it.
        let left = deadline.saturating_duration_since(Instant::now()).max(MIN_BOOTSTRAP_TIME);
        let store = Store::new(self.handler.backend(), info.store_prefix.clone())
            .with_timeout(left)
            .with_lease(info.run_lease);
        let bootstrap = bootstrap::exchange(&info, &store, &self.handler).await?;
        if let Some(gate) = &self.gate {
            let watch = gate.watch_member(self.handler.clone(), info.version);
            *self.watch.lock().unwrap_or_else(|p| p.into_inner()) = Some(watch);
        }
        Ok(Round { info, store: store.with_timeout(rdzv_store::DEFAULT_TIMEOUT), bootstrap })
    }

    /// Stops watching this worker's health as a member (it leaves, or re-enters).
    fn stop_watch(&self) {
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// The worker's other calls: each is its [`RendezvousHandler`]'s, documented there in full.
impl Rendezvous {
    /// The worker's core handler: for code that drives the protocol without the Store and
    /// bootstrap of a [`Round`] (its `next_rendezvous` returns the bare [`RendezvousInfo`]).
    pub fn handler(&self) -> &RendezvousHandler {
        &self.handler
    }

    /// Resolves when this worker's round is over, with the reason
    /// ([`RendezvousHandler::round_broken`]).
    pub async fn round_broken(&self) -> RoundBroken {
        self.handler.round_broken().await
    }

    /// How many waiting workers the next round could admit while the current one runs: 0 for
    /// a full, intact round, whose spares only a member's departure admits
    /// ([`RendezvousHandler::num_nodes_waiting`]).
    pub async fn num_nodes_waiting(&self) -> Result<usize, RendezvousError> {
        self.handler.num_nodes_waiting().await
    }

    /// The nodes that their health check keeps out of the run, by node id
    /// ([`RendezvousHandler::exclusions`]).
    pub async fn exclusions(&self) -> Result<Vec<Exclusion>, RendezvousError> {
        self.handler.exclusions().await
    }

    /// The workers waiting for the next round, in the order it would take them
    /// ([`RendezvousHandler::waiting`]).
    pub async fn waiting(&self) -> Result<Waiting, RendezvousError> {
        self.handler.waiting().await
    }

    /// Whether the run is closed ([`RendezvousHandler::is_closed`]).
    pub async fn is_closed(&self) -> Result<bool, RendezvousError> {
        self.handler.is_closed().await
    }

    /// How the job ended, as the run's close says ([`RendezvousHandler::run_outcome`]).
    pub async fn run_outcome(&self) -> Result<Option<RunOutcome>, RendezvousError> {
        self.handler.run_outcome().await
    }

    /// Closes the run for every worker ([`RendezvousHandler::set_closed`]).
    pub async fn set_closed(&self) -> Result<(), RendezvousError> {
        self.handler.set_closed().await
    }

    /// Closes the run, saying how the job ended ([`RendezvousHandler::set_closed_with`]).
    pub async fn set_closed_with(&self, outcome: RunOutcome) -> Result<(), RendezvousError> {
        self.handler.set_closed_with(outcome).await
    }

    /// Leaves: this worker's keys vanish at once; does not close the run
    /// ([`RendezvousHandler::shutdown`]).
    pub async fn shutdown(&self) -> Result<(), RendezvousError> {
        self.stop_watch();
        self.handler.shutdown().await
    }

    /// Publishes `value` for round `version` ([`RendezvousHandler::store_extra_data`]).
    pub async fn store_extra_data(
        &self,
        version: u64,
        key: &str,
        value: &[u8],
    ) -> Result<(), RendezvousError> {
        self.handler.store_extra_data(version, key, value).await
    }

    /// Reads extra data of round `version`, waiting for it up to `timeout`
    /// ([`RendezvousHandler::load_extra_data`]).
    pub async fn load_extra_data(
        &self,
        version: u64,
        key: &str,
        timeout: Duration,
    ) -> Result<Vec<u8>, RendezvousError> {
        self.handler.load_extra_data(version, key, timeout).await
    }

    /// Calls `subscriber` with each event of this worker from now on
    /// ([`RendezvousHandler::on_event`]: it must return at once).
    pub fn on_event(&self, subscriber: impl Fn(&Event) + Send + Sync + 'static) {
        self.handler.on_event(subscriber);
    }

    /// Reports `kind` as an event of this worker ([`RendezvousHandler::emit`]).
    pub fn emit(&self, kind: EventKind) {
        self.handler.emit(kind);
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        self.handler.run_id()
    }

    /// This worker's descriptor (node id, address, pid).
    pub fn participant(&self) -> &Participant {
        self.handler.participant()
    }

    /// The parameters.
    pub fn params(&self) -> &RendezvousParams {
        self.handler.params()
    }

    /// The backend's name (`"etcd"`, `"redis"`, `"mem"`, …).
    pub fn backend_name(&self) -> &'static str {
        self.handler.backend_name()
    }

    /// The backend.
    pub fn backend(&self) -> Arc<dyn Kv> {
        self.handler.backend()
    }

    /// The key layout of this run.
    pub fn keys(&self) -> &RunKeys {
        self.handler.keys()
    }
}
