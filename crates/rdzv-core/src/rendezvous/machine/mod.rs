//! The protocol of one `next_rendezvous` call as a state machine that does no I/O
//! (docs/PROTOCOL.md "The phases"): what the worker observed goes in ([`Input`]), what it
//! must do next comes out ([`Action`]), and the time is passed in. `executor.rs` is the small
//! async executor that performs the actions against a [`Kv`](crate::Kv) and feeds back their
//! results; tests can drive the machine directly, without tokio or a backend.
//!
//! Every action except [`Action::Await`] and the final [`Action::Done`]/[`Action::Fail`] is
//! answered by exactly one input: its result, or [`Input::Failed`]. [`Action::Await`] is
//! answered by the first of: a change of the state key ([`Input::State`]), an event on the
//! watched prefix ([`Input::KeyEvent`]), or the timer ([`Input::Timer`]).
//!
//! One module per phase of PROTOCOL.md, each with the handler of its inputs: `init.rs`
//! (phase 1, reading the state, and resuming a round this worker is in), `create.rs`
//! (creating a round), `join.rs` (phase 2), `confirm.rs` (phase 3), `late.rs` (phase 5, late
//! arrivals and spares), `leave.rs` (phase 6, leaving the running round); `phase.rs` holds the
//! phases themselves, `io.rs` what crosses to the executor. [`Machine::on`] only dispatches.
//! An input a phase never asked for is handed back by its handler (`Err`), and `on` fails
//! the call with [`RendezvousError::Internal`] naming the phase: a bug of the executor.

mod confirm;
mod create;
mod init;
mod io;
mod join;
mod late;
mod leave;
mod phase;

use tokio::time::Instant;

use crate::error::{KvError, RendezvousError};
use crate::kv::{DeleteMode, KeyValue, LeaseId, PutMode, Revision};

use super::decide::{self, Sizing};
use super::keys::RunKeys;
use super::state::{LastRound, Participant, SegmentRuns, State};

pub(crate) use io::frozen_ttl;
pub use io::{Action, Bind, Call, Completed, Input, Leaving, Leftovers, Observed, RoundTimings};
use phase::{ConfirmStep, JoinStep, Phase, PredecessorStep, Reread, Step};

/// What a phase's handler makes of an input: the next action, or the input handed back as one
/// the phase never asked for.
type Handled = Result<Action, Input>;

/// One `next_rendezvous` call, as a state machine.
#[derive(Debug)]
pub struct Machine {
    me: Participant,
    session: LeaseId,
    keys: RunKeys,
    sizing: Sizing,
    /// See [`Call::count_at_revision`].
    count_at_revision: bool,
    /// See [`Call::counted_create`].
    counted_create: bool,
    /// See [`Call::retired`].
    retired: Vec<LeaseId>,
    run_id: String,
    /// The round to leave first, until that is tried.
    leave_first: Option<Leaving>,
    /// The round this call is leaving: never handed back, whatever fails meanwhile.
    leaving: Option<u64>,
    /// See [`Call::last`].
    last: Option<LastRound>,
    /// See [`Call::since`]; set by this call's first join or waiting key if it was unknown.
    since: Option<Revision>,
    /// See [`Call::node_index`].
    node_index: Option<u64>,
    /// The latest round this call saw final: a round it opens names it as `previous`.
    latest_final: Option<u64>,
    /// The members of the latest round this call saw final (or leaves): a round it opens
    /// after that one carries their segments in its `joinable` value (read only then: every
    /// worker sees a `final` value, one opens the next round).
    final_members: Option<(u64, std::sync::Arc<[Participant]>)>,
    /// The segments of the previous round's ranks, as the `joinable` value of the round this
    /// call joins gave them: what its freeze gives free ranks by.
    joinable_segments: Option<(u64, SegmentRuns)>,
    /// The latest round this call waited on as a late arrival or spare, with its members.
    waited_on: Option<(u64, std::sync::Arc<[Participant]>)>,
    phase: Phase,
    leftovers: Leftovers,
    started: Instant,
    timings: RoundTimings,
}

impl Machine {
    /// The machine of one call: it first leaves `call.leave_first` if given, and never hands
    /// back round `call.leaving`.
    pub fn new(call: Call) -> Machine {
        let Call {
            me,
            session,
            keys,
            sizing,
            count_at_revision,
            counted_create,
            retired,
            run_id,
            started,
            leave_first,
            leaving,
            last,
            since,
            node_index,
        } = call;
        let latest_final =
            leave_first.as_ref().map(|l| l.version).into_iter().chain(last.map(|l| l.version)).max();
        let final_members = leave_first.as_ref().map(|l| (l.version, l.participants.clone()));
        Machine {
            me,
            session,
            keys,
            sizing,
            count_at_revision,
            counted_create,
            retired,
            run_id,
            leaving: leave_first.as_ref().map(|l| l.version).or(leaving),
            leave_first,
            last,
            since,
            node_index,
            latest_final,
            final_members,
            joinable_segments: None,
            waited_on: None,
            phase: Phase::Start,
            leftovers: Leftovers { keys: Vec::new(), session },
            started,
            timings: RoundTimings::default(),
        }
    }

