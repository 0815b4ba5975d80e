//! Phase 3, Confirm (docs/PROTOCOL.md): each member of the frozen round creates its
//! keep-alive key, counted in the round's tally where the backend can; the one whose key
//! completes the count (every member alive at its revision) swaps `frozen` for `final`, and
//! the others wait for it.

use tokio::time::Instant;

use crate::kv::{CountedCreate, DeleteMode, PutMode, PutOutcome, Revision};

use super::super::decide::{self, ConfirmAction};
use super::super::state::State;
use super::phase::{ConfirmStep, Frozen, Phase, Reread};
use super::{Action, Bind, Handled, Input, Machine, Observed};

/// The tally of a round's keep-alive keys.
const TALLY_CONFIRMS: &str = "confirms";

impl Machine {
    /// Phase 3: creates my keep-alive key, counted in the round's confirmation tally where
    /// the backend can. The tally is bound to the session of whoever counted last: should
    /// that member die, its keep-alive key goes too and the round can never be final anyway
    /// (the frozen lease ends it), and once final it goes with the member.
    pub(super) fn confirm(&mut self, round: Frozen) -> Action {
        let key = self.keys.rank(round.version, round.rank);
        let action = if self.counted_create {
            let tally = self.keys.tally(round.version, TALLY_CONFIRMS);
            Action::CreateCounted { key, value: self.me.to_bytes(), tally, tally_lease: Some(self.session) }
        } else {
            self.put_own(key)
        };
        self.phase = Phase::Confirm { round, step: ConfirmStep::Writing };
        action
    }

    /// Phase 3: what an input means at `step` of confirming `round`.
    pub(super) fn on_confirm(
        &mut self,
        round: Frozen,
        step: ConfirmStep,
        input: Input,
        now: Instant,
    ) -> Handled {
        Ok(match (step, input) {
            (ConfirmStep::Watching, Input::Ack) | (ConfirmStep::Reclaiming, Input::Deleted(_)) => {
                self.confirm(round)
            }
            (ConfirmStep::Writing, Input::Counted(CountedCreate { outcome, tally })) => {
                self.confirmed_counted(round, outcome, tally)
            }
            (ConfirmStep::Writing, Input::Put(outcome, _)) => self.confirmed(round, outcome),
            (ConfirmStep::Counting { mine, .. }, Input::Count(confirmed)) => {
                if decide::completes_round(confirmed, round.participants.len()) {
                    self.finalize(round, mine)
                } else {
                    self.await_final(round, mine)
                }
            }
            (ConfirmStep::Finalizing { mine }, Input::Put(PutOutcome::Written { revision, .. }, lease)) => {
                self.done(round.completed(revision, mine, lease), now)
            }
            (ConfirmStep::Finalizing { mine }, Input::Put(PutOutcome::Conflict { .. }, _)) => {
                self.await_final(round, mine)
            }
            (ConfirmStep::Waiting { mine }, Input::State(seen)) => {
                self.on_state_while_confirming(round, mine, seen, now)
            }
            (ConfirmStep::Taken, Input::State(seen)) => self.decide(seen, Reread::Start),
            (_, other) => return Err(other),
        })
    }

    /// My keep-alive key created and counted in the tally (`tally`, if the backend told):
    /// one not the last by the tally waits for `final` without counting; the last (or one
    /// whose tally is unknown) counts the live keep-alive keys, so that a round whose member
    /// died is not made final.
    fn confirmed_counted(&mut self, round: Frozen, outcome: PutOutcome, tally: Option<u64>) -> Action {
        match (decide::own_key(outcome.clone(), self.session, &self.retired), tally) {
            (decide::Owned::Mine(mine), Some(tally))
                if !decide::completes_round(tally, round.participants.len()) =>
            {
                self.await_final(round, mine)
            }
            _ => self.confirmed(round, outcome),
        }
    }

    /// My keep-alive key written (`outcome`): count the keys up to mine, reclaim it from a
    /// session I gave up, or wait while another live process with my node id holds it.
    fn confirmed(&mut self, round: Frozen, outcome: PutOutcome) -> Action {
        match decide::own_key(outcome, self.session, &self.retired) {
            decide::Owned::Stale(old) => {
                tracing::debug!("my keep-alive key is held by a session I gave up; ending it");
                let key = self.keys.rank(round.version, round.rank);
                self.phase = Phase::Confirm { round, step: ConfirmStep::Reclaiming };
                Action::Delete { key, mode: DeleteMode::IfRevision(old.mod_revision) }
            }
            decide::Owned::Mine(mine) => {
                // Counting only the keys created up to ours, exactly one member (the last to
                // confirm) sees them all: one swap attempt per round, not a storm.
                let (count, at_revision) = self.count_up_to(self.keys.ranks(round.version), mine);
                self.phase = Phase::Confirm { round, step: ConfirmStep::Counting { mine, at_revision } };
                count
            }
            // Another live process with this node id confirmed this rank: the round is not
            // ours to take. Wait for it to end.
            decide::Owned::Taken(_) => {
                self.phase = Phase::Confirm { round, step: ConfirmStep::Taken };
                Action::Await { until: None, prefix: false }
            }
            decide::Owned::Vanished => {
                self.phase = Phase::Confirm { round, step: ConfirmStep::Writing };
                self.failed(super::vanished())
            }
        }
    }

    /// Mine is the last keep-alive key (created at `mine`): every member was alive at its
    /// revision, so swap `frozen` for `final`.
    fn finalize(&mut self, round: Frozen, mine: Revision) -> Action {
        let fin = State::Final {
            version: round.version,
            participants: round.participants.clone(),
            confirmed: Some(mine),
            max_workers: Some(self.sizing.max),
        };
        let put = Action::PutState {
            key: self.keys.state(),
            state: fin,
            mode: PutMode::Update(round.frozen_revision),
            bind: Bind::RunLease,
        };
        self.phase = Phase::Confirm { round, step: ConfirmStep::Finalizing { mine } };
        put
    }

    /// Waits for the state to say what became of `round` (my keep-alive key created at `mine`).
    fn await_final(&mut self, round: Frozen, mine: Revision) -> Action {
        self.phase = Phase::Confirm { round, step: ConfirmStep::Waiting { mine } };
        Action::Await { until: None, prefix: false }
    }

    /// The state changed to `seen` while this worker waited for `round` to be final.
    fn on_state_while_confirming(
        &mut self,
        round: Frozen,
        mine: Revision,
        seen: Observed,
        now: Instant,
    ) -> Action {
        match decide::on_state_while_confirming(seen.state.as_ref(), round.version) {
            ConfirmAction::Done => {
                let members_from = match &seen.state {
                    Some(State::Final { confirmed: Some(confirmed), .. }) => *confirmed,
                    _ => mine,
                };
                self.done(round.completed(seen.mod_revision, members_from, seen.lease), now)
            }
            ConfirmAction::KeepWaiting => self.await_final(round, mine),
            ConfirmAction::Restart => self.decide(seen, Reread::Start),
            ConfirmAction::Closed => self.fail(self.closed(seen.state.as_ref())),
        }
    }
}
