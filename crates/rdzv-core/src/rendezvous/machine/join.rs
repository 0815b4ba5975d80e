//! Phase 2, Join (docs/PROTOCOL.md): watch the state, create my join key, learn my position
//! (a tally, or a count of the join keys up to mine), take the role it gives — wait, freeze
//! when full, or freeze after the last call — and freeze: read the joiners (and, for a full
//! round, which survivors of the round before are alive and who waited behind it, to wait
//! for those it owes a place) and swap `joinable` for `frozen`.

use tokio::time::Instant;

use crate::kv::{CountedCreate, DeleteMode, EventKind, LeaseId, PutMode, PutOutcome, Revision};

use super::super::decide::{self, Candidate, FreezeAction, JoinRole, JoinedAction, Trigger};
use super::super::state::{Participant, SegmentRuns, State};
use super::phase::{Frozen, JoinStep, Joining, Phase, Reread};
use super::{Action, Bind, Handled, Input, Machine, Observed, frozen_ttl};

/// The tally of a round's join keys (see [`Action::CreateCounted`]).
const TALLY_JOINS: &str = "joins";

impl Machine {
    /// Phase 2: join round `version` (its `joinable` value at `state_revision`), first
    /// watching the state from after `seen`.
    pub(super) fn join(
        &mut self,
        version: u64,
        previous: Option<u64>,
        state_revision: Revision,
        lease: Option<LeaseId>,
        seen: Revision,
    ) -> Action {
        let round = Joining { version, previous, state_revision, lease, awaiting_survivors: false };
        self.phase = Phase::Join { round, step: JoinStep::Watching };
        Action::WatchState { from: seen + 1 }
    }

    /// Phase 2: what an input means at `step` of joining `round`.
    pub(super) fn on_join(&mut self, round: Joining, step: JoinStep, input: Input, now: Instant) -> Handled {
        Ok(match (step, input) {
            (JoinStep::Forgetting, Input::Ack) => {
                let Joining { version, previous, state_revision, lease, .. } = round;
                self.join(version, previous, state_revision, lease, state_revision)
            }
            (JoinStep::Watching, Input::Ack) | (JoinStep::Reclaiming, Input::Deleted(_)) => {
                self.write_join_key(round)
            }
            (JoinStep::Writing, Input::Put(outcome, _)) => self.joined(round, outcome, None, now),
            (JoinStep::Writing, Input::Counted(CountedCreate { outcome, tally })) => {
                self.joined(round, outcome, tally, now)
            }
            (JoinStep::Counting { .. }, Input::Count(position)) => self.take_role(round, position, now),
            (JoinStep::Waiting { freeze_at, joiners }, Input::State(seen)) => {
                self.on_state_while_joined(round, freeze_at, joiners, seen, now)
            }
            (JoinStep::Waiting { freeze_at, .. }, Input::Timer) => {
                let trigger = freeze_at.map_or(Trigger::Timer, |(_, trigger)| trigger);
                self.phase = Phase::Join { round, step: JoinStep::Reading { trigger } };
                Action::ReadJoiners { prefix: self.keys.joins(round.version) }
            }
            (JoinStep::Waiting { freeze_at, joiners: Some(count) }, Input::KeyEvent { kind, created }) => {
                let count = match kind {
                    EventKind::Put if created => count + 1,
                    EventKind::Put => count,
                    EventKind::Delete => count.saturating_sub(1),
                };
                self.on_joiners_counted(round, freeze_at, count, now)
            }
            (JoinStep::Reading { trigger }, Input::Joiners(candidates, revision)) => {
                self.read_joiners(round, trigger, candidates, revision, now)
            }
            (JoinStep::ReadingMembers { candidates, revision }, Input::Members(alive)) => {
                self.read_waiters(round, candidates, revision, alive)
            }
            (JoinStep::ReadingWaiters { candidates, revision, alive }, Input::Joiners(waiters, _)) => {
                self.freeze_unless_waiters_first(round, candidates, revision, alive, waiters, now)
            }
            (JoinStep::WatchingJoiners { count, whole: true }, Input::Ack) => {
                // Only a joiner that comes or goes can complete a segment: try again then.
                self.await_joined(round, None, Some(count))
            }
            (JoinStep::WatchingJoiners { count, whole: false }, Input::Ack) => {
                // Enough for a round but not full (a position of `max` counted a joiner that
                // is gone since, or whole segments do not fill the `max` joiners): the last
                // call runs from now.
                let freeze_at = (count as usize >= self.sizing.min)
                    .then(|| (now + self.sizing.last_call, Trigger::Timer));
                self.await_joined(round, freeze_at, Some(count))
            }
            (JoinStep::Freezing, Input::Put(outcome, _)) => {
                // Won or lost, the state watch tells what the round became.
                tracing::debug!(won = outcome.is_written(), "freeze attempted");
                self.await_joined(round, None, None)
            }
            (_, other) => return Err(other),
        })
    }