    /// When this worker first arrived in the run, if it has: what its handler carries over to
    /// its next calls (see [`Call::since`]).
    pub fn arrived(&self) -> Option<Revision> {
        self.since
    }

    /// What this worker writes under its join and waiting keys.
    fn my_joiner(&self) -> super::state::Joiner {
        super::state::Joiner { node_index: self.node_index, ..self.me.joiner(self.last, self.since) }
    }

    /// The latest running round this call waited on as a late arrival or spare, with its
    /// members (to tell a newcomer what changed).
    pub fn waited_on(&self) -> Option<&(u64, std::sync::Arc<[Participant]>)> {
        self.waited_on.as_ref()
    }

    /// What this call wrote that must not outlive it if it fails; the machine forgets it.
    pub fn take_leftovers(&mut self) -> Leftovers {
        let session = self.leftovers.session;
        std::mem::replace(&mut self.leftovers, Leftovers { keys: Vec::new(), session })
    }

    /// The first action: called once, before any input is fed with [`Machine::on`].
    pub fn start(&mut self) -> Action {
        match self.leave_first.take() {
            Some(round) if decide::leave_delay(round.rank).is_zero() => self.end_running_round(round),
            Some(round) => {
                let from = round.final_revision + 1;
                self.phase = Phase::Yielding { round, step: Step::Watching };
                Action::WatchState { from }
            }
            None => self.read_state(Reread::Start),
        }
    }

    /// Feeds the answer to the last action (observed at `now`); returns the next action. A
    /// failed action is handled whatever the phase (a failed leave drops its key first, …);
    /// anything else goes to the handler of the phase that asked for it.
    pub fn on(&mut self, input: Input, now: Instant) -> Action {
        if let Input::Failed(error) = input {
            return self.failed(error);
        }
        let name = self.phase_name();
        let doing = self.doing();
        let handled = match std::mem::replace(&mut self.phase, Phase::Over { doing }) {
            // `start` gives the first action, and nothing follows the last.
            Phase::Start | Phase::Over { .. } => Err(input),
            Phase::Init { after } => self.on_init(after, input),
            Phase::AwaitChange(step) => self.on_await_change(step, input),
            Phase::Member { observed, version, rank, world_size, .. } => {
                self.on_member(observed, version, rank, world_size, input, now)
            }
            Phase::Predecessor { observed, step, after } => self.on_predecessor(observed, step, after, input),
            Phase::Release => self.on_release(input),
            Phase::Backoff => self.on_backoff(input),
            Phase::Claim { purpose, .. } => self.on_claim(purpose, input),
            Phase::Counter { setup_revision, purpose, step } => {
                self.on_counter(setup_revision, purpose, step, input)
            }
            Phase::Open { version, previous, .. } => self.on_open(version, previous, input),
            Phase::Join { round, step } => self.on_join(round, step, input, now),
            Phase::Confirm { round, step } => self.on_confirm(round, step, input, now),
            Phase::Late { version, world_size, observed, step } => {
                self.on_late(version, world_size, observed, step, input)
            }
            Phase::Yielding { round, step } => self.on_yielding(round, step, input, now),
            Phase::Dropping { error } => self.on_dropping(error, input),
        };
        handled.unwrap_or_else(|input| self.unexpected(name, input))
    }

    /// Counts the keys under `prefix` that came before or with mine (created at `mine`): as
    /// of that revision where the backend can read the past cheaply (etcd), else the live
    /// keys created up to it; and whether it is the former. Either way, in a burst of
    /// creations each count is taken by exactly one worker; deaths can repeat or skip a
    /// count, which the swaps and the backup timers absorb.
    fn count_up_to(&self, prefix: Vec<u8>, mine: Revision) -> (Action, bool) {
        if self.count_at_revision {
            (Action::CountAtRevision { prefix, revision: mine }, true)
        } else {
            (Action::Count { prefix, created_up_to: Some(mine) }, false)
        }
    }

    /// Creates `key` (this worker's descriptor, under its session), or finds it already ours
    /// (an earlier step wrote it and lost the answer); see [`decide::own_key`].
    fn put_own(&self, key: Vec<u8>) -> Action {
        Action::Put { key, value: self.me.to_bytes(), mode: PutMode::Create, bind: Bind::Session }
    }

