//! Phase 5, late arrivals and spares (docs/PROTOCOL.md "Late arrivals"): a worker that finds
//! a round running without it registers as waiting (its waiting key), watches the round's
//! state and keep-alive keys, and ends the round when one of its members is gone — as a spare
//! if the round is full — or starts over when the state changes.

use crate::kv::{EventKind, PutMode, PutOutcome};

use super::super::decide::{self, WaitingAction};
use super::super::state::State;
use super::phase::{LateStep, Phase, Purpose, Reread};
use super::{Action, Bind, Handled, Input, Machine, Observed};

impl Machine {
    /// Phase 5: round `version` is running without us. Register as waiting; end the round
    /// when one of its members is gone; start over when the state changes.
    pub(super) fn late(&mut self, version: u64, world_size: usize, observed: Observed) -> Action {
        if let Some(State::Final { participants, .. }) = &observed.state {
            self.waited_on = Some((version, participants.clone()));
        }
        let from = observed.seen + 1;
        self.phase = Phase::Late { version, world_size, observed, step: LateStep::WatchingState };
        Action::WatchState { from }
    }

    /// Phase 5: what an input means at `step` of waiting behind round `version` (as
    /// `observed`, of `world_size` members).
    pub(super) fn on_late(
        &mut self,
        version: u64,
        world_size: usize,
        observed: Observed,
        step: LateStep,
        input: Input,
    ) -> Handled {
        let ranks = self.keys.ranks(version);
        let next = |step| Phase::Late { version, world_size, observed: observed.clone(), step };
        Ok(match (step, input) {
            (LateStep::WatchingState, Input::Ack) => {
                let from = observed.seen + 1;
                self.phase = next(LateStep::WatchingMembers);
                Action::WatchPrefix { prefix: ranks, from }
            }
            (LateStep::WatchingMembers, Input::Ack) => {
                let key = self.keys.waiter(version, &self.me.node);
                self.leftovers.add(&key);
                self.phase = next(LateStep::Registering);
                let value = self.my_joiner().to_bytes();
                Action::Put { key, value, mode: PutMode::Overwrite, bind: Bind::Session }
            }
            (LateStep::Registering, Input::Put(outcome, _)) => {
                if let PutOutcome::Written { create_revision, .. } = outcome {
                    self.since.get_or_insert(create_revision);
                }
                // A member may have died before we started watching: the count settles that.
                self.phase = next(LateStep::Counting);
                Action::Count { prefix: ranks, created_up_to: None }
            }
            (LateStep::Counting, Input::Count(alive)) => {
                let action =
                    decide::on_change_while_waiting(observed.state.as_ref(), version, alive, world_size);
                self.act_late(version, world_size, observed, action)
            }
            (LateStep::Waiting, Input::State(seen)) => {
                self.on_state_while_late(version, world_size, observed, seen)
            }
            (LateStep::Waiting, Input::KeyEvent { kind, .. }) => {
                let action = match kind {
                    EventKind::Delete => decide::on_change_while_waiting(
                        observed.state.as_ref(),
                        version,
                        world_size as u64 - 1,
                        world_size,
                    ),
                    EventKind::Put => WaitingAction::KeepWaiting,
                };
                self.act_late(version, world_size, observed, action)
            }
            (_, other) => return Err(other),
        })
    }

    /// The state changed to `seen` while this worker waited behind round `version` (as
    /// `observed`, of `world_size` members).
    fn on_state_while_late(
        &mut self,
        version: u64,
        world_size: usize,
        observed: Observed,
        seen: Observed,
    ) -> Action {
        let alive = world_size as u64;
        match decide::on_change_while_waiting(seen.state.as_ref(), version, alive, world_size) {
            WaitingAction::Restart => self.decide(seen, Reread::Start),
            WaitingAction::Closed => self.fail(self.closed(seen.state.as_ref())),
            action => self.act_late(version, world_size, observed, action),
        }
    }

    /// Acts on what the running round `version` (as `observed`) is now, as `action` says.
    fn act_late(
        &mut self,
        version: u64,
        world_size: usize,
        observed: Observed,
        action: WaitingAction,
    ) -> Action {
        match action {
            WaitingAction::KeepWaiting => {
                self.phase = Phase::Late { version, world_size, observed, step: LateStep::Waiting };
                Action::Await { until: None, prefix: true }
            }
            WaitingAction::Closed => self.fail(self.closed(observed.state.as_ref())),
            WaitingAction::Restart => {
                self.read_state(Reread::WaitedBehind { spare: world_size >= self.sizing.max })
            }
            WaitingAction::DestroyRound => {
                tracing::debug!(version, "a member of the running round is gone; ending it");
                let spare = world_size >= self.sizing.max;
                self.claim(Purpose::End { spare }, PutMode::Update(observed.mod_revision), None)
            }
        }
    }
}
