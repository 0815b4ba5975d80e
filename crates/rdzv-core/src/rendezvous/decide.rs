//! The decision table of the protocol: pure functions from what a worker observed to what it
//! does next. No I/O and no clock here — the executor (`executor.rs`) performs the actions and
//! feeds back what it sees, so these rules can be tested exhaustively and read next to
//! docs/PROTOCOL.md "The phases".

use std::time::Duration;

use super::state::SegmentRuns;
use crate::kv::{KeyValue, LeaseId, PutOutcome, Revision};
use crate::params::RankOrder;

use super::broken::RoundBroken;
use super::lookup;
use super::state::{Joiner, Participant, State};

/// The sizing of a round, from the parameters: everything the freeze decisions depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// The fewest workers a round forms with (`min_workers`).
    pub min: usize,
    /// The most workers a round takes (`max_workers`); those beyond wait as spares.
    pub max: usize,
    /// How long the round stays open for more joiners once `min` are there
    /// (`last_call_timeout`).
    pub last_call: Duration,
    /// How long backups wait behind the worker responsible for freezing, and how long a full
    /// round waits for a survivor of the round before it (the keep-alive TTL: by then a dead
    /// worker's keys have vanished).
    pub backup: Duration,
    /// In which order newcomers take the free ranks (`rank_order`).
    pub order: RankOrder,
    /// Whole-segment admission: rounds of complete segments of this many workers
    /// (`segment_size`; docs/PROTOCOL.md "Whole segments").
    pub segment_size: Option<usize>,
}

impl Sizing {
    /// The sizing the parameters ask for.
    pub fn from_params(params: &crate::params::RendezvousParams) -> Sizing {
        Sizing {
            min: params.min_workers,
            max: params.max_workers,
            last_call: params.last_call_timeout,
            backup: params.keep_alive_ttl,
            order: params.rank_order,
            segment_size: params.segment_size,
        }
    }
}

/// Who is looking at the state, for [`on_state`]: what a worker knows of itself that the
/// state value alone does not say.
#[derive(Clone, Copy, Debug)]
pub struct Viewer<'a> {
    /// This worker: a participant is this worker only if node id, address and process id
    /// all match (another live process may carry the same node id).
    pub me: &'a Participant,
    /// Whether a `setup` value in the state is bound to this worker's session (it wrote it
    /// earlier in this call and then failed, or lost the answer).
    pub setup_is_mine: bool,
    /// The round this call is leaving, if any: it must never be handed back.
    pub leaving: Option<u64>,
}

/// Whether `p` is the worker `me` (not just another process with its node id).
pub fn is_me(p: &Participant, me: &Participant) -> bool {
    p.node == me.node && p.addr == me.addr && p.pid == me.pid
}

/// Whether `p` is an earlier process of the worker `me` on the same machine: its node id and
/// address, another process id (a worker restarted with its old node id).
pub fn is_predecessor(p: &Participant, me: &Participant) -> bool {
    p.node == me.node && p.addr == me.addr && p.pid != me.pid
}

/// What to do after reading the state at the start of an attempt (phase 1, Init).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitAction {
    /// No round exists: try to create one (`setup`, then `joinable`).
    CreateRound,
    /// The `setup` value is this worker's own (an earlier step of this call wrote it and then
    /// failed): finish opening the round from it.
    ResumeSetup,
    /// Round `version` accepts joiners: join it.
    Join {
        /// The round.
        version: u64,
        /// The round that was final before it, if known (its survivors keep their ranks).
        previous: Option<u64>,
        /// The segments of that round's ranks, if known and any.
        segments: Option<SegmentRuns>,
    },
    /// Round `version` is running: wait for the next one as a late arrival.
    AwaitNextRound {
        /// The running round.
        version: u64,
        /// Its world size.
        world_size: usize,
    },
    /// Someone is creating or freezing a round: wait until the state changes.
    AwaitChange,
    /// Round `version` froze with an earlier process of this worker in it (same node id and
    /// address, another process id): if that process is gone from this machine, it will never
    /// confirm, so end the round at once instead of waiting for the frozen lease.
    CheckPredecessor {
        /// The round.
        version: u64,
        /// The earlier process's id.
        pid: u32,
    },
    /// The run is over.
    Closed,
    /// Round `version` froze with this worker in it (it started over after joining, e.g.
    /// on a backend error): confirm, as if it had seen the freeze.
    ResumeConfirm {
        /// The round.
        version: u64,
        /// This worker's rank.
        rank: usize,
    },
    /// Round `version` is final with this worker in it: it is a member if its keep-alive
    /// key is still its own (then the round is its result), else the round is broken.
    ResumeMember {
        /// The round.
        version: u64,
        /// This worker's rank.
        rank: usize,
        /// The round's world size.
        world_size: usize,
    },
    /// Round `version`, which lists this worker, is the one this call is leaving (an
    /// earlier attempt to end it failed): end it again.
    Leave {
        /// The round.
        version: u64,
    },
}

/// Phase 1: what the state value says to do, for `viewer`.
pub fn on_state(state: Option<&State>, viewer: Viewer<'_>) -> InitAction {
    let rank_of = |participants| lookup::rank_of(participants, viewer.me);
    let left = |version: u64| viewer.leaving.is_some_and(|left| version <= left);
    match state {
        None => InitAction::CreateRound,
        Some(State::Closed { .. }) => InitAction::Closed,
        Some(State::Joinable { version, previous, segments }) => {
            InitAction::Join { version: *version, previous: *previous, segments: segments.clone() }
        }
        Some(State::Frozen { version, participants }) => match rank_of(participants) {
            Some(rank) if !left(*version) => InitAction::ResumeConfirm { version: *version, rank },
            Some(_) => InitAction::AwaitChange,
            None => match lookup::predecessor_of(participants, viewer.me) {
                Some(p) => InitAction::CheckPredecessor { version: *version, pid: p.pid },
                None => InitAction::AwaitChange,
            },
        },
        Some(State::Final { version, participants, .. }) => {
            let (version, world_size) = (*version, participants.len());
            match rank_of(participants) {
                Some(_) if left(version) => InitAction::Leave { version },
                Some(rank) => InitAction::ResumeMember { version, rank, world_size },
                None => InitAction::AwaitNextRound { version, world_size },
            }
        }
        Some(State::Setup) if viewer.setup_is_mine => InitAction::ResumeSetup,
        Some(State::Setup) => InitAction::AwaitChange,
    }
}

/// What a joiner does about freezing the round, given its join position (1-based count of
/// join keys created at or before its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinRole {
    /// Position `max` or beyond: the round has as many joiners as it takes; freeze now if
    /// nobody it must wait for is missing ([`freeze`] with [`Trigger::Full`]).
    FreezeIfFull,
    /// Freeze when this timer runs out (the last-call owner, or a backup in case the one
    /// responsible died), unless the state changes first.
    FreezeAfter(Duration),
    /// Nothing to do but wait for the state to change: someone later in the order is
    /// responsible for freezing.
    Wait,
}