    fn done(&mut self, mut done: Completed, now: Instant) -> Action {
        self.timings.completed = now - self.started;
        done.timings = self.timings;
        self.phase = Phase::Over { doing: self.doing() };
        Action::Done(done)
    }

    fn fail(&mut self, error: RendezvousError) -> Action {
        self.phase = Phase::Over { doing: self.doing() };
        Action::Fail(error)
    }

    /// A failed action: a failed leave first drops this worker's keep-alive key (so the
    /// others notice even if the round cannot be ended now), and then the leave's error
    /// decides, whether that delete worked or not; a failed count at a past revision is taken
    /// again from the live keys (that revision may have been compacted away, and the live
    /// count is as good); a failed delete of a round frozen with a gone predecessor is
    /// followed by a read of the state, which tells whether the round is still there;
    /// anything else goes to [`Machine::classify`].
    fn failed(&mut self, error: RendezvousError) -> Action {
        let doing = self.doing();
        match std::mem::replace(&mut self.phase, Phase::Over { doing }) {
            Phase::Claim { drop_on_failure: Some(key), .. } => {
                self.phase = Phase::Dropping { error };
                Action::Delete { key, mode: DeleteMode::Any }
            }
            Phase::Dropping { error: leave } => {
                tracing::debug!(%error, "could not delete this worker's keep-alive key");
                self.classify(leave)
            }
            Phase::Predecessor { step: PredecessorStep::Ending, after, .. } => {
                tracing::debug!(%error, "could not end the round frozen with a gone predecessor");
                self.read_state(after)
            }
            Phase::Join { round, step: JoinStep::Counting { mine, at_revision: true } } => {
                tracing::debug!(%error, "could not count the join keys at a past revision; counting the live ones");
                self.phase = Phase::Join { round, step: JoinStep::Counting { mine, at_revision: false } };
                Action::Count { prefix: self.keys.joins(round.version), created_up_to: Some(mine) }
            }
            Phase::Confirm { round, step: ConfirmStep::Counting { mine, at_revision: true } } => {
                tracing::debug!(%error, "could not count the keep-alive keys at a past revision; counting the live ones");
                let prefix = self.keys.ranks(round.version);
                self.phase =
                    Phase::Confirm { round, step: ConfirmStep::Counting { mine, at_revision: false } };
                Action::Count { prefix, created_up_to: Some(mine) }
            }
            _ => self.classify(error),
        }
    }

    /// Retryable errors ([`RendezvousError::is_retryable`]) and those that say the round
    /// moved on start over from Init after a backoff (the caller's deadline bounds it all);
    /// the loss of this worker's session ends the call with `LeaseLost` (the caller starts a
    /// new session); anything else ends the call.
    fn classify(&mut self, error: RendezvousError) -> Action {
        match error {
            RendezvousError::Backend(KvError::LeaseNotFound(lease)) if lease == self.session => {
                self.fail(RendezvousError::LeaseLost)
            }
            // The round moved on: a short-lived lease (a `frozen` value's, or the run lease)
            // expired between its grant and its use, or the history a watch needed is gone.
            error
                if error.is_retryable()
                    || matches!(
                        error,
                        RendezvousError::Backend(KvError::Compacted { .. } | KvError::LeaseNotFound(_))
                    ) =>
            {
                tracing::debug!(error = %error, "starting over");
                self.phase = Phase::Backoff;
                Action::Backoff
            }
            error => self.fail(error),
        }
    }

    /// Start over from the value that beat a write (absent: deleted meanwhile).
    fn restart_from(&mut self, current: Option<KeyValue>) -> Action {
        if current.as_ref().is_some_and(|kv| State::names_pieces(&kv.value)) {
            // Its member list is in pieces: the executor reads them with the state.
            return self.read_state(Reread::Start);
        }
        match Observed::from_kv(current, None) {
            Ok(observed) => self.decide(observed, Reread::Start),
            Err(e) => self.fail(e),
        }
    }

    /// Phase 1 (again), because of `after`.
    fn read_state(&mut self, after: Reread) -> Action {
        self.phase = Phase::Init { after };
        Action::ReadState
    }

    /// The run is closed, as `state` says (with how it ended, if it says so).
    fn closed(&self, state: Option<&State>) -> RendezvousError {
        let outcome = match state {
            Some(State::Closed { outcome }) => *outcome,
            _ => None,
        };
        RendezvousError::Closed { run_id: self.run_id.clone(), outcome }
    }

    /// An input that phase `phase` never asked for: a bug of the executor.
    fn unexpected(&mut self, phase: &str, input: Input) -> Action {
        self.fail(RendezvousError::Internal(format!("the protocol got {input:?} in phase `{phase}`")))
    }
}

fn vanished() -> RendezvousError {
    RendezvousError::Raced("a key vanished while it was being created".into())
}