    /// Creates my join key in `round`, counted in the round's tally where the backend can.
    fn write_join_key(&mut self, round: Joining) -> Action {
        let join_key = self.keys.join(round.version, &self.me.node);
        // Registered before the write: if its answer is lost, the key may exist all the same,
        // and must not be frozen into a round as a ghost.
        self.leftovers.add(&join_key);
        self.phase = Phase::Join { round, step: JoinStep::Writing };
        let value = self.my_joiner().to_bytes();
        if self.counted_create {
            // The tally is my position: nobody counts the others' keys.
            let tally = self.keys.tally(round.version, TALLY_JOINS);
            Action::CreateCounted { key: join_key, value, tally, tally_lease: round.lease }
        } else {
            Action::Put { key: join_key, value, mode: PutMode::Create, bind: Bind::Session }
        }
    }

    /// Waits, joined to `round`, for the state to change, until the freeze timer `freeze_at`
    /// (if any), and for the join keys' events while `joiners` are counted.
    fn await_joined(
        &mut self,
        round: Joining,
        freeze_at: Option<(Instant, Trigger)>,
        joiners: Option<u64>,
    ) -> Action {
        self.phase = Phase::Join { round, step: JoinStep::Waiting { freeze_at, joiners } };
        Action::Await { until: freeze_at.map(|(at, _)| at), prefix: joiners.is_some() }
    }

    /// The state changed to `seen` while this worker waited, joined to `round` (with the
    /// freeze timer and the joiners' count it waited with).
    fn on_state_while_joined(
        &mut self,
        round: Joining,
        freeze_at: Option<(Instant, Trigger)>,
        joiners: Option<u64>,
        seen: Observed,
        now: Instant,
    ) -> Action {
        let join_key = self.keys.join(round.version, &self.me.node);
        match decide::on_state_while_joined(seen.state.as_ref(), round.version, &self.me) {
            JoinedAction::KeepWaiting => {
                let round = Joining { state_revision: seen.mod_revision, ..round };
                self.await_joined(round, freeze_at, joiners)
            }
            JoinedAction::Confirm { rank, participants } => {
                // The round's membership is fixed: the join key is no ghost any more.
                self.leftovers.remove(&join_key);
                self.timings.frozen = now - self.started;
                let frozen =
                    Frozen { version: round.version, rank, participants, frozen_revision: seen.mod_revision };
                self.confirm(frozen)
            }
            JoinedAction::Restart => {
                self.leftovers.remove(&join_key);
                self.decide(seen, Reread::Start)
            }
            JoinedAction::Closed => self.fail(self.closed(seen.state.as_ref())),
        }
    }

    /// `count` join keys are there (counted from the join keys' events): enough to freeze
    /// after a delay, or not yet.
    fn on_joiners_counted(
        &mut self,
        round: Joining,
        freeze_at: Option<(Instant, Trigger)>,
        count: u64,
        now: Instant,
    ) -> Action {
        match decide::retry_delay(count, &self.sizing) {
            Some((delay, trigger)) => self.await_joined(round, Some((now + delay, trigger)), None),
            None => self.await_joined(round, freeze_at, Some(count)),
        }
    }

    /// The joiners read at `revision`, to freeze: a full round that waits for the survivors
    /// of the round before first reads which of them are alive.
    fn read_joiners(
        &mut self,
        round: Joining,
        trigger: Trigger,
        candidates: Vec<Candidate>,
        revision: Revision,
        now: Instant,
    ) -> Action {
        match (trigger, decide::survivor_round(&candidates, round.previous)) {
            (Trigger::Full, Some(before)) => {
                self.phase = Phase::Join { round, step: JoinStep::ReadingMembers { candidates, revision } };
                Action::ReadMembers { prefix: self.keys.ranks(before) }
            }
            _ => self.freeze(round, candidates, &[], trigger, revision, now),
        }
    }

    /// A full round's freeze, with the members of the round before that are `alive`: reads
    /// who waited behind that round.
    fn read_waiters(
        &mut self,
        round: Joining,
        candidates: Vec<Candidate>,
        revision: Revision,
        alive: Vec<Participant>,
    ) -> Action {
        let before = decide::survivor_round(&candidates, round.previous).unwrap_or(round.version);
        self.phase = Phase::Join { round, step: JoinStep::ReadingWaiters { candidates, revision, alive } };
        Action::ReadJoiners { prefix: self.keys.waiting(before) }
    }

    /// A full round's freeze: waits for `waiters` of the round before that come ahead of a
    /// newcomer that joined ([`decide::waiters_to_await`]), else freezes.
    fn freeze_unless_waiters_first(
        &mut self,
        round: Joining,
        candidates: Vec<Candidate>,
        revision: Revision,
        alive: Vec<Participant>,
        waiters: Vec<Candidate>,
        now: Instant,
    ) -> Action {
        let segments = self.segments_before(round.version);
        match decide::waiters_to_await(&candidates, waiters, round.previous, &self.sizing, segments) {
            0 => self.freeze(round, candidates, &alive, Trigger::Full, revision, now),
            missing => {
                tracing::debug!(missing, "the round is full, but spares first in line are yet to join");
                self.await_earlier(round, now)
            }
        }
    }

