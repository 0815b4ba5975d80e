//! What changed for a member between the round before and its new one
//! (`RendezvousInfo::changes`): who left, who joined. Worked out once per pair of participant
//! lists in a process — the thousands of handlers of one process that form a round together
//! see the same two lists — in time linear in their length.

use std::collections::HashSet;
use std::sync::Arc;

use crate::per_process::PerProcess;

use super::state::Participant;

/// What changed for a member since the round before, as it knew it: the last round it was a
/// member of, or else the last running round it waited on (as a spare or late arrival).
/// Members are told apart by node id, address and process id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundChanges {
    /// The round compared with (`None`: this worker's first round; then nothing else is set).
    pub previous_version: Option<u64>,
    /// This worker's rank in that round (`None`: it was not a member of it).
    pub previous_rank: Option<usize>,
    /// Ranks of that round whose members are not in this one (died, left, or not admitted),
    /// ascending. Shared by the members of one process.
    pub left: Arc<[usize]>,
    /// Ranks of this round whose members were not in that one (spares and newcomers),
    /// ascending. Shared by the members of one process.
    pub joined: Arc<[usize]>,
}

/// A round a worker knew: one it was a member of (as `rank`), or a running round it waited
/// behind (as a spare or late arrival; `rank` is `None`).
#[derive(Clone, Debug)]
pub(crate) struct KnownRound {
    pub(crate) version: u64,
    pub(crate) rank: Option<usize>,
    pub(crate) members: Arc<[Participant]>,
}

impl KnownRound {
    /// The later of the last round a worker was a member of and the last running round it
    /// waited behind: what its new round is compared with.
    pub(crate) fn latest(
        member_of: Option<&KnownRound>,
        waited_behind: Option<KnownRound>,
    ) -> Option<KnownRound> {
        match (member_of, waited_behind) {
            (Some(member_of), Some(waited)) if member_of.version >= waited.version => Some(member_of.clone()),
            (member_of, waited) => waited.or_else(|| member_of.cloned()),
        }
    }
}

impl RoundChanges {
    /// The changes from `baseline` (the round compared with; `None` in a worker's first
    /// round: no change) to a round of `now`'s members.
    pub(crate) fn since(baseline: Option<&KnownRound>, now: &Arc<[Participant]>) -> RoundChanges {
        match baseline {
            Some(known) => RoundChanges::between(known.version, known.rank, &known.members, now),
            None => RoundChanges::default(),
        }
    }

    /// The changes from round `previous_version` (with `before`'s members, of whom this worker
    /// was `previous_rank`) to a round of `now`'s members.
    pub(crate) fn between(
        previous_version: u64,
        previous_rank: Option<usize>,
        before: &Arc<[Participant]>,
        now: &Arc<[Participant]>,
    ) -> RoundChanges {
        let (left, joined) = recent::diff(before, now);
        RoundChanges { previous_version: Some(previous_version), previous_rank, left, joined }
    }
}

type Ranks = (Arc<[usize]>, Arc<[usize]>);

/// The ranks of `before` whose members are not in `now`, and the ranks of `now` whose members
/// were not in `before`.
fn compute(before: &[Participant], now: &[Participant]) -> Ranks {
    let identity = Participant::identity;
    let in_now: HashSet<_> = now.iter().map(identity).collect();
    let in_before: HashSet<_> = before.iter().map(identity).collect();
    let left = (0..before.len()).filter(|&r| !in_now.contains(&identity(&before[r]))).collect();
    let joined = (0..now.len()).filter(|&r| !in_before.contains(&identity(&now[r]))).collect();
    (left, joined)
}

/// The last few pairs of lists worked out in this process.
mod recent {
    use super::*;
    use crate::rendezvous::recent::Recent;

    type Lists = (Arc<[Participant]>, Arc<[Participant]>);

    static RECENT: PerProcess<Recent<Lists, Ranks>> = PerProcess::new(Recent::new);

    pub(super) fn diff(before: &Arc<[Participant]>, now: &Arc<[Participant]>) -> Ranks {
        RECENT.get().get_or_make(
            |(b, n)| Arc::ptr_eq(b, before) && Arc::ptr_eq(n, now),
            || ((before.clone(), now.clone()), compute(before, now)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(node: &str, pid: u32) -> Participant {
        Participant { node: node.into(), addr: "h".into(), pid, port: None, segment: None }
    }

    #[test]
    fn left_and_joined_are_told_apart_by_node_address_and_pid() {
        let before: Arc<[Participant]> = vec![p("a", 1), p("b", 2), p("c", 3)].into();
        // b died; c restarted (same node id, another pid); d is a spare.
        let now: Arc<[Participant]> = vec![p("a", 1), p("d", 4), p("c", 9)].into();
        let changes = RoundChanges::between(7, Some(0), &before, &now);
        assert_eq!((&*changes.left, &*changes.joined), (&[1, 2][..], &[1, 2][..]));
        assert_eq!((changes.previous_version, changes.previous_rank), (Some(7), Some(0)));
    }

    #[test]
    fn handlers_of_one_process_share_the_work() {
        let before: Arc<[Participant]> = (0..100).map(|i| p(&format!("n{i}"), i)).collect::<Vec<_>>().into();
        let now: Arc<[Participant]> = (1..101).map(|i| p(&format!("n{i}"), i)).collect::<Vec<_>>().into();
        let one = RoundChanges::between(1, Some(3), &before, &now);
        let two = RoundChanges::between(1, Some(4), &before, &now);
        assert!(Arc::ptr_eq(&one.left, &two.left) && Arc::ptr_eq(&one.joined, &two.joined));
        assert_eq!((&*one.left, &*one.joined), (&[0][..], &[99][..]));
    }
}