/// Phase 2: the joiner's role. Backups wait `sizing.backup` behind the one responsible
/// (the keep-alive TTL: by then a dead worker's join key has vanished).
pub fn join_role(position: u64, sizing: &Sizing) -> JoinRole {
    let (min, max) = (sizing.min as u64, sizing.max as u64);
    let (last_call, backup) = (sizing.last_call, sizing.backup);
    if position >= max {
        JoinRole::FreezeIfFull
    } else if position == min {
        JoinRole::FreezeAfter(last_call)
    } else if position > min {
        JoinRole::FreezeAfter(last_call + backup)
    } else {
        JoinRole::Wait
    }
}

/// A worker found joined to a forming round: its descriptor, and its join key's create
/// revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// What it wrote under its join key.
    pub joiner: Joiner,
    /// The join key's create revision.
    pub created: Revision,
}

impl Candidate {
    /// When it arrived in the run: its first key (join or waiting), else this join key.
    pub fn arrival(&self) -> Revision {
        self.joiner.since.map_or(self.created, |since| since.min(self.created))
    }
}

/// Why a freeze is attempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// `max` workers have joined: freeze at once, unless a member of the round before that is
    /// still alive has not joined yet (it keeps its place over a spare; a backup timer bounds
    /// the wait).
    Full,
    /// A timer ran out (the last call, or a backup): freeze with whoever is there.
    Timer,
}

/// What a freeze attempt does with the candidates it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FreezeAction {
    /// Swap `joinable` → `frozen` with these participants, in rank order.
    Freeze(Vec<Participant>),
    /// Too few live joiners: watch the join keys until [`retry_delay`] says to try again.
    AwaitJoiners {
        /// Live joiners now.
        count: u64,
    },
    /// Enough live joiners, but too few of them in complete segments (`segment_size`): watch
    /// the join keys, and try again when one comes or goes.
    AwaitSegments {
        /// Live joiners now.
        count: u64,
    },
    /// The round is full, but this many members of the round before, still alive, have not
    /// joined yet: wait for them (they keep their ranks) until a backup timer.
    AwaitSurvivors {
        /// How many are missing.
        missing: usize,
    },
}

/// The round whose members are survivors of a forming one: the round that was final before
/// it (`previous`, from the `joinable` value), or a later one that a candidate says it was a
/// member of (a creator may have missed it), or, when `previous` is not known, the latest
/// round any candidate was a member of.
pub fn survivor_round(candidates: &[Candidate], previous: Option<u64>) -> Option<u64> {
    candidates.iter().filter_map(|c| c.joiner.last.map(|l| l.version)).chain(previous).max()
}

/// Phase 2, freeze (docs/PROTOCOL.md "Who is in, and their ranks"). Who is in: every
/// candidate that was a member of the round before (`previous`, see [`survivor_round`]),
/// then the newcomers in order of arrival, up to `max`; at least `min`, else wait. `alive`
/// are the members of the round before whose keep-alive keys still exist: with
/// [`Trigger::Full`], the freeze waits for any of them that has not joined yet.
///
/// Ranks: a survivor keeps its rank while it is below the new world size `W`; the free ranks
/// go to the newcomers first (in arrival order, or by [`RankOrder::Natural`]), then to the
/// survivors whose ranks are `W` or more, lowest first — the only ones that move, and only
/// when the world shrank.
///
/// Segments (by [`RankOrder::Segment`], the default; docs/PROTOCOL.md "Segments"): the
/// newcomers of one segment take consecutive free ranks, segments in the order of their first
/// arrival; and `segments`, those of the round before's ranks, give each free rank the
/// segment of the member that held it: a newcomer of that segment takes it before any other
/// free rank, and is admitted before any other newcomer. With `segment_size`, whole segments
/// only, in blocks (docs/PROTOCOL.md "Whole segments"; the rule is in `whole_segments.rs`).
pub fn freeze(
    candidates: Vec<Candidate>,
    previous: Option<u64>,
    alive: &[Participant],
    trigger: Trigger,
    sizing: &Sizing,
    segments: Option<&SegmentRuns>,
) -> FreezeAction {
    let count = candidates.len() as u64;
    if trigger == Trigger::Full {
        let joined: std::collections::HashSet<(&str, &str, u32)> = candidates
            .iter()
            .map(|c| (c.joiner.node.as_str(), c.joiner.addr.as_str(), c.joiner.pid))
            .collect();
        let missing =
            alive.iter().filter(|m| !joined.contains(&(m.node.as_str(), m.addr.as_str(), m.pid))).count();
        if missing > 0 {
            return FreezeAction::AwaitSurvivors { missing };
        }
        // The position that said "full" counted a joiner that is gone since (positions are
        // counts of creations): not full, so the last call decides.
        if (count as usize) < sizing.max {
            return FreezeAction::AwaitJoiners { count };
        }
    }
    let round = survivor_round(&candidates, previous);
    let (mut survivors, mut newcomers): (Vec<Candidate>, Vec<Candidate>) =
        candidates.into_iter().partition(|c| round.is_some() && c.joiner.last.map(|l| l.version) == round);
    // Ranks of one round are distinct; should two candidates claim one, the second is a
    // newcomer.
    survivors.sort_by_key(|c| (c.joiner.last.map(|l| l.rank), c.created));
    let mut seen = std::collections::BTreeSet::new();
    let (survivors, doubles): (Vec<Candidate>, Vec<Candidate>) =
        survivors.into_iter().partition(|c| seen.insert(c.joiner.last.map(|l| l.rank)));
    newcomers.extend(doubles);
    newcomers.sort_by_key(|c| (c.arrival(), c.created));
    let before = segments.filter(|_| sizing.order.by_segment() && round == previous);
    if let Some(k) = sizing.segment_size {
        return match super::whole_segments::freeze(k, survivors, newcomers, before, sizing) {
            // "Full" counted joiners, not whole segments: a round its whole segments do not
            // fill yet is not full, so the last call decides (and a joiner that completes a
            // segment meanwhile is in).
            Some(participants) if trigger == Trigger::Full && participants.len() < sizing.max => {
                FreezeAction::AwaitJoiners { count }
            }
            Some(participants) => FreezeAction::Freeze(participants),
            None if count as usize >= sizing.min => FreezeAction::AwaitSegments { count },
            None => FreezeAction::AwaitJoiners { count },
        };
    }
    let mut survivors = survivors;
    survivors.truncate(sizing.max);
    let survivors: Vec<(usize, Participant)> = survivors
        .iter()
        .map(|c| (c.joiner.last.map_or(usize::MAX, |l| l.rank), c.joiner.participant()))
        .collect();
    // Segments are followed only where the previous round's are of the round the survivors
    // come from.
    let free = match before {
        Some(segments) => free_segments(segments, &survivors),
        None => Vec::new(),
    };
    let newcomers = admit(newcomers, sizing.max - survivors.len(), &free);
    if survivors.len() + newcomers.len() < sizing.min {
        return FreezeAction::AwaitJoiners { count };
    }
    let newcomers = in_rank_order(
        newcomers.iter().map(|c| (c.joiner.participant(), c.joiner.node_index)).collect(),
        sizing.order,
    );
    FreezeAction::Freeze(assign_ranks(survivors, newcomers, &free))
}