    /// Waits, for a full round, for workers that come first and have not joined yet: one
    /// that joins later freezes the round itself (it counts a position of `max` or more); the
    /// backup timer covers one that never comes.
    fn await_earlier(&mut self, round: Joining, now: Instant) -> Action {
        let freeze_at = Some((now + self.sizing.backup, Trigger::Timer));
        let round = Joining { awaiting_survivors: true, ..round };
        self.await_joined(round, freeze_at, None)
    }

    /// The segments of the ranks of the round before `version`, when this worker knows them.
    fn segments_before(&self, version: u64) -> Option<&SegmentRuns> {
        self.joinable_segments.as_ref().filter(|(of, _)| *of == version).map(|(_, segments)| segments)
    }

    /// Phase 2, my join key written (`outcome`, with its `tally` if the create counted it):
    /// my position is the tally, or else a count of the join keys up to mine.
    fn joined(&mut self, round: Joining, outcome: PutOutcome, tally: Option<u64>, now: Instant) -> Action {
        let join_key = self.keys.join(round.version, &self.me.node);
        match decide::own_key(outcome, self.session, &self.retired) {
            decide::Owned::Stale(old) => {
                tracing::debug!("my join key is held by a session I gave up; ending it");
                self.phase = Phase::Join { round, step: JoinStep::Reclaiming };
                Action::Delete { key: join_key, mode: DeleteMode::IfRevision(old.mod_revision) }
            }
            decide::Owned::Mine(mine) => {
                self.since.get_or_insert(mine);
                self.timings.joined = now - self.started;
                match tally {
                    Some(position) => self.take_role(round, position, now),
                    // Found already mine (an earlier answer was lost): count.
                    None => {
                        let (count, at_revision) = self.count_up_to(self.keys.joins(round.version), mine);
                        self.phase = Phase::Join { round, step: JoinStep::Counting { mine, at_revision } };
                        count
                    }
                }
            }
            decide::Owned::Taken(holder) => {
                self.leftovers.remove(&join_key);
                self.await_release(join_key, holder)
            }
            decide::Owned::Vanished => {
                self.phase = Phase::Join { round, step: JoinStep::Writing };
                self.failed(super::vanished())
            }
        }
    }

    /// Phase 2: the role my position gives me ([`decide::join_role`]).
    fn take_role(&mut self, round: Joining, position: u64, now: Instant) -> Action {
        tracing::debug!(position, "joined");
        let freeze_at = match decide::join_role(position, &self.sizing) {
            JoinRole::FreezeIfFull => Some((now, Trigger::Full)),
            JoinRole::FreezeAfter(delay) => Some((now + delay, Trigger::Timer)),
            JoinRole::Wait => None,
        };
        self.phase = Phase::Join { round, step: JoinStep::Waiting { freeze_at, joiners: None } };
        Action::Await { until: freeze_at.map(|(at, _)| at), prefix: false }
    }

    /// Phase 2, freeze: what [`decide::freeze`] says of the candidates read at `revision`.
    fn freeze(
        &mut self,
        round: Joining,
        candidates: Vec<Candidate>,
        alive: &[Participant],
        trigger: Trigger,
        revision: Revision,
        now: Instant,
    ) -> Action {
        let Joining { version, previous, state_revision, .. } = round;
        let stay = |round, step| Phase::Join { round, step };
        let segments = self.segments_before(version);
        match decide::freeze(candidates, previous, alive, trigger, &self.sizing, segments) {
            action @ (FreezeAction::AwaitJoiners { count } | FreezeAction::AwaitSegments { count }) => {
                let whole = matches!(action, FreezeAction::AwaitSegments { .. });
                tracing::debug!(
                    count,
                    whole,
                    "too few joiners (in whole segments) to freeze; watching the join keys"
                );
                self.phase = stay(round, JoinStep::WatchingJoiners { count, whole });
                Action::WatchPrefix { prefix: self.keys.joins(version), from: revision + 1 }
            }
            FreezeAction::AwaitSurvivors { missing } => {
                tracing::debug!(
                    missing,
                    "the round is full, but survivors of the round before are yet to join"
                );
                self.await_earlier(round, now)
            }
            FreezeAction::Freeze(participants) => {
                self.phase = stay(round, JoinStep::Freezing);
                let ttl = frozen_ttl(participants.len());
                Action::PutState {
                    key: self.keys.state(),
                    state: State::Frozen { version, participants: participants.into() },
                    mode: PutMode::Update(state_revision),
                    bind: Bind::Fresh(ttl),
                }
            }
        }
    }
}
