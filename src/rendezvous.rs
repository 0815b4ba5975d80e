//! [`Rendezvous`]: the handler of `rdzv-core` plus the round's Store and bootstrap info.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rdzv_core::{Kv, Participant, RendezvousError, RendezvousHandler, RendezvousParams, RoundTimings};
use rdzv_store::Store;

use crate::bootstrap::{self, Bootstrap};

/// The least time rank 0 gives the publication of the bootstrap keys before it carries on
/// and keeps trying in the background, even when the call's deadline is nearly spent.
const MIN_BOOTSTRAP_TIME: Duration = Duration::from_secs(1);

/// A worker's handle on a run (see [`RendezvousHandler`], whose methods it also offers:
/// `num_nodes_waiting`, `round_broken`, `set_closed`, `shutdown`, …); its
/// [`next_rendezvous`](Rendezvous::next_rendezvous) also hands out the round's Store and
/// bootstrap info. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    handler: RendezvousHandler,
}

/// This worker's place in a completed round.
#[derive(Clone, Debug)]
pub struct Round {
    /// The run.
    pub run_id: String,
    /// The round's number; only grows for one worker.
    pub version: u64,
    /// This worker's rank, `0..world_size`.
    pub rank: usize,
    /// The number of members.
    pub world_size: usize,
    /// The members in rank order.
    pub participants: Vec<Participant>,
    /// The round's private Store (keys under `…/v_<N>/kv/`).
    pub store: Store,
    /// Rank 0's address and a free port, for the training processes' collectives.
    pub bootstrap: Bootstrap,
    /// How long the phases took.
    pub timings: RoundTimings,
}

impl Rendezvous {
    /// A worker of `params.run_id` on an already-built backend.
    pub async fn new(kv: Arc<dyn Kv>, params: RendezvousParams) -> Result<Rendezvous, RendezvousError> {
        Ok(Rendezvous { handler: RendezvousHandler::new(kv, params).await? })
    }

    /// Wraps an existing handler.
    pub fn from_handler(handler: RendezvousHandler) -> Rendezvous {
        Rendezvous { handler }
    }

    /// The underlying handler.
    pub fn handler(&self) -> &RendezvousHandler {
        &self.handler
    }

    /// Blocks until a round completes with this worker in it (see
    /// [`RendezvousHandler::next_rendezvous`] for the errors), and hands out the round's
    /// Store and bootstrap info (rank 0 also publishes `MASTER_ADDR`/`MASTER_PORT` in it).
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
        Ok(Round {
            run_id: info.run_id,
            version: info.version,
            rank: info.rank,
            world_size: info.world_size,
            participants: info.participants,
            store: store.with_timeout(rdzv_store::DEFAULT_TIMEOUT),
            bootstrap,
            timings: info.timings,
        })
    }
}

impl Deref for Rendezvous {
    type Target = RendezvousHandler;

    fn deref(&self) -> &RendezvousHandler {
        &self.handler
    }
}
