//! The decision table of the protocol: pure functions from what a worker observed to what it
//! does next. No I/O and no clock here — the driver (`round.rs`) performs the actions and
//! feeds back what it sees, so these rules can be tested exhaustively and read next to
//! docs/PROTOCOL.md "The phases".

use std::time::Duration;

use crate::kv::{KeyValue, LeaseId, PutOutcome, Revision};

use super::machine::Sizing;
use super::monitor::RoundBroken;
use super::state::{Participant, State};

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
    let rank_of = |participants: &[Participant]| participants.iter().position(|p| is_me(p, viewer.me));
    let left = |version: u64| viewer.leaving.is_some_and(|left| version <= left);
    match state {
        None => InitAction::CreateRound,
        Some(State::Closed) => InitAction::Closed,
        Some(State::Joinable { version }) => InitAction::Join { version: *version },
        Some(State::Frozen { version, participants }) => match rank_of(participants) {
            Some(rank) if !left(*version) => InitAction::ResumeConfirm { version: *version, rank },
            _ => InitAction::AwaitChange,
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
    /// Position `max`: freeze the round now.
    FreezeNow,
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
    if position == max {
        JoinRole::FreezeNow
    } else if position > max {
        // Too late for this round unless the worker at `max` died before freezing.
        JoinRole::FreezeAfter(if min < max { last_call + backup } else { backup })
    } else if position == min {
        JoinRole::FreezeAfter(last_call)
    } else if position > min {
        JoinRole::FreezeAfter(last_call + backup)
    } else {
        JoinRole::Wait
    }
}

/// What a freeze attempt does with the join keys it read (first `max` by creation order,
/// and the total count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FreezeAction {
    /// Swap `joinable` → `frozen` with these participants, in rank order.
    Freeze(Vec<Participant>),
    /// Too few live joiners: watch the join keys until [`retry_delay`] says to try again.
    AwaitJoiners {
        /// Live joiners now.
        count: u64,
    },
}

/// Phase 2, freeze: the first `max` joiners form the round, if there are at least `min`.
pub fn freeze(joiners: Vec<Participant>, count: u64, sizing: &Sizing) -> FreezeAction {
    if joiners.len() < sizing.min {
        return FreezeAction::AwaitJoiners { count };
    }
    let mut joiners = joiners;
    joiners.truncate(sizing.max);
    FreezeAction::Freeze(joiners)
}

/// When a watched join count reaches `min` again after a failed freeze: how long until the
/// next attempt (at once when `max` are there); `None` while there are too few.
pub fn retry_delay(count: u64, sizing: &Sizing) -> Option<Duration> {
    if count as usize >= sizing.max {
        Some(Duration::ZERO)
    } else if count as usize >= sizing.min {
        Some(sizing.last_call)
    } else {
        None
    }
}

/// Whether a key this worker creates for itself is its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owned {
    /// Ours, created at this revision.
    Mine(Revision),
    /// Held by another live process (with this node id): never overwritten.
    Taken(KeyValue),
    /// Deleted between the attempt and the answer: try again from the start.
    Vanished,
}

