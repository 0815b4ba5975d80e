//! The decision table of the protocol: pure functions from what a worker observed to what it
//! does next. No I/O and no clock here — the driver (`round.rs`) performs the actions and
//! feeds back what it sees, so these rules can be tested exhaustively and read next to
//! docs/PROTOCOL.md "The phases".

use std::time::Duration;

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

/// Phase 2: the joiner's role. `backup` is the extra delay of backups behind the one
/// responsible (the keep-alive TTL: by then a dead worker's join key has vanished).
pub fn join_role(position: u64, min: usize, max: usize, last_call: Duration, backup: Duration) -> JoinRole {
    let (min, max) = (min as u64, max as u64);
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
    /// Too few live joiners: watch the join keys until `min` are there again, then retry
    /// after `retry_after`.
    AwaitJoiners {
        /// Live joiners now.
        count: u64,
        /// Delay before retrying once `min` are there.
        retry_after: Duration,
    },
}

/// Phase 2, freeze: the first `max` joiners form the round, if there are at least `min`.
pub fn freeze(
    joiners: Vec<Participant>,
    count: u64,
    min: usize,
    max: usize,
    last_call: Duration,
) -> FreezeAction {
    if (joiners.len()) < min {
        return FreezeAction::AwaitJoiners {
            count,
            retry_after: if count as usize >= max { Duration::ZERO } else { last_call },
        };
    }
    let mut joiners = joiners;
    joiners.truncate(max);
    FreezeAction::Freeze(joiners)
}

