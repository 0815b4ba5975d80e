//! Phase 1, Init (docs/PROTOCOL.md): read the state and do what it says — create a round,
//! join one, wait behind a running one, resume the round this worker is already in — and
//! the waits that lead back here (a round being set up or frozen, a key another live process
//! holds, a backoff, an earlier process of this worker in a frozen round).

use tokio::time::Instant;

use crate::kv::{DeleteMode, KeyValue, PutMode, Revision};

use super::super::decide::{self, InitAction, Viewer};
use super::super::state::{Participant, State};
use super::phase::{ConfirmStep, Frozen, Phase, PredecessorStep, Purpose, Reread, Step};
use super::{Action, Completed, Handled, Input, Machine, Observed, RoundTimings};

impl Machine {
    /// Phase 1: what the state says to do.
    /// `after`: why the call read it (see [`Reread`]; `Start` for a state it was handed).
    pub(super) fn decide(&mut self, observed: Observed, after: Reread) -> Action {
        if let Some(State::Final { version, participants, .. }) = &observed.state {
            self.latest_final = self.latest_final.max(Some(*version));
            if self.final_members.as_ref().is_none_or(|(seen, _)| seen < version) {
                self.final_members = Some((*version, participants.clone()));
            }
        }
        let viewer = Viewer {
            me: &self.me,
            setup_is_mine: matches!(observed.state, Some(State::Setup))
                && observed.lease == Some(self.session),
            leaving: self.leaving,
        };
        match decide::on_state(observed.state.as_ref(), viewer) {
            InitAction::Closed => self.fail(self.closed(observed.state.as_ref())),
            InitAction::ResumeSetup => {
                tracing::debug!("resuming the setup this call wrote before it failed");
                self.leftovers.add(&self.keys.state());
                self.open_round(observed.mod_revision, Purpose::Create)
            }
            InitAction::Leave { version } => {
                tracing::debug!(version, "ending the round this call is leaving, again");
                self.claim(Purpose::Leave, PutMode::Update(observed.mod_revision), None)
            }
            InitAction::CreateRound => self.claim(Purpose::Create, PutMode::Create, None),
            InitAction::Join { version, previous, segments } => {
                self.joinable_segments = segments.map(|s| (version, s));
                self.join(version, previous, observed.mod_revision, observed.lease, observed.seen)
            }
            InitAction::AwaitNextRound { version, world_size } => self.late(version, world_size, observed),
            InitAction::ResumeConfirm { version, rank } => {
                let Some(State::Frozen { participants, .. }) = observed.state else {
                    return self.read_state(after);
                };
                let round = Frozen { version, rank, participants, frozen_revision: observed.mod_revision };
                self.phase = Phase::Confirm { round, step: ConfirmStep::Watching };
                Action::WatchState { from: observed.seen + 1 }
            }
            InitAction::ResumeMember { version, rank, world_size } => {
                let key = self.keys.rank(version, rank);
                self.phase = Phase::Member { observed, version, rank, world_size, after };
                Action::Get { key }
            }
            InitAction::AwaitChange => self.await_change(observed.seen),
            InitAction::CheckPredecessor { version, pid } => {
                tracing::debug!(version, pid, "the round froze with an earlier process of this worker in it");
                self.phase = Phase::Predecessor { observed, step: PredecessorStep::Asking, after };
                Action::ProcessAlive { pid }
            }
        }
    }

    /// Someone is creating or freezing a round: watch the state from after `seen` until it
    /// changes.
    pub(super) fn await_change(&mut self, seen: Revision) -> Action {
        self.phase = Phase::AwaitChange(Step::Watching);
        Action::WatchState { from: seen + 1 }
    }

    /// Phase 1: the state, read because of `after`.
    pub(super) fn on_init(&mut self, after: Reread, input: Input) -> Handled {
        match input {
            Input::State(observed) => Ok(self.decide(observed, after)),
            other => Err(other),
        }
    }

    /// Someone is creating or freezing a round: the watch, then the state it changed to.
    pub(super) fn on_await_change(&mut self, step: Step, input: Input) -> Handled {
        match (step, input) {
            (Step::Watching, Input::Ack) => {
                self.phase = Phase::AwaitChange(Step::Waiting);
                Ok(Action::Await { until: None, prefix: false })
            }
            (Step::Waiting, Input::State(seen)) => Ok(self.decide(seen, Reread::Start)),
            (_, other) => Err(other),
        }
    }

    /// The state is `final{version}` with this worker as `rank` of `world_size` in it (as
    /// `observed`): its keep-alive key, read, tells whether it is still a member.
    pub(super) fn on_member(
        &mut self,
        observed: Observed,
        version: u64,
        rank: usize,
        world_size: usize,
        input: Input,
        now: Instant,
    ) -> Handled {
        let Input::Key(key) = input else { return Err(input) };
        Ok(match (&observed.state, decide::holds(key.as_ref(), self.session)) {
            (Some(State::Final { participants, confirmed, .. }), Some(mine)) => {
                let done = Completed {
                    version,
                    rank,
                    participants: participants.clone(),
                    final_revision: observed.mod_revision,
                    members_from: confirmed.unwrap_or(mine),
                    run_lease: observed.lease,
                    timings: RoundTimings::default(),
                };
                self.done(done, now)
            }
            _ => self.late(version, world_size, observed),
        })
    }

    /// A round froze with an earlier process of this worker in it (as `observed`): whether
    /// that process runs, and if not, the round ended.
    pub(super) fn on_predecessor(
        &mut self,
        observed: Observed,
        step: PredecessorStep,
        after: Reread,
        input: Input,
    ) -> Handled {
        match (step, input) {
            (PredecessorStep::Asking, Input::Alive(true)) => Ok(self.await_change(observed.seen)),
            (PredecessorStep::Asking, Input::Alive(false)) => {
                tracing::info!(
                    node = %self.me.node,
                    "the round froze with an earlier process of this worker, which is gone; ending the round"
                );
                let revision = observed.mod_revision;
                self.phase = Phase::Predecessor { observed, step: PredecessorStep::Ending, after };
                Ok(Action::Delete { key: self.keys.state(), mode: DeleteMode::IfRevision(revision) })
            }
            // Deleted, or changed since: the state read next tells what the round became.
            (PredecessorStep::Ending, Input::Deleted(_)) => Ok(self.read_state(after)),
            (_, other) => Err(other),
        }
    }

    /// Our key is held by another live process with this node id: wait until it is gone
    /// (its process ended, or its session expired), then start over. If it never goes, the
    /// call's deadline ends the wait with this phase in the error.
    pub(super) fn await_release(&mut self, key: Vec<u8>, holder: KeyValue) -> Action {
        let other = Participant::parse(&holder.key, &holder.value).ok();
        tracing::warn!(node = %self.me.node, other = ?other, "another live worker uses this node id; waiting for it to go away");
        self.phase = Phase::Release;
        Action::AwaitDelete { key, after: holder.mod_revision }
    }

    /// The key another live process held is gone: start over.
    pub(super) fn on_release(&mut self, input: Input) -> Handled {
        match input {
            Input::Ack => Ok(self.read_state(Reread::Released)),
            other => Err(other),
        }
    }

    /// The backoff after a retryable failure is over: start over.
    pub(super) fn on_backoff(&mut self, input: Input) -> Handled {
        match input {
            Input::Timer => Ok(self.read_state(Reread::Retry)),
            other => Err(other),
        }
    }
}
