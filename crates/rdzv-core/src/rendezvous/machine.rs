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

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{KvError, RendezvousError};
use crate::kv::{
    CountedCreate, DeleteMode, DeleteOutcome, EventKind, KeyValue, LeaseId, PutMode, PutOutcome, Revision,
};

use super::decide::{
    self, Candidate, ConfirmAction, FreezeAction, InitAction, JoinRole, JoinedAction, Sizing, Trigger,
    Viewer, WaitingAction,
};
use super::keys::RunKeys;
use super::state::{LastRound, Participant, State};

/// How long a `frozen` state lives if confirmation stalls (the reference's 10 s).
pub(crate) const FROZEN_TTL: Duration = Duration::from_secs(10);

/// The state key as seen at a revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The state (`None`: no round exists).
    pub state: Option<State>,
    /// `mod_revision` of the state key (0 when absent).
    pub mod_revision: Revision,
    /// The store revision at which this was seen: watch from here + 1 to miss nothing.
    pub seen: Revision,
    /// The lease the state key is bound to (for `setup`: its writer's session; for `final`:
    /// the run lease).
    pub lease: Option<LeaseId>,
}

impl Observed {
    /// The state key read (or written) as `kv`, seen at `seen` (default: its mod revision).
    pub fn from_kv(kv: Option<KeyValue>, seen: Option<Revision>) -> Result<Observed, RendezvousError> {
        match kv {
            None => Ok(Observed::absent(seen.unwrap_or(0))),
            Some(kv) => Ok(Observed {
                state: Some(State::parse(&kv.key, &kv.value)?),
                mod_revision: kv.mod_revision,
                seen: seen.unwrap_or(kv.mod_revision),
                lease: kv.lease,
            }),
        }
    }

    /// No state key, as of `seen`.
    pub fn absent(seen: Revision) -> Observed {
        Observed { state: None, mod_revision: 0, seen, lease: None }
    }
}

/// The tally of a round's join keys (see [`Action::CreateCounted`]).
const TALLY_JOINS: &str = "joins";
/// The tally of a round's keep-alive keys.
const TALLY_CONFIRMS: &str = "confirms";

/// Which lease a write is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// This worker's session: the key goes when the worker does.
    Session,
    /// The run lease: the key lives as long as the run.
    RunLease,
    /// A fresh lease of this TTL (the `frozen` value's).
    Fresh(Duration),
}

/// What the executor must do next.
#[derive(Debug)]
pub enum Action {
    /// Read the state key → [`Input::State`].
    ReadState,
    /// Watch the state key from revision `from` (replacing any earlier state watch) →
    /// [`Input::Ack`].
    WatchState {
        /// First revision to deliver.
        from: Revision,
    },
    /// Watch the keys under `prefix` from revision `from` (replacing any earlier prefix
    /// watch) → [`Input::Ack`].
    WatchPrefix {
        /// The prefix.
        prefix: Vec<u8>,
        /// First revision to deliver.
        from: Revision,
    },
    /// Wait for the first of: a change of the state key, an event under the watched prefix
    /// (if `prefix`; without it the prefix watch is closed), or `until` (never, with `None`).
    Await {
        /// When to answer [`Input::Timer`].
        until: Option<Instant>,
        /// Whether to listen to the prefix watch.
        prefix: bool,
    },
    /// Write `value` under `key` → [`Input::Put`].
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The precondition.
        mode: PutMode,
        /// The lease to bind it to.
        bind: Bind,
    },
    /// Create `key` (this worker's descriptor `value`, bound to its session) and count the
    /// creation in the tally under `tally`, bound to `tally_lease`
    /// ([`Kv::create_counted`](crate::Kv::create_counted), asked only of a backend with that
    /// capability) → [`Input::Counted`].
    CreateCounted {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The tally's key.
        tally: Vec<u8>,
        /// The tally's lease.
        tally_lease: Option<LeaseId>,
    },
    /// Count the keys under `prefix` as they were at `revision`
    /// ([`Kv::count_at_revision`](crate::Kv::count_at_revision), asked only of a backend with
    /// that capability) → [`Input::Count`].
    CountAtRevision {
        /// The prefix.
        prefix: Vec<u8>,
        /// The revision to count at.
        revision: Revision,
    },
    /// Count the live keys under `prefix`, only those created at or before `created_up_to`
    /// if given → [`Input::Count`].
    Count {
        /// The prefix.
        prefix: Vec<u8>,
        /// The latest create revision counted.
        created_up_to: Option<Revision>,
    },
    /// Read every join key under `prefix`, parsed as candidates (descriptor and create
    /// revision) → [`Input::Joiners`].
    ReadJoiners {
        /// The prefix.
        prefix: Vec<u8>,
    },
    /// Read the keep-alive keys under `prefix` (a round's members still alive), parsed as
    /// participants → [`Input::Members`].
    ReadMembers {
        /// The prefix.
        prefix: Vec<u8>,
    },
    /// Read `key` → [`Input::Key`].
    Get {
        /// The key.
        key: Vec<u8>,
    },
    /// Delete `key` under `mode` → [`Input::Deleted`].
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The precondition.
        mode: DeleteMode,
    },
    /// Whether process `pid` runs on this machine → [`Input::Alive`] (`true` when that cannot
    /// be told).
    ProcessAlive {
        /// The process id.
        pid: u32,
    },
    /// Wait until `key` (last seen at revision `after`) is deleted → [`Input::Ack`].
    AwaitDelete {
        /// The key.
        key: Vec<u8>,
        /// The revision it was last seen at.
        after: Revision,
    },
    /// In the background, delete everything of the rounds nobody can be in any more now
    /// that round `version` is open after `previous` (see [`crate::rendezvous::forget`];
    /// retried a while, never awaited) → [`Input::Ack`] at once.
    ForgetRounds {
        /// The round just opened.
        version: u64,
        /// The round that was final before it: kept.
        previous: u64,
        /// The run lease the record of the deletes is bound to.
        run_lease: Option<LeaseId>,
    },
    /// Sleep a backoff delay before starting over → [`Input::Timer`].
    Backoff,
    /// The call is over: this round was completed.
    Done(Completed),
    /// The call is over: it failed.
    Fail(RendezvousError),
}

