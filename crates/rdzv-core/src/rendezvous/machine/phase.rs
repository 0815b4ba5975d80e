//! The phases of docs/PROTOCOL.md as the machine holds them, each with what it waits for,
//! and what the current phase says of the call: its name, what its worker is doing, whether
//! it waits as a spare.

use tokio::time::Instant;

use crate::error::RendezvousError;
use crate::kv::{LeaseId, Revision};

use super::super::decide::{Candidate, Trigger};
use super::super::state::Participant;
use super::{Completed, Leaving, Machine, Observed, RoundTimings};

/// The phases of docs/PROTOCOL.md, each with what it waits for.
#[derive(Debug)]
pub(super) enum Phase {
    /// Before the first action.
    Start,
    /// Phase 1, Init: waiting for the state ([`Action::ReadState`](super::Action::ReadState)), read because of `after`.
    Init { after: Reread },
    /// Phase 1, Init: someone is creating or freezing a round; waiting for the state to change.
    AwaitChange(Step),
    /// Phase 6, Re-entering: a member not first in rank waits [`leave_delay`](super::super::decide::leave_delay) for
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
pub(super) enum Reread {
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
pub(super) enum Purpose {
    /// No round exists (yet, or any more).
    Create,
    /// Its worker leaves the round it is a member of.
    Leave,
    /// A member of the running round it waits behind (as a spare if `spare`) is gone.
    End { spare: bool },
}

/// The round a worker joins.
#[derive(Clone, Copy, Debug)]
pub(super) struct Joining {
    pub(super) version: u64,
    /// The round that was final before it, if known.
    pub(super) previous: Option<u64>,
    /// The revision of its `joinable` value.
    pub(super) state_revision: Revision,
    /// The lease of its `joinable` value (the run lease), which the join tally is bound to.
    pub(super) lease: Option<LeaseId>,
    /// Whether the round is full but waits for survivors of the round before it, or for
    /// workers that waited behind it and come before a newcomer that joined.
    pub(super) awaiting_survivors: bool,
}

/// Bumping the version counter: read it, then write its next value unless it changed.
#[derive(Clone, Copy, Debug)]
pub(super) enum CounterStep {
    Reading,
    Writing { version: u64 },
}

/// A two-step wait: open the watch, then wait.
#[derive(Clone, Copy, Debug)]
pub(super) enum Step {
    Watching,
    Waiting,
}

#[derive(Debug)]
pub(super) enum JoinStep {
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
    /// Reading who waited behind the round before (spares, late arrivals), to freeze a full
    /// round: one that would be admitted ahead of a newcomer that joined is waited for.
    ReadingWaiters { candidates: Vec<Candidate>, revision: Revision, alive: Vec<Participant> },
    /// Too few to freeze (`whole`: too few in complete segments, though enough joiners):
    /// opening a watch of the join keys.
    WatchingJoiners { count: u64, whole: bool },
    /// Swapping `joinable` → `frozen`.
    Freezing,
}

/// A frozen round this worker is a member of.
#[derive(Clone, Debug)]
pub(super) struct Frozen {
    pub(super) version: u64,
    pub(super) rank: usize,
    pub(super) participants: std::sync::Arc<[Participant]>,
    pub(super) frozen_revision: Revision,
}

impl Frozen {
    /// The round, completed by the `final` value at `final_revision` (timings are filled
    /// in by [`Machine::done`]).
    pub(super) fn completed(
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
pub(super) enum ConfirmStep {
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
pub(super) enum PredecessorStep {
    /// Asking whether the earlier process runs.
    Asking,
    /// Deleting the round it stalls.
    Ending,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum LateStep {
    WatchingState,
    WatchingMembers,
    Registering,
    Counting,
    Waiting,
}

/// What the current phase says of the call.
impl Machine {
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
                _ if round.awaiting_survivors => {
                    "waiting for the previous round's members (or its spares first in line) to join"
                }
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
