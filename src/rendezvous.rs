//! [`Rendezvous`]: the handler of `rdzv-core` plus the round's Store and bootstrap info.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use rdzv_core::{Kv, Participant, RendezvousError, RendezvousHandler, RendezvousParams, RoundTimings};
use rdzv_store::Store;
use tokio::time::Instant;

use crate::bootstrap::{self, Bootstrap};

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
    /// [`RendezvousHandler::next_rendezvous`] for the errors), then exchanges the bootstrap
    /// info through the round's Store. If the round breaks before rank 0 published it, this
    /// forms the next round, within the same `timeout`.
    pub async fn next_rendezvous(&self) -> Result<Round, RendezvousError> {
        let deadline = Instant::now() + self.handler.params().timeout;
        loop {
            let info = self.handler.next_rendezvous().await?;
            let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            let store = Store::new(self.handler.backend(), info.store_prefix.clone()).with_timeout(remaining);
            let exchanged = tokio::select! {
                b = bootstrap::exchange(&info, &store) => Some(b?),
                _ = self.handler.round_broken() => None,
            };
            let Some(bootstrap) = exchanged else {
                if Instant::now() >= deadline {
                    return Err(RendezvousError::Timeout {
                        run_id: info.run_id,
                        phase: "exchanging bootstrap info".into(),
                        after: self.handler.params().timeout,
                    });
                }
                continue;
            };
            let store = store.with_timeout(rdzv_store::DEFAULT_TIMEOUT);
            return Ok(Round {
                run_id: info.run_id,
                version: info.version,
                rank: info.rank,
                world_size: info.world_size,
                participants: info.participants,
                store,
                bootstrap,
                timings: info.timings,
            });
        }
    }
}

impl Deref for Rendezvous {
    type Target = RendezvousHandler;

    fn deref(&self) -> &RendezvousHandler {
        &self.handler
    }
}
