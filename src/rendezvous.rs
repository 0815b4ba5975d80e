//! [`Rendezvous`]: the handler of `rdzv-core` plus the round's Store and bootstrap info.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rdzv_core::{
    Kv, Participant, RendezvousError, RendezvousHandler, RendezvousInfo, RendezvousParams, RoundBroken,
    RunOutcome, Waiting,
};
use rdzv_store::Store;

use crate::bootstrap::{self, Bootstrap};

/// The least time rank 0 gives the publication of the bootstrap keys before it carries on
/// and keeps trying in the background, even when the call's deadline is nearly spent.
const MIN_BOOTSTRAP_TIME: Duration = Duration::from_secs(1);

/// A worker's handle on a run: forms rounds with the other workers
/// ([`next_rendezvous`](Rendezvous::next_rendezvous), which also hands out the round's Store
/// and bootstrap info), tells when a round breaks, and leaves when shut down or dropped.
///
/// Cheap to clone (all clones are the same worker). Dropping the last clone leaves like
/// [`shutdown`](Rendezvous::shutdown), in the background. What is not offered here (the
/// backend, the key layout) is on the underlying [`handler`](Rendezvous::handler).
#[derive(Clone, Debug)]
pub struct Rendezvous {
    handler: RendezvousHandler,
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
    /// lease, so an unreachable backend fails here with [`RendezvousError::Unavailable`].
    pub async fn new(kv: Arc<dyn Kv>, params: RendezvousParams) -> Result<Rendezvous, RendezvousError> {
        Ok(Rendezvous { handler: RendezvousHandler::new(kv, params).await? })
    }

    /// Wraps an existing handler.
    pub fn from_handler(handler: RendezvousHandler) -> Rendezvous {
        Rendezvous { handler }
    }

    /// The underlying handler, for what this type does not offer (the backend, the key
    /// layout, the bare [`RendezvousHandler::next_rendezvous`] without Store or bootstrap).
    pub fn handler(&self) -> &RendezvousHandler {
        &self.handler
    }

    /// Blocks until a round completes with this worker in it, and hands out the round's
    /// Store and bootstrap info (rank 0 also publishes `MASTER_ADDR`/`MASTER_PORT` in it).
    ///
    /// If this worker is a member of a running round, it first leaves it (the others learn
    /// at once). Backend errors are retried until the deadline (the `timeout` parameter).
    /// Fails with [`RendezvousError::Closed`] if the run is or becomes closed,
    /// [`RendezvousError::Timeout`] if no round completes in time,
    /// [`RendezvousError::Shutdown`] if [`shutdown`](Self::shutdown) is called meanwhile,
    /// [`RendezvousError::State`] on a corrupt value. A failed or cancelled call withdraws
    /// what it wrote, so it leaves no ghost behind (see
    /// [`RendezvousHandler::next_rendezvous`]).
    pub async fn next_rendezvous(&self) -> Result<Round, RendezvousError> {
        let deadline = Instant::now() + self.handler.params().timeout;
        let info = self.handler.next_rendezvous().await?;
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
        Ok(Round { info, store: store.with_timeout(rdzv_store::DEFAULT_TIMEOUT), bootstrap })
    }

    /// Resolves when the round this worker belongs to is over, with the reason: a member is
    /// gone, the round was ended, the run was closed, or this worker's lease was lost.
    /// Resolves at once with [`RoundBroken::NoRound`] if it is in no round, and with
    /// [`RoundBroken::Left`] if it leaves meanwhile.
    pub async fn round_broken(&self) -> RoundBroken {
        self.handler.round_broken().await
    }

    /// How many waiting workers the next round could admit while the current one runs (0
    /// when no round is running, and 0 when it is full and intact: the workers beyond
    /// `max_workers` are spares). An agent re-enters when this is above 0, to admit them. See
    /// [`RendezvousHandler::num_nodes_waiting`].
    pub async fn num_nodes_waiting(&self) -> Result<usize, RendezvousError> {
        self.handler.num_nodes_waiting().await
    }

    /// The workers waiting for the next round, in the order it would take them, and how many
    /// of them it could admit (the rest are spares). See [`RendezvousHandler::waiting`].
    pub async fn waiting(&self) -> Result<Waiting, RendezvousError> {
        self.handler.waiting().await
    }

    /// Whether the run is closed.
    pub async fn is_closed(&self) -> Result<bool, RendezvousError> {
        self.handler.is_closed().await
    }

    /// Closes the run for every worker: every current and future
    /// [`next_rendezvous`](Self::next_rendezvous) of it fails with
    /// [`RendezvousError::Closed`].
    pub async fn set_closed(&self) -> Result<(), RendezvousError> {
        self.handler.set_closed().await
    }

    /// Closes the run saying how the job ended (see [`RendezvousHandler::set_closed_with`]):
    /// spares and late arrivals of a job that succeeded end cleanly.
    pub async fn set_closed_with(&self, outcome: RunOutcome) -> Result<(), RendezvousError> {
        self.handler.set_closed_with(outcome).await
    }

    /// Leaves: revokes this worker's session lease, so its keys vanish at once and the other
    /// members see it gone. Does **not** close the run. A pending
    /// [`next_rendezvous`](Self::next_rendezvous) ends at once with
    /// [`RendezvousError::Shutdown`], and so do later calls.
    pub async fn shutdown(&self) -> Result<(), RendezvousError> {
        self.handler.shutdown().await
    }

    /// Publishes `value` under `key` for round `version` of the run; readable by any worker
    /// with [`load_extra_data`](Self::load_extra_data). Lives as long as the run.
    pub async fn store_extra_data(
        &self,
        version: u64,
        key: &str,
        value: &[u8],
    ) -> Result<(), RendezvousError> {
        self.handler.store_extra_data(version, key, value).await
    }

    /// Reads the extra data `key` of round `version`, waiting until it is published or
    /// `timeout` passes ([`RendezvousError::Timeout`]).
    pub async fn load_extra_data(
        &self,
        version: u64,
        key: &str,
        timeout: Duration,
    ) -> Result<Vec<u8>, RendezvousError> {
        self.handler.load_extra_data(version, key, timeout).await
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        self.handler.run_id()
    }

    /// This worker's descriptor (node id, address, pid).
    pub fn participant(&self) -> &Participant {
        self.handler.participant()
    }

    /// The parameters this worker was started with.
    pub fn params(&self) -> &RendezvousParams {
        self.handler.params()
    }

    /// The backend's name (`"etcd"`, `"redis"`, `"mem"`, …).
    pub fn backend_name(&self) -> &'static str {
        self.handler.backend_name()
    }
}