/// Who owns a key after a create-if-absent of it under `session`: written now, or already
/// there under our own session (an earlier step wrote it and lost the answer), is ours.
pub fn own_key(outcome: PutOutcome, session: LeaseId) -> Owned {
    match outcome {
        PutOutcome::Written { create_revision, .. } => Owned::Mine(create_revision),
        PutOutcome::Conflict { current: Some(kv) } if kv.lease == Some(session) => {
            Owned::Mine(kv.create_revision)
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
        Some(State::Closed) => Some(RoundBroken::Closed),
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
        Some(State::Closed) => JoinedAction::Closed,
        Some(State::Joinable { version: v }) if *v == version => JoinedAction::KeepWaiting,
        Some(State::Frozen { version: v, participants }) if *v == version => {
            match participants.iter().position(|p| is_me(p, me)) {
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
        Some(State::Closed) => ConfirmAction::Closed,
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
        Some(State::Closed) => WaitingAction::Closed,
        _ => WaitingAction::Restart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn sz(min: usize, max: usize, last_call: Duration, backup: Duration) -> Sizing {
        Sizing { min, max, last_call, backup }
    }

    fn p(node: &str) -> Participant {
        Participant { node: node.into(), addr: "h".into(), pid: 1, port: None }
    }

    fn look(state: Option<&State>, node: &str) -> InitAction {
        on_state(state, Viewer { me: &p(node), setup_is_mine: false, leaving: None })
    }

    #[test]
    fn init_table() {
        assert_eq!(look(None, "x"), InitAction::CreateRound);
        assert_eq!(look(Some(&State::Closed), "x"), InitAction::Closed);
        assert_eq!(look(Some(&State::Setup), "x"), InitAction::AwaitChange);
        assert_eq!(look(Some(&State::Joinable { version: 2 }), "x"), InitAction::Join { version: 2 });
        let frozen = State::Frozen { version: 2, participants: vec![p("a"), p("b")].into() };
        assert_eq!(look(Some(&frozen), "b"), InitAction::ResumeConfirm { version: 2, rank: 1 });
        let fin = State::Final { version: 2, participants: vec![p("a"), p("b")].into(), confirmed: None };
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
                    confirmed: None
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
        let fin = State::Final { version: 2, participants: vec![p("a"), p("b")].into(), confirmed: None };
        assert_eq!(on_state(Some(&fin), leaving), InitAction::Leave { version: 2 });
        let newer = State::Final { version: 3, participants: vec![p("a"), p("b")].into(), confirmed: None };
        assert_eq!(
            on_state(Some(&newer), leaving),
            InitAction::ResumeMember { version: 3, rank: 0, world_size: 2 }
        );
        let frozen = State::Frozen { version: 2, participants: vec![p("a")].into() };
        assert_eq!(on_state(Some(&frozen), leaving), InitAction::AwaitChange);
    }

    #[test]
    fn another_process_with_my_node_id_is_not_me() {
        let me = p("a");
        let other = Participant { addr: "elsewhere".into(), ..p("a") };
        let viewer = Viewer { me: &me, setup_is_mine: false, leaving: None };
        let fin =
            State::Final { version: 2, participants: vec![other.clone(), p("b")].into(), confirmed: None };
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
        assert_eq!(join_role(3, &sz(3, 3, 30 * S, ttl)), JoinRole::FreezeNow);
        assert_eq!(join_role(4, &sz(3, 3, 30 * S, ttl)), JoinRole::FreezeAfter(ttl));
    }

    #[test]
    fn roles_with_a_last_call() {
        let (lc, ttl) = (30 * S, 10 * S);
        assert_eq!(join_role(1, &sz(2, 4, lc, ttl)), JoinRole::Wait);
        assert_eq!(join_role(2, &sz(2, 4, lc, ttl)), JoinRole::FreezeAfter(lc));
        assert_eq!(join_role(3, &sz(2, 4, lc, ttl)), JoinRole::FreezeAfter(lc + ttl));
        assert_eq!(join_role(4, &sz(2, 4, lc, ttl)), JoinRole::FreezeNow);
        assert_eq!(join_role(5, &sz(2, 4, lc, ttl)), JoinRole::FreezeAfter(lc + ttl));
        assert_eq!(join_role(1, &sz(1, 4, lc, ttl)), JoinRole::FreezeAfter(lc));
    }

    #[test]
    fn freeze_takes_the_first_max_or_waits_for_min() {
        let joiners = vec![p("a"), p("b"), p("c")];
        assert_eq!(freeze(joiners.clone(), 3, &sz(2, 2, S, S)), FreezeAction::Freeze(vec![p("a"), p("b")]));
        assert_eq!(freeze(joiners.clone(), 3, &sz(3, 5, S, S)), FreezeAction::Freeze(joiners));
        assert_eq!(freeze(vec![p("a")], 1, &sz(2, 4, S, S)), FreezeAction::AwaitJoiners { count: 1 });
        assert_eq!(retry_delay(1, &sz(2, 4, S, S)), None);
        assert_eq!(retry_delay(2, &sz(2, 4, S, S)), Some(S));
        assert_eq!(retry_delay(4, &sz(2, 4, S, S)), Some(Duration::ZERO));
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
        assert_eq!(on_state_while_joined(Some(&State::Closed), 1, &p("a")), JoinedAction::Closed);
        assert_eq!(
            on_state_while_joined(Some(&State::Joinable { version: 1 }), 1, &p("a")),
            JoinedAction::KeepWaiting
        );
        assert_eq!(
            on_state_while_joined(Some(&State::Joinable { version: 2 }), 1, &p("a")),
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
        assert_eq!(own_key(PutOutcome::Conflict { current: Some(kv(Some(7))) }, 7), Owned::Mine(5));
        assert_eq!(
            own_key(PutOutcome::Conflict { current: Some(kv(Some(8))) }, 7),
            Owned::Taken(kv(Some(8)))
        );
        assert_eq!(own_key(PutOutcome::Conflict { current: None }, 7), Owned::Vanished);
        let fin = State::Final { version: 2, participants: vec![p("a")].into(), confirmed: None };
        assert_eq!(running_round(Some(&fin), 2), None);
        assert_eq!(running_round(Some(&fin), 3), Some(RoundBroken::Ended));
        assert_eq!(running_round(None, 2), Some(RoundBroken::Ended));
        assert_eq!(running_round(Some(&State::Closed), 2), Some(RoundBroken::Closed));
    }

    #[test]
    fn confirm_and_waiting_tables() {
        let fin = State::Final { version: 1, participants: vec![p("a"), p("b")].into(), confirmed: None };
        assert_eq!(on_state_while_confirming(Some(&fin), 1), ConfirmAction::Done);
        assert_eq!(on_state_while_confirming(None, 1), ConfirmAction::Restart);
        assert_eq!(on_state_while_confirming(Some(&State::Closed), 1), ConfirmAction::Closed);
        assert_eq!(on_change_while_waiting(Some(&fin), 1, 2, 2), WaitingAction::KeepWaiting);
        assert_eq!(on_change_while_waiting(Some(&fin), 1, 1, 2), WaitingAction::DestroyRound);
        assert_eq!(on_change_while_waiting(None, 1, 2, 2), WaitingAction::Restart);
        assert_eq!(on_change_while_waiting(Some(&State::Closed), 1, 2, 2), WaitingAction::Closed);
    }
}