/// When a watched join count reaches `min` again after a failed freeze: how long until the
/// next attempt (at once when `max` are there).
pub fn retry_delay(count: u64, min: usize, max: usize, last_call: Duration) -> Option<Duration> {
    if count as usize >= max {
        Some(Duration::ZERO)
    } else if count as usize >= min {
        Some(last_call)
    } else {
        None
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
        participants: Vec<Participant>,
    },
    /// The round froze without this worker (it came too late): withdraw the join key and
    /// start over (it will wait for the next round).
    Withdraw,
    /// Anything else: start over from Init.
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
                None => JoinedAction::Withdraw,
            }
        }
        Some(State::Final { version: v, participants, .. }) if *v == version => {
            // Final already (we missed frozen only if we were too slow to see it): a member
            // would have been needed to confirm, so we are not one.
            if participants.iter().any(|p| is_me(p, me)) {
                JoinedAction::Restart
            } else {
                JoinedAction::Withdraw
            }
        }
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
        let frozen = State::Frozen { version: 2, participants: vec![p("a"), p("b")] };
        assert_eq!(look(Some(&frozen), "b"), InitAction::ResumeConfirm { version: 2, rank: 1 });
        let fin = State::Final { version: 2, participants: vec![p("a"), p("b")], confirmed: None };
        assert_eq!(look(Some(&fin), "a"), InitAction::ResumeMember { version: 2, rank: 0, world_size: 2 });
        assert_eq!(
            look(Some(&State::Frozen { version: 2, participants: vec![p("a")] }), "x"),
            InitAction::AwaitChange
        );
        assert_eq!(
            look(
                Some(&State::Final { version: 2, participants: vec![p("a"), p("b")], confirmed: None }),
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
        let fin = State::Final { version: 2, participants: vec![p("a"), p("b")], confirmed: None };
        assert_eq!(on_state(Some(&fin), leaving), InitAction::Leave { version: 2 });
        let newer = State::Final { version: 3, participants: vec![p("a"), p("b")], confirmed: None };
        assert_eq!(
            on_state(Some(&newer), leaving),
            InitAction::ResumeMember { version: 3, rank: 0, world_size: 2 }
        );
        let frozen = State::Frozen { version: 2, participants: vec![p("a")] };
        assert_eq!(on_state(Some(&frozen), leaving), InitAction::AwaitChange);
    }

    #[test]
    fn another_process_with_my_node_id_is_not_me() {
        let me = p("a");
        let other = Participant { addr: "elsewhere".into(), ..p("a") };
        let viewer = Viewer { me: &me, setup_is_mine: false, leaving: None };
        let fin = State::Final { version: 2, participants: vec![other.clone(), p("b")], confirmed: None };
        assert_eq!(on_state(Some(&fin), viewer), InitAction::AwaitNextRound { version: 2, world_size: 2 });
        let frozen = State::Frozen { version: 2, participants: vec![other, p("b")] };
        assert_eq!(on_state(Some(&frozen), viewer), InitAction::AwaitChange);
        assert_eq!(on_state_while_joined(Some(&frozen), 2, &me), JoinedAction::Withdraw);
    }

    #[test]
    fn roles_when_min_equals_max() {
        let ttl = 10 * S;
        assert_eq!(join_role(1, 3, 3, 30 * S, ttl), JoinRole::Wait);
        assert_eq!(join_role(2, 3, 3, 30 * S, ttl), JoinRole::Wait);
        assert_eq!(join_role(3, 3, 3, 30 * S, ttl), JoinRole::FreezeNow);
        assert_eq!(join_role(4, 3, 3, 30 * S, ttl), JoinRole::FreezeAfter(ttl));
    }

    #[test]
    fn roles_with_a_last_call() {
        let (lc, ttl) = (30 * S, 10 * S);
        assert_eq!(join_role(1, 2, 4, lc, ttl), JoinRole::Wait);
        assert_eq!(join_role(2, 2, 4, lc, ttl), JoinRole::FreezeAfter(lc));
        assert_eq!(join_role(3, 2, 4, lc, ttl), JoinRole::FreezeAfter(lc + ttl));
        assert_eq!(join_role(4, 2, 4, lc, ttl), JoinRole::FreezeNow);
        assert_eq!(join_role(5, 2, 4, lc, ttl), JoinRole::FreezeAfter(lc + ttl));
        assert_eq!(join_role(1, 1, 4, lc, ttl), JoinRole::FreezeAfter(lc));
    }

    #[test]
    fn freeze_takes_the_first_max_or_waits_for_min() {
        let joiners = vec![p("a"), p("b"), p("c")];
        assert_eq!(freeze(joiners.clone(), 3, 2, 2, S), FreezeAction::Freeze(vec![p("a"), p("b")]));
        assert_eq!(freeze(joiners.clone(), 3, 3, 5, S), FreezeAction::Freeze(joiners));
        assert_eq!(freeze(vec![p("a")], 1, 2, 4, S), FreezeAction::AwaitJoiners { count: 1, retry_after: S });
        assert_eq!(retry_delay(1, 2, 4, S), None);
        assert_eq!(retry_delay(2, 2, 4, S), Some(S));
        assert_eq!(retry_delay(4, 2, 4, S), Some(Duration::ZERO));
    }

    #[test]
    fn joined_table() {
        let frozen = State::Frozen { version: 1, participants: vec![p("a"), p("b")] };
        assert_eq!(
            on_state_while_joined(Some(&frozen), 1, &p("b")),
            JoinedAction::Confirm { rank: 1, participants: vec![p("a"), p("b")] }
        );
        assert_eq!(on_state_while_joined(Some(&frozen), 1, &p("c")), JoinedAction::Withdraw);
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
    fn confirm_and_waiting_tables() {
        let fin = State::Final { version: 1, participants: vec![p("a"), p("b")], confirmed: None };
        assert_eq!(on_state_while_confirming(Some(&fin), 1), ConfirmAction::Done);
        assert_eq!(on_state_while_confirming(None, 1), ConfirmAction::Restart);
        assert_eq!(on_state_while_confirming(Some(&State::Closed), 1), ConfirmAction::Closed);
        assert_eq!(on_change_while_waiting(Some(&fin), 1, 2, 2), WaitingAction::KeepWaiting);
        assert_eq!(on_change_while_waiting(Some(&fin), 1, 1, 2), WaitingAction::DestroyRound);
        assert_eq!(on_change_while_waiting(None, 1, 2, 2), WaitingAction::Restart);
        assert_eq!(on_change_while_waiting(Some(&State::Closed), 1, 2, 2), WaitingAction::Closed);
    }
}