/// Phase 2, freeze of a full round: how many of the `waiters` of the round before (read from
/// their waiting keys, which their sessions hold, so alive) have not joined yet but would be
/// admitted in place of a newcomer that has — the spare that waited longest, or one of a dead
/// member's segment. The freeze waits for them as it waits for survivors (until a backup
/// timer); otherwise whichever spare joins first would take the place.
pub fn waiters_to_await(
    candidates: &[Candidate],
    waiters: Vec<Candidate>,
    previous: Option<u64>,
    sizing: &Sizing,
    segments: Option<&SegmentRuns>,
) -> usize {
    let joined: std::collections::HashSet<&str> = candidates.iter().map(|c| c.joiner.node.as_str()).collect();
    let missing: Vec<Candidate> =
        waiters.into_iter().filter(|w| !joined.contains(w.joiner.node.as_str())).collect();
    if missing.is_empty() {
        return 0;
    }
    let missing_nodes: std::collections::HashSet<String> =
        missing.iter().map(|w| w.joiner.node.clone()).collect();
    let everyone = candidates.iter().cloned().chain(missing).collect();
    match freeze(everyone, previous, &[], Trigger::Timer, sizing, segments) {
        FreezeAction::Freeze(participants) => {
            participants.iter().filter(|p| missing_nodes.contains(&p.node)).count()
        }
        _ => 0,
    }
}

/// The ranks of the round before that no survivor holds, with the segment of the member that
/// held each (those that had one), lowest first.
fn free_segments(segments: &SegmentRuns, survivors: &[(usize, Participant)]) -> Vec<(usize, String)> {
    let held: std::collections::HashSet<usize> = survivors.iter().map(|(rank, _)| *rank).collect();
    (0..segments.world_size())
        .filter(|rank| !held.contains(rank))
        .filter_map(|rank| Some((rank, segments.segment_of(rank)?.to_string())))
        .collect()
}

/// The newcomers (in arrival order) the round admits into `room`: first, for each free rank
/// of a known segment (`free`), the earliest newcomer of that segment not yet taken; then the
/// others in arrival order. Returned in arrival order.
fn admit(newcomers: Vec<Candidate>, room: usize, free: &[(usize, String)]) -> Vec<Candidate> {
    let mut taken = vec![false; newcomers.len()];
    let mut admitted = 0;
    for (_, segment) in free {
        if admitted == room {
            break;
        }
        let of_segment =
            |(i, c): &(usize, &Candidate)| !taken[*i] && c.joiner.segment.as_deref() == Some(segment);
        if let Some((i, _)) = newcomers.iter().enumerate().find(of_segment) {
            taken[i] = true;
            admitted += 1;
        }
    }
    for slot in taken.iter_mut() {
        if admitted == room {
            break;
        }
        if !*slot {
            *slot = true;
            admitted += 1;
        }
    }
    newcomers.into_iter().zip(taken).filter_map(|(c, taken)| taken.then_some(c)).collect()
}

/// The newcomers (given in arrival order, each with its `node_index`) in the order they take
/// free ranks: by `order`. By segment, the newcomers of one segment are kept together,
/// segments in the order of their first arrival; natural, by address then node id (inside
/// each segment, by segment); Slurm, by node index, those without one last.
pub(super) fn in_rank_order(
    mut newcomers: Vec<(Participant, Option<u64>)>,
    order: RankOrder,
) -> Vec<Participant> {
    let natural = |(a, _): &(Participant, Option<u64>), (b, _): &(Participant, Option<u64>)| {
        alphanumeric_sort::compare_str(&a.addr, &b.addr)
            .then_with(|| alphanumeric_sort::compare_str(&a.node, &b.node))
    };
    if order.by_segment() {
        // Arrival order inside a segment, unless natural.
        let groups = super::segment_groups::by_segment(newcomers, |(p, _)| p.segment.as_deref());
        newcomers = groups
            .into_iter()
            .flat_map(|(_, mut members)| {
                if order.natural() {
                    members.sort_by(natural);
                }
                members
            })
            .collect();
    } else if order.natural() {
        newcomers.sort_by(natural);
    } else if order == RankOrder::Slurm {
        // Stable: ties (and workers without an index) in arrival order.
        newcomers.sort_by_key(|(_, index)| (index.is_none(), *index));
    }
    newcomers.into_iter().map(|(p, _)| p).collect()
}

/// The participant list of a round of `survivors` (with their ranks in the round before, in
/// ascending order) and `newcomers` (in the order they take free ranks): see [`freeze`]. A
/// free rank of a known segment (`free`) goes first to the first newcomer of that segment;
/// the other free ranks, lowest first, to the remaining newcomers in order, then to the
/// survivors beyond the new world.
fn assign_ranks(
    survivors: Vec<(usize, Participant)>,
    newcomers: Vec<Participant>,
    free: &[(usize, String)],
) -> Vec<Participant> {
    let world = survivors.len() + newcomers.len();
    let mut slots: Vec<Option<Participant>> = vec![None; world];
    let mut movers = Vec::new();
    for (rank, p) in survivors {
        match slots.get_mut(rank) {
            Some(slot) => *slot = Some(p),
            None => movers.push(p),
        }
    }
    let mut newcomers: Vec<Option<Participant>> = newcomers.into_iter().map(Some).collect();
    for (rank, segment) in free.iter().filter(|(rank, _)| *rank < world) {
        let of_segment =
            newcomers.iter_mut().find(|p| p.as_ref().is_some_and(|p| p.segment.as_ref() == Some(segment)));
        if let Some(newcomer) = of_segment {
            slots[*rank] = newcomer.take();
        }
    }
    let mut fill = newcomers.into_iter().flatten().chain(movers);
    slots.into_iter().map(|slot| slot.or_else(|| fill.next())).collect::<Option<Vec<_>>>().unwrap_or_default()
}

