//! Finding a worker in a round's member list (by node id, address and process id) without
//! scanning it.
//!
//! Every member looks for itself in the list of its round (its rank), at least twice a round.
//! A scan is O(N) per member, so the thousands of handlers of one process that form a round
//! together did O(N²) compares of node ids per round: 8 % of the client's CPU at 8,192 workers
//! (`perf`, measured in the commit that added this index). They all look in the same list (one `Arc` per state value), so a
//! long list is indexed once per process, sorted by identity, and each lookup is a binary
//! search. Short lists are scanned: indexing them costs more than it saves.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::per_process::PerProcess;

use super::decide::{is_me, is_predecessor};
use super::state::Participant;

/// Lists this long or longer are indexed.
const INDEXED_FROM: usize = 64;

/// The rank of `me` in `members`: the first position whose participant is `me` (node id,
/// address and process id), as a scan would find it.
pub(crate) fn rank_of(members: &Arc<[Participant]>, me: &Participant) -> Option<usize> {
    if members.len() < INDEXED_FROM {
        return members.iter().position(|p| is_me(p, me));
    }
    let index = recent::index(members);
    let first = index.partition_point(|&rank| members[rank as usize].identity() < me.identity());
    let rank = *index.get(first)? as usize;
    is_me(&members[rank], me).then_some(rank)
}

/// The first participant of `members` (in rank order) that is an earlier process of `me`: its
/// node id and address, another process id.
pub(crate) fn predecessor_of<'a>(
    members: &'a Arc<[Participant]>,
    me: &Participant,
) -> Option<&'a Participant> {
    if members.len() < INDEXED_FROM {
        return members.iter().find(|p| is_predecessor(p, me));
    }
    let index = recent::index(members);
    let machine =
        |p: &Participant| (p.node.as_str(), p.addr.as_str()).cmp(&(me.node.as_str(), me.addr.as_str()));
    let first = index.partition_point(|&rank| machine(&members[rank as usize]) == Ordering::Less);
    // The processes of `me`'s node id and address, each process in rank order: the first rank
    // that is not `me` is the lowest of another process.
    index[first..]
        .iter()
        .map(|&rank| rank as usize)
        .take_while(|&rank| machine(&members[rank]) == Ordering::Equal)
        .filter(|&rank| members[rank].pid != me.pid)
        .min()
        .map(|rank| &members[rank])
}

/// The ranks of `members` ordered by identity, then rank.
fn build(members: &[Participant]) -> Arc<[u32]> {
    let mut ranks: Vec<u32> = (0..members.len() as u32).collect();
    ranks.sort_by(|&a, &b| {
        members[a as usize].identity().cmp(&members[b as usize].identity()).then(a.cmp(&b))
    });
    ranks.into()
}

/// The indexes of the last few lists looked in, in this process.
mod recent {
    use super::*;
    use crate::rendezvous::recent::Recent;

    /// A list, and its ranks ordered by identity.
    type Index = Recent<Arc<[Participant]>, Arc<[u32]>>;

    static RECENT: PerProcess<Index> = PerProcess::new(Recent::new);

    pub(super) fn index(members: &Arc<[Participant]>) -> Arc<[u32]> {
        RECENT.get().get_or_make(|list| Arc::ptr_eq(list, members), || (members.clone(), build(members)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(node: &str, addr: &str, pid: u32) -> Participant {
        Participant { node: node.into(), addr: addr.into(), pid, port: None, segment: None }
    }

    /// Lists short and long (scanned and indexed), with repeated node ids, addresses and
    /// process ids in no particular order, and duplicates of one identity.
    fn lists() -> Vec<Arc<[Participant]>> {
        let mut lists = Vec::new();
        for n in [0, 1, 5, INDEXED_FROM - 1, INDEXED_FROM, 300] {
            let list: Vec<Participant> = (0..n)
                .map(|i| {
                    let i = i as u32;
                    p(&format!("n{}", (i * 7919) % 37), &format!("h{}", i % 3), 100 + (i * 31) % 11)
                })
                .collect();
            lists.push(list.into());
        }
        lists
    }

    #[test]
    fn lookups_agree_with_a_scan_for_every_identity_present_or_not() {
        for members in lists() {
            let mut probes: Vec<Participant> = members.iter().cloned().collect();
            probes.extend([
                p("n1", "h1", 100),
                p("nobody", "h0", 100),
                p("n0", "elsewhere", 100),
                p("", "", 0),
            ]);
            for me in &probes {
                assert_eq!(rank_of(&members, me), members.iter().position(|q| is_me(q, me)), "{me:?}");
                assert_eq!(
                    predecessor_of(&members, me),
                    members.iter().find(|q| is_predecessor(q, me)),
                    "{me:?} in {} members",
                    members.len()
                );
            }
        }
    }

    #[test]
    fn a_new_list_at_the_address_of_a_dropped_one_is_not_read_with_its_index() {
        let me = p("me", "h", 1);
        // More lists than the cache keeps, each dropped before the next is made.
        for round in 0..12 {
            let members: Arc<[Participant]> =
                (0..200).map(|i| if i == round { me.clone() } else { p(&format!("o{i}"), "h", 2) }).collect();
            assert_eq!(rank_of(&members, &me), Some(round));
        }
    }
}
