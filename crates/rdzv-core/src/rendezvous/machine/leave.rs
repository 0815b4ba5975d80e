//! Phase 6, leaving the running round (docs/PROTOCOL.md "Re-entering, leaving, closing"): a
//! member that calls again first ends its round — rank 0 at once, the others after a delay
//! that grows with their rank, unless another member ended it first — and, if the swap
//! cannot be written, drops its keep-alive key so that the others notice anyway.

use tokio::time::Instant;

use crate::error::RendezvousError;
use crate::kv::PutMode;

use super::super::decide;
use super::phase::{Phase, Purpose, Reread, Step};
use super::{Action, Handled, Input, Leaving, Machine};

impl Machine {
    /// Leaves this worker's running round by ending it: the swap of its `final` value to
    /// `setup` (on failure, its keep-alive key is dropped so that the others notice anyway).
    pub(super) fn end_running_round(&mut self, round: Leaving) -> Action {
        tracing::debug!(version = round.version, "leaving the running round");
        self.claim(
            Purpose::Leave,
            PutMode::Update(round.final_revision),
            Some(self.keys.rank(round.version, round.rank)),
        )
    }

    /// A member not first in rank waits [`decide::leave_delay`] for another re-entering
    /// member to end `round` before it ends the round itself.
    pub(super) fn on_yielding(&mut self, round: Leaving, step: Step, input: Input, now: Instant) -> Handled {
        match (step, input) {
            (Step::Watching, Input::Ack) => {
                let until = now + decide::leave_delay(round.rank);
                self.phase = Phase::Yielding { round, step: Step::Waiting };
                Ok(Action::Await { until: Some(until), prefix: false })
            }
            (Step::Waiting, Input::Timer) => Ok(self.end_running_round(round)),
            // Another member ended the round (or the run closed): act on what it is now, as a
            // call that never held the round (`leaving` keeps it from being handed back).
            (Step::Waiting, Input::State(seen)) => {
                tracing::debug!(version = round.version, "another member ended the running round first");
                Ok(self.decide(seen, Reread::Start))
            }
            (_, other) => Err(other),
        }
    }

    /// A failed leave dropped this worker's keep-alive key (or found it gone): the leave's
    /// own `error` decides.
    pub(super) fn on_dropping(&mut self, error: RendezvousError, input: Input) -> Handled {
        match input {
            Input::Deleted(_) => Ok(self.classify(error)),
            other => Err(other),
        }
    }
}