/// When a watched join count reaches `min` again after a failed freeze: how long until the
/// next attempt and what triggers it (at once, as a full round, when `max` are there);
/// `None` while there are too few.
pub fn retry_delay(count: u64, sizing: &Sizing) -> Option<(Duration, Trigger)> {
    if count as usize >= sizing.max {
        Some((Duration::ZERO, Trigger::Full))
    } else if count as usize >= sizing.min {
        Some((sizing.last_call, Trigger::Timer))
    } else {
        None
    }
}

/// How much longer a member re-entering its running round waits, per doubling of its rank,
/// before it ends the round itself (see [`leave_delay`]). Long enough for the first swap to
/// reach the members of the next tiers when each has a client of its own: with 20 ms, 1,024
/// workers on their own clients still made 0.3–0.8 lost swaps per worker
/// (BENCHMARKS.md's history, `git log -p BENCHMARKS.md`).
pub const LEAVE_STAGGER_STEP: Duration = Duration::from_millis(50);

/// How long a member of rank `rank` that re-enters its running round waits for another member
/// to end the round before it ends it itself: nothing for rank 0, then one
/// [`LEAVE_STAGGER_STEP`] more per doubling of the rank (rank 1: one step, ranks 2–3: two,
/// 4–7: three, …, 4,096–8,191: thirteen).
///
/// Why: members often re-enter together (they all saw a member die, or a newcomer waiting),
/// and each would swap `final` → `setup`; one swap wins and every other is a wasted write (a
/// Raft proposal on etcd). Staggered by rank, the number of members that swap before the
/// first swap is seen doubles only once per step, so a swap seen within a few steps saves
/// nearly all the others, while a member that re-enters alone waits a step per doubling of
/// its rank (rank 15: 200 ms; rank 8,191: 650 ms), and rank 0 not at all.
pub fn leave_delay(rank: usize) -> Duration {
    LEAVE_STAGGER_STEP * (usize::BITS - rank.leading_zeros())
}

/// Whether a key this worker creates for itself is its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owned {
    /// Ours, created at this revision.
    Mine(Revision),
    /// Held by another live process (with this node id): never overwritten.
    Taken(KeyValue),
    /// Held by an earlier session of this worker, one it gave up (lost, or abandoned) but that
    /// may still live on the server: end it (delete it by its revision) and write it again,
    /// rather than wait up to a TTL for it to go.
    Stale(KeyValue),
    /// Deleted between the attempt and the answer: try again from the start.
    Vanished,
}

/// Who owns a key after a create-if-absent of it under `session`: written now, or already
/// there under our own session (an earlier step wrote it and lost the answer), is ours; one
/// under a session this worker gave up (`retired`) is stale.
pub fn own_key(outcome: PutOutcome, session: LeaseId, retired: &[LeaseId]) -> Owned {
    match outcome {
        PutOutcome::Written { create_revision, .. } => Owned::Mine(create_revision),
        PutOutcome::Conflict { current: Some(kv) } if kv.lease == Some(session) => {
            Owned::Mine(kv.create_revision)
        }
        PutOutcome::Conflict { current: Some(kv) } if kv.lease.is_some_and(|l| retired.contains(&l)) => {
            Owned::Stale(kv)
        }
        PutOutcome::Conflict { current: Some(kv) } => Owned::Taken(kv),
        PutOutcome::Conflict { current: None } => Owned::Vanished,
    }
}

/// Phase 1, resuming a `final` round that lists me: my keep-alive key (as read) is still
/// mine only if it is bound to my current session; then its create revision.
pub fn holds(key: Option<&KeyValue>, session: LeaseId) -> Option<Revision> {
    key.filter(|kv| kv.lease == Some(session)).map(|kv| kv.create_revision)
}

/// Phase 3: whether the keep-alive keys counted up to mine (`confirmed`) complete a round
/// of `world_size` — then I am the last to confirm and swap `frozen` → `final`.
pub fn completes_round(confirmed: u64, world_size: usize) -> bool {
    confirmed as usize >= world_size
}

/// Phase 1, creating a round: the version counter's next value after `current` (absent: 0),
/// or why the current value is no counter.
pub fn next_version(current: Option<&[u8]>) -> Result<u64, String> {
    let last = match current {
        None => 0,
        Some(value) => match std::str::from_utf8(value).ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(last) => last,
            None => {
                return Err(format!(
                    "the version counter is not a number: {:?}",
                    String::from_utf8_lossy(value)
                ));
            }
        },
    };
    last.checked_add(1).ok_or_else(|| "the version counter cannot grow any more".to_string())
}

/// Phase 4: whether running round `version` is intact in `state` (`None`) or over, and why.
/// `state` is `None` when the state key is absent or unreadable.
pub fn running_round(state: Option<&State>, version: u64) -> Option<RoundBroken> {
    match state {
        Some(State::Final { version: v, .. }) if *v == version => None,
        Some(State::Closed { .. }) => Some(RoundBroken::Closed),
        _ => Some(RoundBroken::Ended),
    }
}

/// What a joiner does when the state of its round changes while it waits (phase 2 → 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinedAction {
    /// The round froze with this worker at `rank`: confirm.
    Confirm {
        /// This worker's rank.
        rank: usize,
        /// All members.
        participants: std::sync::Arc<[Participant]>,
    },
    /// Start over from Init. Also when the round froze without this worker (it came too
    /// late): it will wait for the next round, and its join key in this one is left to its
    /// session lease (harmless: the round's membership is fixed).
    Restart,
    /// The run was closed.
    Closed,
    /// Still the same joinable round (a rewrite of the same value): keep waiting.
    KeepWaiting,
}

/// Phase 2: a joiner `me` of round `version` sees the state become `state`.
pub fn on_state_while_joined(state: Option<&State>, version: u64, me: &Participant) -> JoinedAction {
    match state {
        Some(State::Closed { .. }) => JoinedAction::Closed,
        Some(State::Joinable { version: v, .. }) if *v == version => JoinedAction::KeepWaiting,
        Some(State::Frozen { version: v, participants }) if *v == version => {
            match lookup::rank_of(participants, me) {
                Some(rank) => JoinedAction::Confirm { rank, participants: participants.clone() },
                None => JoinedAction::Restart,
            }
        }
        // Final already (we missed frozen only if we were too slow to see it): a member
        // would have been needed to confirm, so we are not one of this round.
        _ => JoinedAction::Restart,
    }
}

/// What a confirming member does when the state changes (phase 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmAction {
    /// The round is final: done.
    Done,
    /// Still frozen: keep waiting.
    KeepWaiting,
    /// The round fell apart (the frozen lease expired, or it was replaced): start over.
    Restart,
    /// The run was closed.
    Closed,
}