/// What the executor observed, in answer to an [`Action`].
#[derive(Debug)]
pub enum Input {
    /// The state key, read or changed.
    State(Observed),
    /// A key under the watched prefix was created (its first version), updated, or deleted.
    KeyEvent {
        /// Put or delete.
        kind: EventKind,
        /// Whether a put created the key (version 1).
        created: bool,
    },
    /// The timer ran out.
    Timer,
    /// A write's outcome, with the lease it was bound to.
    Put(PutOutcome, Option<LeaseId>),
    /// A count.
    Count(u64),
    /// A counted create's outcome and tally.
    Counted(CountedCreate),
    /// Every joiner of the round, and the read's revision.
    Joiners(Vec<Candidate>, Revision),
    /// The members of a round whose keep-alive keys exist.
    Members(Vec<Participant>),
    /// A key read.
    Key(Option<KeyValue>),
    /// A delete's outcome.
    Deleted(DeleteOutcome),
    /// Whether a process runs.
    Alive(bool),
    /// The action was carried out.
    Ack,
    /// The action failed.
    Failed(RendezvousError),
}

/// A round this worker completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The round.
    pub version: u64,
    /// This worker's rank.
    pub rank: usize,
    /// The members in rank order (shared with the state value it came from).
    pub participants: std::sync::Arc<[Participant]>,
    /// Revision of the `final` state value (to destroy exactly this round, and to watch for
    /// its end from here).
    pub final_revision: Revision,
    /// Watch the members' keep-alive keys for deaths after this revision: the last member's
    /// keep-alive key (`confirmed` in the `final` value), or, from an older writer, this
    /// worker's own. The last confirmer saw every keep-alive key alive as of its own, so this
    /// misses no death, even one just before `final`; and as every keep-alive key was created
    /// by then, the watch replays no creations (N monitors replaying N creations each would
    /// cost O(N²) events per round).
    pub members_from: Revision,
    /// The run lease the `final` value is bound to, for this worker to help keep alive.
    pub run_lease: Option<LeaseId>,
    /// How long the phases took.
    pub timings: RoundTimings,
}

/// How long the phases of a completed `next_rendezvous` took, from the call's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTimings {
    /// Until this worker's join key was written (in the round it completed).
    pub joined: Duration,
    /// Until the round was frozen with this worker in it.
    pub frozen: Duration,
    /// Until the round was final: the whole call.
    pub completed: Duration,
}

/// The round a call leaves before anything else (its worker's running round).
#[derive(Clone, Debug)]
pub struct Leaving {
    /// The round.
    pub version: u64,
    /// This worker's rank in it.
    pub rank: usize,
    /// The revision of its `final` value.
    pub final_revision: Revision,
}

/// Keys a call writes for itself that must not outlive a failed call: a join key (it would
/// be frozen into a round as a ghost), a waiting key (it would count in
/// `num_nodes_waiting`), and a `setup` value (every other worker waits for it to turn
/// `joinable`). Each is registered *before* it is written, since a write whose answer was
/// lost may have happened; on failure each is deleted if it is still bound to this call's
/// session (so that a key another process holds is never touched). All are bound to the
/// session, so they also vanish with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Keys to delete, if bound to `session`.
    pub keys: Vec<Vec<u8>>,
    /// The session they are bound to.
    pub session: LeaseId,
}

impl Leftovers {
    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn add(&mut self, key: &[u8]) {
        if !self.keys.iter().any(|k| k == key) {
            self.keys.push(key.to_vec());
        }
    }

    fn remove(&mut self, key: &[u8]) {
        self.keys.retain(|k| k != key);
    }
}

