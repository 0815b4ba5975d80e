//! [`Rendezvous`]: the handler of `rdzv-core` plus the round's Store and bootstrap info.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rdzv_core::{Kv, RendezvousError, RendezvousHandler, RendezvousInfo, RendezvousParams};
use rdzv_store::Store;

use crate::bootstrap::{self, Bootstrap};

/// The least time rank 0 gives the publication of the bootstrap keys before it carries on
/// and keeps trying in the background, even when the call's deadline is nearly spent.
const MIN_BOOTSTRAP_TIME: Duration = Duration::from_secs(1);

/// A worker's handle on a run: forms rounds with the other workers
/// ([`next_rendezvous`](Rendezvous::next_rendezvous), which also hands out the round's Store
/// and bootstrap info), tells when a round breaks, and leaves when shut down or dropped.
///
/// It dereferences to its [`RendezvousHandler`], whose methods it has as its own
/// ([`round_broken`](RendezvousHandler::round_broken),
/// [`num_nodes_waiting`](RendezvousHandler::num_nodes_waiting),
/// [`set_closed`](RendezvousHandler::set_closed), [`shutdown`](RendezvousHandler::shutdown),
/// …); only `next_rendezvous` is its own, returning the whole [`Round`] where the handler's
/// returns the bare [`RendezvousInfo`].
///
/// Cheap to clone (all clones are the same worker). Dropping the last clone leaves like
/// [`shutdown`](RendezvousHandler::shutdown), in the background.
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
}

/// A `Rendezvous` *is* its worker's [`RendezvousHandler`] (plus the Store and bootstrap that
/// [`next_rendezvous`](Rendezvous::next_rendezvous) adds): every other method —
/// `round_broken`, `num_nodes_waiting`, `waiting`, `set_closed`, `shutdown`, `run_id`,
/// `backend`, `keys`, … — is the handler's, documented there.
impl Deref for Rendezvous {
    type Target = RendezvousHandler;

    fn deref(&self) -> &RendezvousHandler {
        &self.handler
    }
}
