//! Phase 1, creating a round (docs/PROTOCOL.md "Creating a round"): `setup` written — created
//! where no round exists, or swapped for a running round's `final` to end it — then the
//! version counter bumped and `setup` swapped for `joinable`.

use crate::error::RendezvousError;
use crate::kv::{KeyValue, PutMode, PutOutcome, Revision};

use super::super::decide;
use super::super::state::{SegmentRuns, State};
use super::phase::{CounterStep, JoinStep, Joining, Phase, Purpose};
use super::{Action, Bind, Handled, Input, Machine};

impl Machine {
    /// Writes `setup` (bound to this worker's session: if it dies now, the value vanishes)
    /// under `mode`: create-if-absent to start the first round, or a swap of the `final`
    /// value to end a running one (the others learn at once, and the winner opens the next
    /// round with no further contention). The winner opens the round; a loser acts on the
    /// value that beat it.
    pub(super) fn claim(
        &mut self,
        purpose: Purpose,
        mode: PutMode,
        drop_on_failure: Option<Vec<u8>>,
    ) -> Action {
        // Registered before the write: if its answer is lost, the `setup` may exist all the same.
        self.leftovers.add(&self.keys.state());
        self.phase = Phase::Claim { purpose, drop_on_failure };
        Action::Put { key: self.keys.state(), value: State::Setup.to_bytes(), mode, bind: Bind::Session }
    }

    /// Bumps the version counter, then swaps `setup` → `joinable`.
    pub(super) fn open_round(&mut self, setup_revision: Revision, purpose: Purpose) -> Action {
        self.phase = Phase::Counter { setup_revision, purpose, step: CounterStep::Reading };
        Action::Get { key: self.keys.version_counter() }
    }

    /// Writes the version counter's next value after `current` (as read), if it has not
    /// changed since, bound to the run lease; a counter that is no number ends the call.
    fn bump_counter(
        &mut self,
        setup_revision: Revision,
        purpose: Purpose,
        current: Option<KeyValue>,
    ) -> Action {
        let key = self.keys.version_counter();
        match decide::next_version(current.as_ref().map(|kv| &kv.value[..])) {
            Ok(version) => {
                self.phase =
                    Phase::Counter { setup_revision, purpose, step: CounterStep::Writing { version } };
                let mode = current.map_or(PutMode::Create, |kv| PutMode::Update(kv.mod_revision));
                Action::Put { key, value: version.to_string().into_bytes(), mode, bind: Bind::RunLease }
            }
            Err(reason) => {
                self.fail(RendezvousError::State { key: String::from_utf8_lossy(&key).into_owned(), reason })
            }
        }
    }

    /// `setup` written for `purpose`: open the round; beaten, act on what beat it.
    pub(super) fn on_claim(&mut self, purpose: Purpose, input: Input) -> Handled {
        match input {
            Input::Put(PutOutcome::Written { revision, .. }, _) => Ok(self.open_round(revision, purpose)),
            Input::Put(PutOutcome::Conflict { current }, _) => {
                self.leftovers.remove(&self.keys.state());
                Ok(self.restart_from(current))
            }
            other => Err(other),
        }
    }

    /// The version counter read, then written: swap `setup` (at `setup_revision`) for
    /// `joinable`.
    pub(super) fn on_counter(
        &mut self,
        setup_revision: Revision,
        purpose: Purpose,
        step: CounterStep,
        input: Input,
    ) -> Handled {
        match (step, input) {
            (CounterStep::Reading, Input::Key(current)) => {
                Ok(self.bump_counter(setup_revision, purpose, current))
            }
            (CounterStep::Writing { version }, Input::Put(PutOutcome::Written { .. }, _)) => {
                // A lost answer leaves the version counter bumped: resuming bumps it again,
                // and that version is skipped, which is harmless (versions only need to grow).
                let previous = self.latest_final;
                let segments = self
                    .final_members
                    .as_ref()
                    .filter(|(seen, _)| previous == Some(*seen))
                    .and_then(|(_, members)| SegmentRuns::of(members));
                self.joinable_segments = segments.clone().map(|s| (version, s));
                self.phase = Phase::Open { version, previous, purpose };
                Ok(Action::Put {
                    key: self.keys.state(),
                    value: State::Joinable { version, previous, segments }.to_bytes(),
                    mode: PutMode::Update(setup_revision),
                    bind: Bind::RunLease,
                })
            }
            // Someone bumped it since the read (a creator whose `setup` has gone since): bump
            // the value it wrote.
            (CounterStep::Writing { .. }, Input::Put(PutOutcome::Conflict { current }, _)) => {
                Ok(self.bump_counter(setup_revision, purpose, current))
            }
            (_, other) => Err(other),
        }
    }

    /// Round `version` (after `previous`) is open: its creator hands the deletes of the
    /// rounds nobody can be in any more to the background (`forget.rs`), then joins. Not
    /// knowing the round before, it cannot tell which of the old rounds the survivors come
    /// from, and deletes nothing.
    pub(super) fn on_open(&mut self, version: u64, previous: Option<u64>, input: Input) -> Handled {
        match input {
            Input::Put(PutOutcome::Written { revision, .. }, lease) => {
                self.leftovers.remove(&self.keys.state());
                tracing::debug!(version, ?previous, "created a round");
                let Some(kept) = previous.filter(|p| *p < version) else {
                    return Ok(self.join(version, previous, revision, lease, revision));
                };
                let round =
                    Joining { version, previous, state_revision: revision, lease, awaiting_survivors: false };
                self.phase = Phase::Join { round, step: JoinStep::Forgetting };
                Ok(Action::ForgetRounds { version, previous: kept, run_lease: lease })
            }
            Input::Put(PutOutcome::Conflict { current }, _) => {
                self.leftovers.remove(&self.keys.state());
                Ok(self.restart_from(current))
            }
            other => Err(other),
        }
    }
}