/// The phases of docs/PROTOCOL.md, each with what it waits for.
#[derive(Debug)]
enum Phase {
    /// Before the first action.
    Start,
    /// Phase 1, Init: waiting for the state ([`Action::ReadState`]), read because of `after`.
    Init { after: Reread },
    /// Phase 1, Init: someone is creating or freezing a round; waiting for the state to change.
    AwaitChange(Step),
    /// Phase 6, Re-entering: a member not first in rank waits [`decide::leave_delay`] for
    /// another re-entering member to end `round` before it ends the round itself.
    Yielding { round: Leaving, step: Step },
    /// Phase 1, Creating a round (or, in phases 5 and 6, ending a running one): `setup` written under `mode`.
    Claim {
        /// Why.
        purpose: Purpose,
        /// On failure, delete this keep-alive key (leaving: so the others notice anyway).
        drop_on_failure: Option<Vec<u8>>,
    },
    /// Phase 1, Creating a round: the version counter is being bumped by compare-and-swap,
    /// then `setup` (at `setup_revision`) becomes `joinable`.
    Counter { setup_revision: Revision, purpose: Purpose, step: CounterStep },
    /// Phase 1, Creating a round: `setup` → `joinable{version, previous}`.
    Open { version: u64, previous: Option<u64>, purpose: Purpose },
    /// Phase 2, Join.
    Join { round: Joining, step: JoinStep },
    /// Phase 3, Confirm.
    Confirm { round: Frozen, step: ConfirmStep },
    /// Phase 1, Init found `final{N}` listing me: is my keep-alive key still mine?
    /// (`after`: as in the [`Phase::Init`] before.)
    Member { observed: Observed, version: u64, rank: usize, world_size: usize, after: Reread },
    /// Phase 5, Late arrival: waiting for the running round `version` (as `observed`) to end.
    Late { version: u64, world_size: usize, observed: Observed, step: LateStep },
    /// Another live process holds a key of mine: waiting for it to go.
    Release,
    /// Phase 1, Init found `frozen{N}` with an earlier process of mine in it (as `observed`):
    /// is that process still there? If not, the round is ended (deleted by revision).
    /// (`after`: as in the [`Phase::Init`] before.)
    Predecessor { observed: Observed, step: PredecessorStep, after: Reread },
    /// Phase 6, a failed leave: deleting my keep-alive key so that the others notice
    /// anyway, before handling `error`.
    Dropping { error: RendezvousError },
    /// After a retryable failure: sleeping before starting over.
    Backoff,
    /// The call is over, or the machine is between two phases; `doing` is what the worker
    /// was doing then.
    Over { doing: &'static str },
}

/// Why a call reads the state (again), and so what its worker is doing until it acts on it.
#[derive(Clone, Copy, Debug)]
enum Reread {
    /// The call starts, or starts over from a state it was handed (by a watch, or by a
    /// write's conflict).
    Start,
    /// After a backend error and a backoff.
    Retry,
    /// Another live process with this worker's node id let go of the key it held.
    Released,
    /// The running round the worker waited behind (as a spare if `spare`) changed.
    WaitedBehind { spare: bool },
}

/// Why a worker writes `setup` and opens a round.
#[derive(Clone, Copy, Debug)]
enum Purpose {
    /// No round exists (yet, or any more).
    Create,
    /// Its worker leaves the round it is a member of.
    Leave,
    /// A member of the running round it waits behind (as a spare if `spare`) is gone.
    End { spare: bool },
}

/// The round a worker joins.
#[derive(Clone, Copy, Debug)]
struct Joining {
    version: u64,
    /// The round that was final before it, if known.
    previous: Option<u64>,
    /// The revision of its `joinable` value.
    state_revision: Revision,
    /// The lease of its `joinable` value (the run lease), which the join tally is bound to.
    lease: Option<LeaseId>,
    /// Whether the round is full but waits for survivors of the round before it.
    awaiting_survivors: bool,
}

/// Bumping the version counter: read it, then write its next value unless it changed.
#[derive(Clone, Copy, Debug)]
enum CounterStep {
    Reading,
    Writing { version: u64 },
}

/// A two-step wait: open the watch, then wait.
#[derive(Clone, Copy, Debug)]
enum Step {
    Watching,
    Waiting,
}

#[derive(Debug)]
enum JoinStep {
    /// The old rounds' deletes handed to the background; then the state watch is opened.
    Forgetting,
    /// Opening the state watch (before the write: a watch from a future revision streams
    /// live, one opened after the write would start in the past).
    Watching,
    /// Creating the join key.
    Writing,
    /// Ending my join key held by a session I gave up, to write it again.
    Reclaiming,
    /// Counting my position: the join keys created up to mine, at its revision if
    /// `at_revision`.
    Counting { mine: Revision, at_revision: bool },
    /// Waiting for the state to change, the freeze timer (and what it triggers), or the
    /// join count.
    Waiting { freeze_at: Option<(Instant, Trigger)>, joiners: Option<u64> },
    /// Reading every joiner, to freeze.
    Reading { trigger: Trigger },
    /// Reading which members of the round before are alive, to freeze a full round.
    ReadingMembers { candidates: Vec<Candidate>, revision: Revision },
    /// Too few to freeze: opening a watch of the join keys.
    WatchingJoiners { count: u64 },
    /// Swapping `joinable` → `frozen`.
    Freezing,
}

/// A frozen round this worker is a member of.
#[derive(Clone, Debug)]
struct Frozen {
    version: u64,
    rank: usize,
    participants: std::sync::Arc<[Participant]>,
    frozen_revision: Revision,
}

impl Frozen {
    /// The round, completed by the `final` value at `final_revision` (timings are filled
    /// in by [`Machine::done`]).
    fn completed(
        self,
        final_revision: Revision,
        members_from: Revision,
        run_lease: Option<LeaseId>,
    ) -> Completed {
        Completed {
            version: self.version,
            rank: self.rank,
            participants: self.participants,
            final_revision,
            members_from,
            run_lease,
            timings: RoundTimings::default(),
        }
    }
}

#[derive(Clone, Debug)]
enum ConfirmStep {
    /// Resuming: opening the state watch first.
    Watching,
    /// Creating the keep-alive key.
    Writing,
    /// Ending my keep-alive key held by a session I gave up, to write it again.
    Reclaiming,
    /// Counting the keep-alive keys created up to mine, at its revision if `at_revision`.
    Counting { mine: Revision, at_revision: bool },
    /// The last to confirm: swapping `frozen` → `final`.
    Finalizing { mine: Revision },
    /// Waiting for `final`.
    Waiting { mine: Revision },
    /// Another process with my node id holds my rank: waiting for the state to change.
    Taken,
}

#[derive(Clone, Copy, Debug)]
enum PredecessorStep {
    /// Asking whether the earlier process runs.
    Asking,
    /// Deleting the round it stalls.
    Ending,
}

#[derive(Clone, Copy, Debug)]
enum LateStep {
    WatchingState,
    WatchingMembers,
    Registering,
    Counting,
    Waiting,
}

/// Who makes a `next_rendezvous` call, and what its handler carries over from earlier calls:
/// everything [`Machine::new`] needs.
#[derive(Clone, Debug)]
pub struct Call {
    /// This worker, with the port it offers in this call.
    pub me: Participant,
    /// Its session lease.
    pub session: LeaseId,
    /// The run's keys.
    pub keys: RunKeys,
    /// The round's sizing.
    pub sizing: Sizing,
    /// Whether the backend counts keys as they were at a past revision
    /// ([`Capabilities::count_at_revision`](crate::kv::Capabilities::count_at_revision)).
    pub count_at_revision: bool,
    /// Whether the backend creates a key and counts it in a tally in one step
    /// ([`Capabilities::counted_create`](crate::kv::Capabilities::counted_create)): then a
    /// worker's position is its tally, and nobody counts the others' keys.
    pub counted_create: bool,
    /// The sessions this worker gave up (lost, or abandoned), which may still hold its keys
    /// on the server: such a key is ended and written again, not waited for.
    pub retired: Vec<LeaseId>,
    /// The run id (for errors).
    pub run_id: String,
    /// When the call started (the round's timings count from here).
    pub started: Instant,
    /// The round this call leaves first, if this worker is a member of a running one.
    pub leave_first: Option<Leaving>,
    /// A round this call must never hand back (the round it left, also after a restart with a
    /// new session).
    pub leaving: Option<u64>,
    /// The last round this worker was a member of, and its rank there.
    pub last: Option<LastRound>,
    /// When this worker first arrived in the run (the create revision of its first join or
    /// waiting key), if it has.
    pub since: Option<Revision>,
}

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
    /// The latest round this call saw final: a round it opens names it as `previous`.
    latest_final: Option<u64>,
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
        } = call;
        let latest_final =
            leave_first.as_ref().map(|l| l.version).into_iter().chain(last.map(|l| l.version)).max();
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
            latest_final,
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

    /// The latest running round this call waited on as a late arrival or spare, with its
    /// members (to tell a newcomer what changed).
    pub fn waited_on(&self) -> Option<&(u64, std::sync::Arc<[Participant]>)> {
        self.waited_on.as_ref()
    }

    /// Whether the worker now waits as a *spare*: behind a running round of `max` members, which
    /// admits nobody until one of them is gone. The call's deadline does not run meanwhile.
    pub fn is_spare(&self) -> bool {
        matches!(&self.phase, Phase::Late { world_size, step: LateStep::Waiting, .. } if *world_size >= self.sizing.max)
    }

    /// Whether the worker is retrying after a backend error (backing off, or reading the state
    /// again): neither admitted nor moved on, so a spare that retries is still a spare for its
    /// deadline (`deadline.rs`).
    pub fn is_retrying(&self) -> bool {
        match &self.phase {
            Phase::Backoff => true,
            Phase::Init { after } | Phase::Member { after, .. } | Phase::Predecessor { after, .. } => {
                matches!(after, Reread::Retry)
            }
            _ => false,
        }
    }

    /// What the worker is doing, in words (for a timeout error), as its phase says. The
    /// reads of phase 1 (the state, its keep-alive key, whether a process runs) say what led
    /// to them: the start, a retry, or the wait that ended.
    pub fn doing(&self) -> &'static str {
        const LEAVING: &str = "leaving the previous round";
        const CREATING: &str = "creating a round";
        const RELEASE: &str = "waiting for another live worker with the same node id to go away (give each worker its own node id)";
        match &self.phase {
            Phase::Start => "starting",
            Phase::Init { after } | Phase::Member { after, .. } | Phase::Predecessor { after, .. } => {
                match after {
                    Reread::Start => "starting",
                    Reread::Retry => "retrying after a backend error",
                    Reread::Released => RELEASE,
                    Reread::WaitedBehind { spare } => waiting_behind(*spare),
                }
            }
            Phase::Backoff => "retrying after a backend error",
            Phase::Yielding { .. } => LEAVING,
            Phase::AwaitChange(_) => "waiting for another worker to finish setting up or freezing a round",
            Phase::Claim { purpose, .. } | Phase::Counter { purpose, .. } | Phase::Open { purpose, .. } => {
                match purpose {
                    Purpose::Create => CREATING,
                    Purpose::Leave => LEAVING,
                    Purpose::End { spare } => waiting_behind(*spare),
                }
            }
            Phase::Join { round, step } => match step {
                JoinStep::Forgetting
                | JoinStep::Watching
                | JoinStep::Writing
                | JoinStep::Reclaiming
                | JoinStep::Counting { .. } => "joining",
                _ if round.awaiting_survivors => "waiting for the members of the previous round to join",
                _ => "waiting for enough workers to join",
            },
            Phase::Confirm { step: ConfirmStep::Waiting { .. }, .. } => "waiting for every member to confirm",
            Phase::Confirm { step: ConfirmStep::Taken, .. } => {
                "waiting for a round that another process with this node id holds"
            }
            Phase::Confirm { .. } => "confirming membership",
            Phase::Late { world_size, .. } => waiting_behind(*world_size >= self.sizing.max),
            Phase::Release => RELEASE,
            Phase::Dropping { .. } => LEAVING,
            Phase::Over { doing } => doing,
        }
    }

    /// The name of the current phase (for tracing).
    pub fn phase_name(&self) -> &'static str {
        match &self.phase {
            Phase::Start | Phase::Init { .. } | Phase::AwaitChange(_) => "init",
            Phase::Claim { .. } | Phase::Counter { .. } | Phase::Open { .. } => "create",
            Phase::Join { .. } => "join",
            Phase::Confirm { .. } => "confirm",
            Phase::Member { .. } => "resume",
            Phase::Late { .. } => "late",
            Phase::Release => "release",
            Phase::Predecessor { .. } => "init",
            Phase::Dropping { .. } | Phase::Yielding { .. } => "leave",
            Phase::Backoff => "backoff",
            Phase::Over { .. } => "over",
        }
    }

    /// The round the current phase is about, if any (for tracing).
    pub fn version(&self) -> Option<u64> {
        match &self.phase {
            Phase::Open { version, .. } | Phase::Member { version, .. } | Phase::Late { version, .. } => {
                Some(*version)
            }
            Phase::Join { round, .. } => Some(round.version),
            Phase::Confirm { round, .. } => Some(round.version),
            _ => None,
        }
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

    /// Leaves this worker's running round by ending it: the swap of its `final` value to
    /// `setup` (on failure, its keep-alive key is dropped so that the others notice anyway).
    fn end_running_round(&mut self, round: Leaving) -> Action {
        tracing::debug!(version = round.version, "leaving the running round");
        self.claim(
            Purpose::Leave,
            PutMode::Update(round.final_revision),
            Some(self.keys.rank(round.version, round.rank)),
        )
    }

    /// Feeds the answer to the last action (observed at `now`); returns the next action.
    pub fn on(&mut self, input: Input, now: Instant) -> Action {
        if let Input::Failed(error) = input {
            return self.failed(error);
        }
        let doing = self.doing();
        match std::mem::replace(&mut self.phase, Phase::Over { doing }) {
            // `start` gives the first action: an input before it is a bug of the executor.
            Phase::Start => self.unexpected(input),
            Phase::Init { after } => match input {
                Input::State(observed) => self.decide(observed, after),
                other => self.unexpected(other),
            },
            Phase::AwaitChange(step) => match (step, input) {
                (Step::Watching, Input::Ack) => {
                    self.phase = Phase::AwaitChange(Step::Waiting);
                    Action::Await { until: None, prefix: false }
                }
                (Step::Waiting, Input::State(seen)) => self.decide(seen, Reread::Start),
                (_, other) => self.unexpected(other),
            },
            Phase::Yielding { round, step } => match (step, input) {
                (Step::Watching, Input::Ack) => {
                    let until = now + decide::leave_delay(round.rank);
                    self.phase = Phase::Yielding { round, step: Step::Waiting };
                    Action::Await { until: Some(until), prefix: false }
                }
                (Step::Waiting, Input::Timer) => self.end_running_round(round),
                // Another member ended the round (or the run closed): act on what it is now,
                // as a call that never held the round (`leaving` keeps it from being handed back).
                (Step::Waiting, Input::State(seen)) => {
                    tracing::debug!(version = round.version, "another member ended the running round first");
                    self.decide(seen, Reread::Start)
                }
                (step, other) => {
                    self.phase = Phase::Yielding { round, step };
                    self.unexpected(other)
                }
            },
            Phase::Claim { purpose, drop_on_failure } => match input {
                Input::Put(PutOutcome::Written { revision, .. }, _) => self.open_round(revision, purpose),
                Input::Put(PutOutcome::Conflict { current }, _) => {
                    self.leftovers.remove(&self.keys.state());
                    self.restart_from(current)
                }
                other => {
                    self.phase = Phase::Claim { purpose, drop_on_failure };
                    self.unexpected(other)
                }
            },
            Phase::Counter { setup_revision, purpose, step } => match (step, input) {
                (CounterStep::Reading, Input::Key(current)) => {
                    self.bump_counter(setup_revision, purpose, current)
                }
                (CounterStep::Writing { version }, Input::Put(PutOutcome::Written { .. }, _)) => {
                    // A lost answer leaves the version counter bumped: resuming bumps it
                    // again, and that version is skipped, which is harmless (versions only
                    // need to grow).
                    let previous = self.latest_final;
                    self.phase = Phase::Open { version, previous, purpose };
                    Action::Put {
                        key: self.keys.state(),
                        value: State::Joinable { version, previous }.to_bytes(),
                        mode: PutMode::Update(setup_revision),
                        bind: Bind::RunLease,
                    }
                }
                // Someone bumped it since the read (a creator whose `setup` has gone since): bump
                // the value it wrote.
                (CounterStep::Writing { .. }, Input::Put(PutOutcome::Conflict { current }, _)) => {
                    self.bump_counter(setup_revision, purpose, current)
                }
                (step, other) => {
                    self.phase = Phase::Counter { setup_revision, purpose, step };
                    self.unexpected(other)
                }
            },
            Phase::Open { version, previous, purpose: _ } => match input {
                Input::Put(PutOutcome::Written { revision, .. }, lease) => {
                    self.leftovers.remove(&self.keys.state());
                    tracing::debug!(version, ?previous, "created a round");
                    // The creator deletes the rounds nobody can be in any more (`forget.rs`,
                    // in the background), then joins. Not knowing the round before, it
                    // cannot tell which of the old rounds the survivors come from.
                    let Some(kept) = previous.filter(|p| *p < version) else {
                        return self.join(version, previous, revision, lease, revision);
                    };
                    {
                        let round = Joining {
                            version,
                            previous,
                            state_revision: revision,
                            lease,
                            awaiting_survivors: false,
                        };
                        self.phase = Phase::Join { round, step: JoinStep::Forgetting };
                        Action::ForgetRounds { version, previous: kept, run_lease: lease }
                    }
                }
                Input::Put(PutOutcome::Conflict { current }, _) => {
                    self.leftovers.remove(&self.keys.state());
                    self.restart_from(current)
                }
                other => self.unexpected(other),
            },
            Phase::Join { round, step } => self.on_join(round, step, input, now),
            Phase::Confirm { round, step } => self.on_confirm(round, step, input, now),
            Phase::Member { observed, version, rank, world_size, after: _ } => match input {
                Input::Key(key) => match (&observed.state, decide::holds(key.as_ref(), self.session)) {
                    (Some(State::Final { participants, confirmed, .. }), Some(mine)) => {
                        let participants = participants.clone();
                        let members_from = confirmed.unwrap_or(mine);
                        let done = Completed {
                            version,
                            rank,
                            participants,
                            final_revision: observed.mod_revision,
                            members_from,
                            run_lease: observed.lease,
                            timings: RoundTimings::default(),
                        };
                        self.done(done, now)
                    }
                    _ => self.late(version, world_size, observed),
                },
                other => self.unexpected(other),
            },
            Phase::Late { version, world_size, observed, step } => {
                self.on_late(version, world_size, observed, step, input)
            }
            Phase::Release => match input {
                Input::Ack => self.read_state(Reread::Released),
                other => self.unexpected(other),
            },
            Phase::Predecessor { observed, step, after } => match (step, input) {
                (PredecessorStep::Asking, Input::Alive(true)) => self.await_change(observed.seen),
                (PredecessorStep::Asking, Input::Alive(false)) => {
                    tracing::info!(
                        node = %self.me.node,
                        "the round froze with an earlier process of this worker, which is gone; ending the round"
                    );
                    let revision = observed.mod_revision;
                    self.phase = Phase::Predecessor { observed, step: PredecessorStep::Ending, after };
                    Action::Delete { key: self.keys.state(), mode: DeleteMode::IfRevision(revision) }
                }
                // Deleted, or changed since: the state read next tells what the round became.
                (PredecessorStep::Ending, Input::Deleted(_)) => self.read_state(after),
                (step, other) => {
                    self.phase = Phase::Predecessor { observed, step, after };
                    self.unexpected(other)
                }
            },
            Phase::Dropping { error } => match input {
                // Deleted or already gone, the leave's own error decides.
                Input::Deleted(_) => self.classify(error),
                other => {
                    self.phase = Phase::Dropping { error };
                    self.unexpected(other)
                }
            },
            Phase::Backoff => match input {
                Input::Timer => self.read_state(Reread::Retry),
                other => self.unexpected(other),
            },
            Phase::Over { .. } => self.unexpected(input),
        }
    }
}

