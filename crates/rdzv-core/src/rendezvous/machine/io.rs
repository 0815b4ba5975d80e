//! What crosses between the machine and its executor: the actions it asks for, the inputs
//! that answer them, the round a call completes, and what a call starts from.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::RendezvousError;
use crate::kv::{
    CountedCreate, DeleteMode, DeleteOutcome, EventKind, KeyValue, LeaseId, PutMode, PutOutcome, Revision,
};

use super::super::current::Current;
use super::super::decide::{Candidate, Sizing};
use super::super::keys::RunKeys;
use super::super::state::{LastRound, Participant, State};

/// How long a `frozen` state lives if confirmation stalls (the reference's 10 s), for a
/// round of fewer than [`MEMBERS_PER_FROZEN_SECOND`] members.
pub(crate) const FROZEN_TTL: Duration = Duration::from_secs(10);

/// Members for each second a larger round's `frozen` state lives beyond [`FROZEN_TTL`].
/// Every member must see the `frozen` value and write its keep-alive key before the lease
/// runs out, which takes time in proportion to the round: 98,304 members on one Redis took
/// 6–7 s on 2 cores, two thirds of the 10 s; where the client fell behind, the lease ran out
/// first, and every round after it, as large, did the same (rounds re-formed for minutes).
/// That round's lease is 34 s, five times what it took; a round of fewer than 4,096 members
/// still recovers from a stalled confirmation in 10 s.
pub(crate) const MEMBERS_PER_FROZEN_SECOND: usize = 4096;

/// How long the `frozen` state of a round of `members` lives if confirmation stalls.
pub(crate) fn frozen_ttl(members: usize) -> Duration {
    FROZEN_TTL + Duration::from_secs((members / MEMBERS_PER_FROZEN_SECOND) as u64)
}

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
            Some(kv) => Ok(Observed::of(State::parse(&kv.key, &kv.value)?, &kv, seen)),
        }
    }

    /// The state key as [`Current::read`] read it.
    pub fn current(current: Current) -> Observed {
        match current.value {
            None => Observed::absent(current.revision),
            Some((found, state)) => Observed::of(state, &found, Some(current.revision)),
        }
    }

    /// `state`, read from `found`, seen at `seen` (default: its mod revision).
    pub(crate) fn of(state: State, found: &KeyValue, seen: Option<Revision>) -> Observed {
        Observed {
            state: Some(state),
            mod_revision: found.mod_revision,
            seen: seen.unwrap_or(found.mod_revision),
            lease: found.lease,
        }
    }

    /// No state key, as of `seen`.
    pub fn absent(seen: Revision) -> Observed {
        Observed { state: None, mod_revision: 0, seen, lease: None }
    }
}

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
    /// Write the state value `state` under `key` (the state key) → [`Input::Put`]: a
    /// `frozen` or `final` round's value, whose member list goes to pieces written first when
    /// it is longer than `members_inline_bytes` (docs/PROTOCOL.md "How large a round can be").
    PutState {
        /// The key.
        key: Vec<u8>,
        /// The state.
        state: State,
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
    /// that round `version` is open after `previous` (see [`rounds_to_forget`](crate::protocol::rounds_to_forget);
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
    /// Its members, in rank order: the round that follows it carries their segments in its
    /// `joinable` value.
    pub participants: std::sync::Arc<[Participant]>,
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

    pub(super) fn add(&mut self, key: &[u8]) {
        if !self.keys.iter().any(|k| k == key) {
            self.keys.push(key.to_vec());
        }
    }

    pub(super) fn remove(&mut self, key: &[u8]) {
        self.keys.retain(|k| k != key);
    }
}

/// Who makes a `next_rendezvous` call, and what its handler carries over from earlier calls:
/// everything [`Machine::new`](super::Machine::new) needs.
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
    /// Its node's index in the scheduler's order (the `node_index` option), written in its
    /// join and waiting keys.
    pub node_index: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_lease_grows_by_a_second_per_4096_members_beyond_the_reference_10_s() {
        let secs = |members| frozen_ttl(members).as_secs();
        assert_eq!(secs(1), 10);
        assert_eq!(secs(4095), 10);
        assert_eq!(secs(4096), 11);
        assert_eq!(secs(8192), 12);
        assert_eq!(secs(98_304), 34);
    }
}