/// Phase 3: a member of frozen round `version` sees the state become `state`.
pub fn on_state_while_confirming(state: Option<&State>, version: u64) -> ConfirmAction {
    match state {
        Some(State::Final { version: v, .. }) if *v == version => ConfirmAction::Done,
        Some(State::Frozen { version: v, .. }) if *v == version => ConfirmAction::KeepWaiting,
        Some(State::Closed { .. }) => ConfirmAction::Closed,
        _ => ConfirmAction::Restart,
    }
}

/// What a late arrival does when something changes (phase 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitingAction {
    /// The running round lost a member: destroy it (compare-and-swap delete), then start over.
    DestroyRound,
    /// The state changed: start over.
    Restart,
    /// The run was closed.
    Closed,
    /// Nothing relevant changed.
    KeepWaiting,
}

/// Phase 5: a waiter for the round after `version` sees the state become `state`, with
/// `members_alive` keep-alive keys of `world_size` present.
pub fn on_change_while_waiting(
    state: Option<&State>,
    version: u64,
    members_alive: u64,
    world_size: usize,
) -> WaitingAction {
    match state {
        Some(State::Final { version: v, .. }) if *v == version => {
            if (members_alive as usize) < world_size {
                WaitingAction::DestroyRound
            } else {
                WaitingAction::KeepWaiting
            }
        }
        Some(State::Closed { .. }) => WaitingAction::Closed,
        _ => WaitingAction::Restart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn sz(min: usize, max: usize, last_call: Duration, backup: Duration) -> Sizing {
        Sizing { min, max, last_call, backup, order: RankOrder::Arrival, segment_size: None }
    }

    fn p(node: &str) -> Participant {
        Participant { node: node.into(), addr: "h".into(), pid: 1, port: None, segment: None }
    }

    fn look(state: Option<&State>, node: &str) -> InitAction {
        on_state(state, Viewer { me: &p(node), setup_is_mine: false, leaving: None })
    }

    #[test]
    fn init_table() {
        assert_eq!(look(None, "x"), InitAction::CreateRound);
        assert_eq!(look(Some(&State::Closed { outcome: None }), "x"), InitAction::Closed);
        assert_eq!(look(Some(&State::Setup), "x"), InitAction::AwaitChange);
        assert_eq!(
            look(Some(&State::Joinable { version: 2, previous: Some(1), segments: None }), "x"),
            InitAction::Join { version: 2, previous: Some(1), segments: None }
        );
        let frozen = State::Frozen { version: 2, participants: vec![p("a"), p("b")].into() };
        assert_eq!(look(Some(&frozen), "b"), InitAction::ResumeConfirm { version: 2, rank: 1 });
        let fin = State::Final {
            version: 2,
            participants: vec![p("a"), p("b")].into(),
            confirmed: None,
            max_workers: None,
        };
        assert_eq!(look(Some(&fin), "a"), InitAction::ResumeMember { version: 2, rank: 0, world_size: 2 });
        assert_eq!(
            look(Some(&State::Frozen { version: 2, participants: vec![p("a")].into() }), "x"),
            InitAction::AwaitChange
        );
        assert_eq!(
            look(
                Some(&State::Final {
                    version: 2,
                    participants: vec![p("a"), p("b")].into(),
                    confirmed: None,
                    max_workers: None
                }),
                "x"
            ),
            InitAction::AwaitNextRound { version: 2, world_size: 2 }
        );
    }

    #[test]
    fn own_setup_resumes_and_a_left_round_is_never_resumed() {
        let me = p("a");
        let mine = Viewer { me: &me, setup_is_mine: true, leaving: None };
        assert_eq!(on_state(Some(&State::Setup), mine), InitAction::ResumeSetup);
        let leaving = Viewer { me: &me, setup_is_mine: false, leaving: Some(2) };
        let fin = State::Final {
            version: 2,
            participants: vec![p("a"), p("b")].into(),
            confirmed: None,
            max_workers: None,
        };
        assert_eq!(on_state(Some(&fin), leaving), InitAction::Leave { version: 2 });
        let newer = State::Final {
            version: 3,
            participants: vec![p("a"), p("b")].into(),
            confirmed: None,
            max_workers: None,
        };
        assert_eq!(
            on_state(Some(&newer), leaving),
            InitAction::ResumeMember { version: 3, rank: 0, world_size: 2 }
        );
        let frozen = State::Frozen { version: 2, participants: vec![p("a")].into() };
        assert_eq!(on_state(Some(&frozen), leaving), InitAction::AwaitChange);
    }

    #[test]
    fn a_round_frozen_with_an_earlier_process_of_mine_is_checked() {
        let me = p("a");
        let before = Participant { pid: 7, ..p("a") };
        let viewer = Viewer { me: &me, setup_is_mine: false, leaving: None };
        let frozen = State::Frozen { version: 4, participants: vec![before, p("b")].into() };
        assert_eq!(on_state(Some(&frozen), viewer), InitAction::CheckPredecessor { version: 4, pid: 7 });
        // Elsewhere (another address): a twin, not a predecessor.
        let twin = State::Frozen {
            version: 4,
            participants: vec![Participant { addr: "h2".into(), pid: 7, ..p("a") }].into(),
        };
        assert_eq!(on_state(Some(&twin), viewer), InitAction::AwaitChange);
    }

    #[test]
    fn another_process_with_my_node_id_is_not_me() {
        let me = p("a");
        let other = Participant { addr: "elsewhere".into(), ..p("a") };
        let viewer = Viewer { me: &me, setup_is_mine: false, leaving: None };
        let fin = State::Final {
            version: 2,
            participants: vec![other.clone(), p("b")].into(),
            confirmed: None,
            max_workers: None,
        };
        assert_eq!(on_state(Some(&fin), viewer), InitAction::AwaitNextRound { version: 2, world_size: 2 });
        let frozen = State::Frozen { version: 2, participants: vec![other, p("b")].into() };
        assert_eq!(on_state(Some(&frozen), viewer), InitAction::AwaitChange);
        assert_eq!(on_state_while_joined(Some(&frozen), 2, &me), JoinedAction::Restart);
    }

    #[test]
    fn roles_when_min_equals_max() {
        let ttl = 10 * S;
        assert_eq!(join_role(1, &sz(3, 3, 30 * S, ttl)), JoinRole::Wait);
        assert_eq!(join_role(2, &sz(3, 3, 30 * S, ttl)), JoinRole::Wait);
        assert_eq!(join_role(3, &sz(3, 3, 30 * S, ttl)), JoinRole::FreezeIfFull);
        assert_eq!(join_role(4, &sz(3, 3, 30 * S, ttl)), JoinRole::FreezeIfFull);
    }

    #[test]
    fn roles_with_a_last_call() {
        let (lc, ttl) = (30 * S, 10 * S);
        assert_eq!(join_role(1, &sz(2, 4, lc, ttl)), JoinRole::Wait);
        assert_eq!(join_role(2, &sz(2, 4, lc, ttl)), JoinRole::FreezeAfter(lc));
        assert_eq!(join_role(3, &sz(2, 4, lc, ttl)), JoinRole::FreezeAfter(lc + ttl));
        assert_eq!(join_role(4, &sz(2, 4, lc, ttl)), JoinRole::FreezeIfFull);
        assert_eq!(join_role(5, &sz(2, 4, lc, ttl)), JoinRole::FreezeIfFull);
        assert_eq!(join_role(1, &sz(1, 4, lc, ttl)), JoinRole::FreezeAfter(lc));
    }

    /// A candidate `node` that joined at revision `created`, arrived in the run at `since`,
    /// and was member `rank` of round `version`.
    fn cand(node: &str, created: Revision, since: Option<Revision>, last: Option<(u64, usize)>) -> Candidate {
        let last = last.map(|(version, rank)| super::super::state::LastRound { version, rank });
        Candidate { joiner: p(node).joiner(last, since), created }
    }

    fn nodes(action: FreezeAction) -> Vec<String> {
        match action {
            FreezeAction::Freeze(ps) => ps.into_iter().map(|p| p.node).collect(),
            other => panic!("no freeze: {other:?}"),
        }
    }

    #[test]
    fn a_first_round_takes_the_first_max_by_arrival_or_waits_for_min() {
        let joiners = || vec![cand("c", 3, None, None), cand("a", 1, None, None), cand("b", 2, None, None)];
        assert_eq!(nodes(freeze(joiners(), None, &[], Trigger::Full, &sz(2, 2, S, S), None)), ["a", "b"]);
        assert_eq!(
            nodes(freeze(joiners(), None, &[], Trigger::Timer, &sz(3, 5, S, S), None)),
            ["a", "b", "c"]
        );
        let one = vec![cand("a", 1, None, None)];
        assert_eq!(
            freeze(one, None, &[], Trigger::Timer, &sz(2, 4, S, S), None),
            FreezeAction::AwaitJoiners { count: 1 }
        );
        // An earlier arrival in the run (a spare that waited) comes before a later join key.
        let spare_first = vec![cand("late", 5, None, None), cand("spare", 9, Some(2), None)];
        assert_eq!(nodes(freeze(spare_first, None, &[], Trigger::Full, &sz(1, 1, S, S), None)), ["spare"]);
        assert_eq!(retry_delay(1, &sz(2, 4, S, S)), None);
        assert_eq!(retry_delay(2, &sz(2, 4, S, S)), Some((S, Trigger::Timer)));
        assert_eq!(retry_delay(4, &sz(2, 4, S, S)), Some((Duration::ZERO, Trigger::Full)));
    }

    #[test]
    fn survivors_keep_their_ranks_and_spares_fill_the_holes_in_arrival_order() {
        // Round 4 was a, b, c, d; b died. Spares s1 (arrived first) and s2 wait.
        let candidates = vec![
            cand("s2", 10, Some(8), None),
            cand("d", 11, None, Some((4, 3))),
            cand("s1", 12, Some(6), None),
            cand("a", 13, None, Some((4, 0))),
            cand("c", 14, None, Some((4, 2))),
        ];
        let full = freeze(
            candidates.clone(),
            Some(4),
            &[p("a"), p("c"), p("d")],
            Trigger::Full,
            &sz(4, 4, S, S),
            None,
        );
        assert_eq!(nodes(full), ["a", "s1", "c", "d"]);
        // A survivor still alive but not joined yet is waited for, not replaced by a spare.
        let early = candidates[..4].to_vec();
        let alive = [p("a"), p("c"), p("d")];
        assert_eq!(
            freeze(early.clone(), Some(4), &alive, Trigger::Full, &sz(4, 4, S, S), None),
            FreezeAction::AwaitSurvivors { missing: 1 }
        );
        // When the backup timer runs out, the round forms without it: the spares fill in.
        assert_eq!(
            nodes(freeze(early, Some(4), &alive, Trigger::Timer, &sz(4, 4, S, S), None)),
            ["a", "s1", "s2", "d"]
        );
    }

    #[test]
    fn a_full_round_waits_for_a_spare_that_comes_before_a_newcomer_that_joined() {
        // Round 4 was a, b, c, d; b died. s2 joined first, though s1 has waited longer.
        let joined = vec![
            cand("a", 13, None, Some((4, 0))),
            cand("c", 14, None, Some((4, 2))),
            cand("d", 11, None, Some((4, 3))),
            cand("s2", 15, Some(8), None),
        ];
        let sizing = sz(4, 4, S, S);
        let waiting = |names: &[(&str, Revision)]| -> Vec<Candidate> {
            names.iter().map(|(node, at)| cand(node, *at, Some(*at), None)).collect()
        };
        assert_eq!(waiters_to_await(&joined, waiting(&[("s1", 6), ("s2", 8)]), Some(4), &sizing, None), 1);
        // Once s1 has joined, or when the one missing came after s2, nobody is waited for.
        let mut both = joined.clone();
        both.push(cand("s1", 16, Some(6), None));
        assert_eq!(waiters_to_await(&both, waiting(&[("s1", 6), ("s2", 8)]), Some(4), &sizing, None), 0);
        assert_eq!(waiters_to_await(&joined, waiting(&[("s2", 8), ("s3", 9)]), Some(4), &sizing, None), 0);

        // With segments, a spare of the dead member's segment comes before an earlier one.
        let segments = SegmentRuns(vec![("r1".into(), 2), ("r2".into(), 2)]);
        let mut sizing = sizing;
        sizing.order = RankOrder::Segment;
        let joined = vec![
            in_segment("a", "r1", 13, Some((4, 0))),
            in_segment("c", "r2", 14, Some((4, 2))),
            in_segment("d", "r2", 11, Some((4, 3))),
            in_segment("early", "r2", 15, None),
        ];
        let waiting = vec![in_segment("early", "r2", 5, None), in_segment("late", "r1", 9, None)];
        assert_eq!(waiters_to_await(&joined, waiting, Some(4), &sizing, Some(&segments)), 1);
    }

    #[test]
    fn a_shrunk_world_moves_only_the_ranks_beyond_it_into_the_holes() {
        // Round 7 was a..e (0..4); b and d are gone, no newcomer: W = 3.
        let candidates = vec![
            cand("e", 1, None, Some((7, 4))),
            cand("a", 2, None, Some((7, 0))),
            cand("c", 3, None, Some((7, 2))),
        ];
        assert_eq!(
            nodes(freeze(candidates, Some(7), &[], Trigger::Timer, &sz(2, 8, S, S), None)),
            ["a", "e", "c"]
        );
        // With a newcomer too: the newcomer takes the first hole, the mover the next.
        let candidates = vec![
            cand("e", 1, None, Some((7, 4))),
            cand("a", 2, None, Some((7, 0))),
            cand("n", 3, None, None),
            cand("c", 4, None, Some((7, 3))),
        ];
        assert_eq!(
            nodes(freeze(candidates, Some(7), &[], Trigger::Timer, &sz(2, 8, S, S), None)),
            ["a", "n", "e", "c"]
        );
    }

    #[test]
    fn only_members_of_the_round_before_are_survivors() {
        // x was a member of round 2, sat round 3 out as a spare; y was rank 0 of round 3.
        let candidates = vec![cand("x", 1, Some(1), Some((2, 0))), cand("y", 2, None, Some((3, 0)))];
        assert_eq!(
            nodes(freeze(candidates.clone(), Some(3), &[], Trigger::Timer, &sz(1, 4, S, S), None)),
            ["y", "x"]
        );
        // Without `previous`, the latest round a candidate was in stands for it.
        assert_eq!(survivor_round(&candidates, None), Some(3));
        assert_eq!(nodes(freeze(candidates, None, &[], Trigger::Timer, &sz(1, 4, S, S), None)), ["y", "x"]);
        // Two claiming one rank (cannot happen in one round): the later join is a newcomer.
        let twice = vec![cand("p", 1, None, Some((3, 1))), cand("q", 2, None, Some((3, 1)))];
        assert_eq!(nodes(freeze(twice, Some(3), &[], Trigger::Timer, &sz(1, 4, S, S), None)), ["q", "p"]);
    }

    #[test]
    fn natural_order_ranks_newcomers_by_address_then_node_id() {
        let mut sizing = sz(3, 3, S, S);
        sizing.order = RankOrder::Natural;
        let at = |node: &str, addr: &str, created| Candidate {
            joiner: Participant { addr: addr.into(), ..p(node) }.joiner(None, None),
            created,
        };
        let candidates = vec![at("node66", "h", 1), at("node7", "h", 2), at("b", "a10", 3)];
        assert_eq!(
            nodes(freeze(candidates.clone(), None, &[], Trigger::Full, &sizing, None)),
            ["b", "node7", "node66"]
        );
        let candidates = vec![at("x", "host66", 1), at("y", "host7", 2), at("z", "host7", 3)];
        assert_eq!(nodes(freeze(candidates, None, &[], Trigger::Full, &sizing, None)), ["y", "z", "x"]);
        // Survivors keep their ranks; only newcomers are ordered.
        let mixed = vec![
            Candidate {
                joiner: Participant { addr: "h9".into(), ..p("s") }
                    .joiner(Some(super::super::state::LastRound { version: 1, rank: 0 }), None),
                created: 1,
            },
            at("n2", "h2", 2),
            at("n1", "h1", 3),
        ];
        assert_eq!(nodes(freeze(mixed, Some(1), &[], Trigger::Timer, &sizing, None)), ["s", "n1", "n2"]);
    }

    #[test]
    fn slurm_order_ranks_newcomers_by_node_index_then_arrival() {
        let mut sizing = sz(4, 4, S, S);
        sizing.order = RankOrder::Slurm;
        let at = |node: &str, index: Option<u64>, created| Candidate {
            joiner: Joiner { node_index: index, ..p(node).joiner(None, None) },
            created,
        };
        // Arrival: a (no index), b (2), c (0), d (2): by index, ties in arrival, none last.
        let candidates =
            vec![at("a", None, 1), at("b", Some(2), 2), at("c", Some(0), 3), at("d", Some(2), 4)];
        assert_eq!(nodes(freeze(candidates, None, &[], Trigger::Full, &sizing, None)), ["c", "b", "d", "a"]);
        // Survivors keep their ranks; a newcomer takes the free one whatever its index.
        let survivor = |node: &str, index, rank| Candidate {
            joiner: Joiner {
                node_index: Some(index),
                ..p(node).joiner(Some(super::super::state::LastRound { version: 1, rank }), None)
            },
            created: 1,
        };
        let mixed =
            vec![survivor("s1", 3, 0), survivor("s2", 1, 1), survivor("s3", 2, 3), at("n", Some(0), 5)];
        assert_eq!(nodes(freeze(mixed, Some(1), &[], Trigger::Full, &sizing, None)), ["s1", "s2", "n", "s3"]);
    }

    /// A candidate of `segment` that arrived at `created`, a member of `last` if given.
    fn in_segment(node: &str, segment: &str, created: Revision, last: Option<(u64, usize)>) -> Candidate {
        let last = last.map(|(version, rank)| super::super::state::LastRound { version, rank });
        let joiner = Participant { segment: Some(segment.into()), ..p(node) }.joiner(last, None);
        Candidate { joiner, created }
    }

    fn segments_of(action: &FreezeAction) -> Vec<String> {
        match action {
            FreezeAction::Freeze(ps) => ps.iter().map(|p| p.segment.clone().unwrap_or_default()).collect(),
            other => panic!("expected a freeze, got {other:?}"),
        }
    }

    #[test]
    fn a_first_round_gives_each_segment_consecutive_ranks_in_order_of_first_arrival() {
        let mut sizing = sz(4, 4, S, S);
        sizing.order = RankOrder::Segment;
        let interleaved = || {
            vec![
                in_segment("a", "s2", 1, None),
                in_segment("b", "s1", 2, None),
                in_segment("c", "s2", 3, None),
                in_segment("d", "s1", 4, None),
            ]
        };
        let round = freeze(interleaved(), None, &[], Trigger::Full, &sizing, None);
        assert_eq!(segments_of(&round), ["s2", "s2", "s1", "s1"]);
        assert_eq!(nodes(round), ["a", "c", "b", "d"]);
        // Inside a segment, by address and node id when asked.
        sizing.order = RankOrder::SegmentNatural;
        let mut natural = interleaved();
        natural[2].joiner.addr = "a".into();
        assert_eq!(nodes(freeze(natural, None, &[], Trigger::Full, &sizing, None)), ["c", "a", "b", "d"]);
        // `arrival` ignores segments.
        sizing.order = RankOrder::Arrival;
        assert_eq!(
            nodes(freeze(interleaved(), None, &[], Trigger::Full, &sizing, None)),
            ["a", "b", "c", "d"]
        );
    }

    #[test]
    fn a_free_rank_goes_to_a_newcomer_of_the_segment_that_held_it() {
        // Round 4: ranks 0-1 were s1 (a, b), ranks 2-3 s2 (c, d); b and c died.
        let segments = SegmentRuns(vec![("s1".into(), 2), ("s2".into(), 2)]);
        let mut sizing = sz(4, 4, S, S);
        sizing.order = RankOrder::Segment;
        let candidates = vec![
            in_segment("a", "s1", 10, Some((4, 0))),
            in_segment("d", "s2", 11, Some((4, 3))),
            in_segment("n2", "s2", 12, None),
            in_segment("n1", "s1", 13, None),
        ];
        let round = freeze(candidates, Some(4), &[], Trigger::Timer, &sizing, Some(&segments));
        assert_eq!(nodes(round), ["a", "n1", "n2", "d"]);
        // Room for one: the spare of the dead member's segment comes in before an earlier one.
        let mut sizing = sz(2, 3, S, S);
        sizing.order = RankOrder::Segment;
        let segments = SegmentRuns(vec![("s1".into(), 1), ("s2".into(), 2)]);
        let candidates = vec![
            in_segment("a", "s1", 10, Some((7, 0))),
            in_segment("c", "s2", 11, Some((7, 2))),
            in_segment("early", "s1", 12, None),
            in_segment("late", "s2", 13, None),
        ];
        let round = freeze(candidates.clone(), Some(7), &[], Trigger::Timer, &sizing, Some(&segments));
        assert_eq!(nodes(round), ["a", "late", "c"]);
        // Segments of another round than the survivors' are not followed.
        let round = freeze(candidates, Some(6), &[], Trigger::Timer, &sizing, Some(&segments));
        assert_eq!(nodes(round), ["a", "early", "c"]);
    }

    #[test]
    fn segment_runs_read_back_by_rank() {
        let member =
            |node: &str, segment: Option<&str>| Participant { segment: segment.map(Into::into), ..p(node) };
        assert_eq!(SegmentRuns::of(&[member("a", None), member("b", None)]), None);
        let runs = SegmentRuns::of(&[member("a", Some("r1")), member("b", Some("r1")), member("c", None)])
            .expect("two segments are runs");
        assert_eq!(runs, SegmentRuns(vec![("r1".into(), 2), (String::new(), 1)]));
        assert_eq!((runs.segment_of(1), runs.segment_of(2), runs.segment_of(3)), (Some("r1"), None, None));
        assert_eq!(runs.world_size(), 3);
    }

    #[test]
    fn joined_table() {
        let frozen = State::Frozen { version: 1, participants: vec![p("a"), p("b")].into() };
        assert_eq!(
            on_state_while_joined(Some(&frozen), 1, &p("b")),
            JoinedAction::Confirm { rank: 1, participants: vec![p("a"), p("b")].into() }
        );
        assert_eq!(on_state_while_joined(Some(&frozen), 1, &p("c")), JoinedAction::Restart);
        assert_eq!(on_state_while_joined(Some(&frozen), 2, &p("a")), JoinedAction::Restart);
        assert_eq!(on_state_while_joined(None, 1, &p("a")), JoinedAction::Restart);
        assert_eq!(
            on_state_while_joined(Some(&State::Closed { outcome: None }), 1, &p("a")),
            JoinedAction::Closed
        );
        assert_eq!(
            on_state_while_joined(
                Some(&State::Joinable { version: 1, previous: None, segments: None }),
                1,
                &p("a")
            ),
            JoinedAction::KeepWaiting
        );
        assert_eq!(
            on_state_while_joined(
                Some(&State::Joinable { version: 2, previous: None, segments: None }),
                1,
                &p("a")
            ),
            JoinedAction::Restart
        );
    }

    #[test]
    fn counters_keys_and_running_rounds() {
        assert_eq!(next_version(None), Ok(1));
        assert_eq!(next_version(Some(b"41")), Ok(42));
        assert!(next_version(Some(b"x1")).expect_err("not a number").contains("\"x1\""));
        assert!(next_version(Some(u64::MAX.to_string().as_bytes())).is_err());
        assert!(completes_round(3, 3) && !completes_round(2, 3));
        let kv = |lease| KeyValue {
            key: b"k".to_vec(),
            value: Default::default(),
            create_revision: 5,
            mod_revision: 6,
            version: 1,
            lease,
        };
        assert_eq!(holds(Some(&kv(Some(7))), 7), Some(5));
        assert_eq!(holds(Some(&kv(Some(8))), 7), None);
        assert_eq!(holds(None, 7), None);
        assert_eq!(own_key(PutOutcome::Conflict { current: Some(kv(Some(7))) }, 7, &[]), Owned::Mine(5));
        // Under a session this worker gave up: stale, to be ended and written again.
        assert_eq!(
            own_key(PutOutcome::Conflict { current: Some(kv(Some(6))) }, 7, &[6]),
            Owned::Stale(kv(Some(6)))
        );
        assert_eq!(
            own_key(PutOutcome::Conflict { current: Some(kv(Some(8))) }, 7, &[6]),
            Owned::Taken(kv(Some(8)))
        );
        assert_eq!(own_key(PutOutcome::Conflict { current: None }, 7, &[]), Owned::Vanished);
        let fin = State::Final {
            version: 2,
            participants: vec![p("a")].into(),
            confirmed: None,
            max_workers: None,
        };
        assert_eq!(running_round(Some(&fin), 2), None);
        assert_eq!(running_round(Some(&fin), 3), Some(RoundBroken::Ended));
        assert_eq!(running_round(None, 2), Some(RoundBroken::Ended));
        assert_eq!(running_round(Some(&State::Closed { outcome: None }), 2), Some(RoundBroken::Closed));
    }

    #[test]
    fn confirm_and_waiting_tables() {
        let fin = State::Final {
            version: 1,
            participants: vec![p("a"), p("b")].into(),
            confirmed: None,
            max_workers: None,
        };
        assert_eq!(on_state_while_confirming(Some(&fin), 1), ConfirmAction::Done);
        assert_eq!(on_state_while_confirming(None, 1), ConfirmAction::Restart);
        assert_eq!(
            on_state_while_confirming(Some(&State::Closed { outcome: None }), 1),
            ConfirmAction::Closed
        );
        assert_eq!(on_change_while_waiting(Some(&fin), 1, 2, 2), WaitingAction::KeepWaiting);
        assert_eq!(on_change_while_waiting(Some(&fin), 1, 1, 2), WaitingAction::DestroyRound);
        assert_eq!(on_change_while_waiting(None, 1, 2, 2), WaitingAction::Restart);
        assert_eq!(
            on_change_while_waiting(Some(&State::Closed { outcome: None }), 1, 2, 2),
            WaitingAction::Closed
        );
    }

    #[test]
    fn leave_delay_grows_by_a_step_per_doubling_of_the_rank() {
        let steps = |rank| leave_delay(rank).as_millis() / LEAVE_STAGGER_STEP.as_millis();
        let table =
            [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4), (4095, 12), (4096, 13), (8191, 13)];
        for (rank, expected) in table {
            assert_eq!(steps(rank), expected, "rank {rank}");
        }
        assert_eq!(steps(usize::MAX), u128::from(usize::BITS), "no overflow at the largest rank");
    }
}