/// What a worker waiting behind a running round is doing, in words: as a spare (behind a
/// full round) or as a late arrival.
fn waiting_behind(spare: bool) -> &'static str {
    if spare {
        "waiting as a spare for a member of the running round to go"
    } else {
        "waiting for the running round to end"
    }
}

impl Machine {
    /// Phase 1: what the state says to do.
    /// `after`: why the call read it (see [`Reread`]; `Start` for a state it was handed).
    fn decide(&mut self, observed: Observed, after: Reread) -> Action {
        if let Some(State::Final { version, .. }) = &observed.state {
            self.latest_final = self.latest_final.max(Some(*version));
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
            InitAction::Join { version, previous } => {
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
    fn await_change(&mut self, seen: Revision) -> Action {
        self.phase = Phase::AwaitChange(Step::Watching);
        Action::WatchState { from: seen + 1 }
    }

    /// Writes `setup` (bound to this worker's session: if it dies now, the value vanishes)
    /// under `mode`: create-if-absent to start the first round, or a swap of the `final`
    /// value to end a running one (the others learn at once, and the winner opens the next
    /// round with no further contention). The winner opens the round; a loser acts on the
    /// value that beat it.
    fn claim(&mut self, purpose: Purpose, mode: PutMode, drop_on_failure: Option<Vec<u8>>) -> Action {
        // Registered before the write: if its answer is lost, the `setup` may exist all the same.
        self.leftovers.add(&self.keys.state());
        self.phase = Phase::Claim { purpose, drop_on_failure };
        Action::Put { key: self.keys.state(), value: State::Setup.to_bytes(), mode, bind: Bind::Session }
    }

    /// Bumps the version counter, then swaps `setup` → `joinable`.
    fn open_round(&mut self, setup_revision: Revision, purpose: Purpose) -> Action {
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

    /// Phase 2: join round `version` (its `joinable` value at `state_revision`), first
    /// watching the state from after `seen`.
    fn join(
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

    fn on_join(&mut self, round: Joining, step: JoinStep, input: Input, now: Instant) -> Action {
        let Joining { version, previous, state_revision, lease, .. } = round;
        let join_key = self.keys.join(version, &self.me.node);
        let stay = |step| Phase::Join { round, step };
        match (step, input) {
            (JoinStep::Forgetting, Input::Ack) => {
                self.join(version, previous, state_revision, lease, state_revision)
            }
            (JoinStep::Watching, Input::Ack) => {
                // Registered before the write: if its answer is lost, the key may exist all
                // the same, and must not be frozen into a round as a ghost.
                self.leftovers.add(&join_key);
                self.phase = stay(JoinStep::Writing);
                let value = self.me.joiner(self.last, self.since).to_bytes();
                if self.counted_create {
                    // The tally is my position: nobody counts the others' keys.
                    let tally = self.keys.tally(version, TALLY_JOINS);
                    Action::CreateCounted { key: join_key, value, tally, tally_lease: lease }
                } else {
                    Action::Put { key: join_key, value, mode: PutMode::Create, bind: Bind::Session }
                }
            }
            (JoinStep::Writing, Input::Put(outcome, _)) => self.joined(round, outcome, None, now),
            (JoinStep::Reclaiming, Input::Deleted(_)) => {
                self.on_join(round, JoinStep::Watching, Input::Ack, now)
            }
            (JoinStep::Writing, Input::Counted(CountedCreate { outcome, tally })) => {
                self.joined(round, outcome, tally, now)
            }
            (JoinStep::Counting { .. }, Input::Count(position)) => self.take_role(round, position, now),
            (JoinStep::Waiting { freeze_at, joiners }, Input::State(seen)) => {
                match decide::on_state_while_joined(seen.state.as_ref(), version, &self.me) {
                    JoinedAction::KeepWaiting => {
                        self.phase = Phase::Join {
                            round: Joining { state_revision: seen.mod_revision, ..round },
                            step: JoinStep::Waiting { freeze_at, joiners },
                        };
                        Action::Await { until: freeze_at.map(|(at, _)| at), prefix: joiners.is_some() }
                    }
                    JoinedAction::Confirm { rank, participants } => {
                        // The round's membership is fixed: the join key is no ghost any more.
                        self.leftovers.remove(&join_key);
                        self.timings.frozen = now - self.started;
                        let frozen =
                            Frozen { version, rank, participants, frozen_revision: seen.mod_revision };
                        self.confirm(frozen)
                    }
                    JoinedAction::Restart => {
                        self.leftovers.remove(&join_key);
                        self.decide(seen, Reread::Start)
                    }
                    JoinedAction::Closed => self.fail(self.closed(seen.state.as_ref())),
                }
            }
            (JoinStep::Waiting { freeze_at, .. }, Input::Timer) => {
                let trigger = freeze_at.map_or(Trigger::Timer, |(_, trigger)| trigger);
                self.phase = stay(JoinStep::Reading { trigger });
                Action::ReadJoiners { prefix: self.keys.joins(version) }
            }
            (JoinStep::Waiting { freeze_at, joiners: Some(count) }, Input::KeyEvent { kind, created }) => {
                let count = match kind {
                    EventKind::Put if created => count + 1,
                    EventKind::Put => count,
                    EventKind::Delete => count.saturating_sub(1),
                };
                match decide::retry_delay(count, &self.sizing) {
                    Some((delay, trigger)) => {
                        let freeze_at = Some((now + delay, trigger));
                        self.phase = stay(JoinStep::Waiting { freeze_at, joiners: None });
                        Action::Await { until: freeze_at.map(|(at, _)| at), prefix: false }
                    }
                    None => {
                        self.phase = stay(JoinStep::Waiting { freeze_at, joiners: Some(count) });
                        Action::Await { until: freeze_at.map(|(at, _)| at), prefix: true }
                    }
                }
            }
            (JoinStep::Reading { trigger }, Input::Joiners(candidates, revision)) => {
                match (trigger, decide::survivor_round(&candidates, previous)) {
                    // A full round waits for the survivors of the round before: read who of
                    // them is alive.
                    (Trigger::Full, Some(before)) => {
                        self.phase = stay(JoinStep::ReadingMembers { candidates, revision });
                        Action::ReadMembers { prefix: self.keys.ranks(before) }
                    }
                    _ => self.freeze(round, candidates, &[], trigger, revision, now),
                }
            }
            (JoinStep::ReadingMembers { candidates, revision }, Input::Members(alive)) => {
                self.freeze(round, candidates, &alive, Trigger::Full, revision, now)
            }
            (JoinStep::WatchingJoiners { count }, Input::Ack) => {
                // Enough for a round but not full (a position of `max` counted a joiner
                // that is gone since): the last call runs from now.
                let freeze_at =
                    decide::retry_delay(count, &self.sizing).map(|(delay, trigger)| (now + delay, trigger));
                self.phase = stay(JoinStep::Waiting { freeze_at, joiners: Some(count) });
                Action::Await { until: freeze_at.map(|(at, _)| at), prefix: true }
            }
            (JoinStep::Freezing, Input::Put(outcome, _)) => {
                // Won or lost, the state watch tells what the round became.
                tracing::debug!(won = outcome.is_written(), "freeze attempted");
                self.phase = stay(JoinStep::Waiting { freeze_at: None, joiners: None });
                Action::Await { until: None, prefix: false }
            }
            (step, other) => {
                self.phase = stay(step);
                self.unexpected(other)
            }
        }
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
                self.failed(vanished())
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
        match decide::freeze(candidates, previous, alive, trigger, &self.sizing) {
            FreezeAction::AwaitJoiners { count } => {
                tracing::debug!(count, "too few joiners to freeze; watching the join keys");
                self.phase = stay(round, JoinStep::WatchingJoiners { count });
                Action::WatchPrefix { prefix: self.keys.joins(version), from: revision + 1 }
            }
            FreezeAction::AwaitSurvivors { missing } => {
                // A survivor that joins later freezes the round itself (it counts a position
                // of `max` or more); the backup timer covers one that never comes.
                tracing::debug!(
                    missing,
                    "the round is full, but survivors of the round before are yet to join"
                );
                let freeze_at = Some((now + self.sizing.backup, Trigger::Timer));
                let round = Joining { awaiting_survivors: true, ..round };
                self.phase = stay(round, JoinStep::Waiting { freeze_at, joiners: None });
                Action::Await { until: freeze_at.map(|(at, _)| at), prefix: false }
            }
            FreezeAction::Freeze(participants) => {
                self.phase = stay(round, JoinStep::Freezing);
                Action::Put {
                    key: self.keys.state(),
                    value: State::Frozen { version, participants: participants.into() }.to_bytes(),
                    mode: PutMode::Update(state_revision),
                    bind: Bind::Fresh(FROZEN_TTL),
                }
            }
        }
    }

    /// Phase 3: confirm membership with a keep-alive key; the worker that sees all of them
    /// swaps `frozen` → `final`.
    fn on_confirm(&mut self, round: Frozen, step: ConfirmStep, input: Input, now: Instant) -> Action {
        match (step, input) {
            (ConfirmStep::Watching, Input::Ack) => self.confirm(round),
            (ConfirmStep::Writing, Input::Counted(CountedCreate { outcome, tally })) => {
                match (decide::own_key(outcome.clone(), self.session, &self.retired), tally) {
                    // Not the last to confirm by the tally: no count needed.
                    (decide::Owned::Mine(mine), Some(tally))
                        if !decide::completes_round(tally, round.participants.len()) =>
                    {
                        self.phase = Phase::Confirm { round, step: ConfirmStep::Waiting { mine } };
                        Action::Await { until: None, prefix: false }
                    }
                    // The last by the tally (or the tally unknown): the count of the live
                    // keep-alive keys decides, so that one whose member died is not final.
                    _ => self.on_confirm(round, ConfirmStep::Writing, Input::Put(outcome, None), now),
                }
            }
            (ConfirmStep::Reclaiming, Input::Deleted(_)) => self.confirm(round),
            (ConfirmStep::Writing, Input::Put(outcome, _)) => {
                match decide::own_key(outcome, self.session, &self.retired) {
                    decide::Owned::Stale(old) => {
                        tracing::debug!("my keep-alive key is held by a session I gave up; ending it");
                        let key = self.keys.rank(round.version, round.rank);
                        self.phase = Phase::Confirm { round, step: ConfirmStep::Reclaiming };
                        Action::Delete { key, mode: DeleteMode::IfRevision(old.mod_revision) }
                    }
                    decide::Owned::Mine(mine) => {
                        // Counting only the keys created up to ours, exactly one member (the last
                        // to confirm) sees them all: one swap attempt per round, not a storm.
                        let (count, at_revision) = self.count_up_to(self.keys.ranks(round.version), mine);
                        self.phase =
                            Phase::Confirm { round, step: ConfirmStep::Counting { mine, at_revision } };
                        count
                    }
                    // Another live process with this node id confirmed this rank: the round is
                    // not ours to take. Wait for it to end.
                    decide::Owned::Taken(_) => {
                        self.phase = Phase::Confirm { round, step: ConfirmStep::Taken };
                        Action::Await { until: None, prefix: false }
                    }
                    decide::Owned::Vanished => {
                        self.phase = Phase::Confirm { round, step: ConfirmStep::Writing };
                        self.failed(vanished())
                    }
                }
            }
            (ConfirmStep::Counting { mine, .. }, Input::Count(confirmed)) => {
                if decide::completes_round(confirmed, round.participants.len()) {
                    // Ours is the last keep-alive key: every member was alive at its revision.
                    let fin = State::Final {
                        version: round.version,
                        participants: round.participants.clone(),
                        confirmed: Some(mine),
                        max_workers: Some(self.sizing.max),
                    };
                    let put = Action::Put {
                        key: self.keys.state(),
                        value: fin.to_bytes(),
                        mode: PutMode::Update(round.frozen_revision),
                        bind: Bind::RunLease,
                    };
                    self.phase = Phase::Confirm { round, step: ConfirmStep::Finalizing { mine } };
                    put
                } else {
                    self.phase = Phase::Confirm { round, step: ConfirmStep::Waiting { mine } };
                    Action::Await { until: None, prefix: false }
                }
            }
            (ConfirmStep::Finalizing { mine }, Input::Put(PutOutcome::Written { revision, .. }, lease)) => {
                self.done(round.completed(revision, mine, lease), now)
            }
            (ConfirmStep::Finalizing { mine }, Input::Put(PutOutcome::Conflict { .. }, _)) => {
                self.phase = Phase::Confirm { round, step: ConfirmStep::Waiting { mine } };
                Action::Await { until: None, prefix: false }
            }
            (ConfirmStep::Waiting { mine }, Input::State(seen)) => {
                match decide::on_state_while_confirming(seen.state.as_ref(), round.version) {
                    ConfirmAction::Done => {
                        let members_from = match &seen.state {
                            Some(State::Final { confirmed: Some(confirmed), .. }) => *confirmed,
                            _ => mine,
                        };
                        self.done(round.completed(seen.mod_revision, members_from, seen.lease), now)
                    }
                    ConfirmAction::KeepWaiting => {
                        self.phase = Phase::Confirm { round, step: ConfirmStep::Waiting { mine } };
                        Action::Await { until: None, prefix: false }
                    }
                    ConfirmAction::Restart => self.decide(seen, Reread::Start),
                    ConfirmAction::Closed => self.fail(self.closed(seen.state.as_ref())),
                }
            }
            (ConfirmStep::Taken, Input::State(seen)) => self.decide(seen, Reread::Start),
            (step, other) => {
                self.phase = Phase::Confirm { round, step };
                self.unexpected(other)
            }
        }
    }

    /// Phase 5: round `version` is running without us. Register as waiting; end the round
    /// when one of its members is gone; start over when the state changes.
    fn late(&mut self, version: u64, world_size: usize, observed: Observed) -> Action {
        if let Some(State::Final { participants, .. }) = &observed.state {
            self.waited_on = Some((version, participants.clone()));
        }
        let from = observed.seen + 1;
        self.phase = Phase::Late { version, world_size, observed, step: LateStep::WatchingState };
        Action::WatchState { from }
    }

    fn on_late(
        &mut self,
        version: u64,
        world_size: usize,
        observed: Observed,
        step: LateStep,
        input: Input,
    ) -> Action {
        let ranks = self.keys.ranks(version);
        let next = |step| Phase::Late { version, world_size, observed: observed.clone(), step };
        match (step, input) {
            (LateStep::WatchingState, Input::Ack) => {
                let from = observed.seen + 1;
                self.phase = next(LateStep::WatchingMembers);
                Action::WatchPrefix { prefix: ranks, from }
            }
            (LateStep::WatchingMembers, Input::Ack) => {
                let key = self.keys.waiter(version, &self.me.node);
                self.leftovers.add(&key);
                self.phase = next(LateStep::Registering);
                let value = self.me.joiner(self.last, self.since).to_bytes();
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
                let action = decide::on_change_while_waiting(
                    seen.state.as_ref(),
                    version,
                    world_size as u64,
                    world_size,
                );
                match action {
                    WaitingAction::Restart => self.decide(seen, Reread::Start),
                    WaitingAction::Closed => self.fail(self.closed(seen.state.as_ref())),
                    action => self.act_late(version, world_size, observed, action),
                }
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
            (step, other) => {
                self.phase = next(step);
                self.unexpected(other)
            }
        }
    }

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

    /// Phase 3: creates my keep-alive key, counted in the round's confirmation tally where
    /// the backend can. The tally is bound to the session of whoever counted last: should
    /// that member die, its keep-alive key goes too and the round can never be final anyway
    /// (the frozen lease ends it), and once final it goes with the member.
    fn confirm(&mut self, round: Frozen) -> Action {
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

    /// Creates `key` (this worker's descriptor, under its session), or finds it already ours
    /// (an earlier step wrote it and lost the answer); see [`decide::own_key`].
    fn put_own(&self, key: Vec<u8>) -> Action {
        Action::Put { key, value: self.me.to_bytes(), mode: PutMode::Create, bind: Bind::Session }
    }

    /// Our key is held by another live process with this node id: wait until it is gone
    /// (its process ended, or its session expired), then start over. If it never goes, the
    /// call's deadline ends the wait with this phase in the error.
    fn await_release(&mut self, key: Vec<u8>, holder: KeyValue) -> Action {
        let other = Participant::parse(&holder.key, &holder.value).ok();
        tracing::warn!(node = %self.me.node, other = ?other, "another live worker uses this node id; waiting for it to go away");
        self.phase = Phase::Release;
        Action::AwaitDelete { key, after: holder.mod_revision }
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

    /// An input the current phase never asked for: a bug of the executor.
    fn unexpected(&mut self, input: Input) -> Action {
        let phase = self.phase_name();
        self.fail(RendezvousError::Internal(format!("the protocol got {input:?} in phase `{phase}`")))
    }
}

fn vanished() -> RendezvousError {
    RendezvousError::Raced("a key vanished while it was being created".into())
}
