//! Whole-segment admission (`segment_size=K`, docs/PROTOCOL.md "Whole segments"): who is in a
//! round and at which ranks when a round admits only complete segments of `K` workers, each
//! in a block of `K` ranks aligned to `K`. Pure, like the rest of [`decide`](super::decide).

use std::collections::BTreeMap;

use super::decide::{Candidate, Sizing, in_rank_order};
use super::state::{Participant, SegmentRuns};

/// A block of the round before that stays: its index, and its members at their offsets.
struct Kept {
    block: usize,
    members: Vec<Participant>,
}

/// The participants, in rank order, of a round of whole segments of `k` workers, or `None`
/// when the complete segments among the candidates make fewer than `min` workers.
///
/// `survivors` are the members of the round before that joined (by rank), `newcomers` the
/// others in order of arrival, and `before` the segments of the round before's ranks (for the
/// blocks none of whose members came back). The rule:
///
/// 1. A block of the round before stays where it is when its survivors, with the earliest
///    newcomers of its segment in its holes, make it complete again; otherwise it leaves the
///    world whole and its survivors become newcomers.
/// 2. Free blocks are taken by complete segments of newcomers (each `k` of a segment, by
///    arrival): a free block first by a segment of the one that held it, then the others in
///    order of their segments' first arrival, up to `max` workers.
/// 3. The world is the blocks that stay and the segments admitted; a block that stays beyond
///    it (the world shrank) moves to the lowest free block — the only blocks that move.
pub(super) fn freeze(
    k: usize,
    survivors: Vec<Candidate>,
    newcomers: Vec<Candidate>,
    before: Option<&SegmentRuns>,
    sizing: &Sizing,
) -> Option<Vec<Participant>> {
    let room = sizing.max / k;
    let (kept, mut pool) = keep_complete_blocks(k, survivors, newcomers, before, room);
    pool.sort_by_key(|c| (c.arrival(), c.created));
    let free_labels = free_block_labels(k, before, &kept);
    let admitted = admit_segments(k, pool, &free_labels, room - kept.len(), sizing);
    if (kept.len() + admitted.len()) * k < sizing.min {
        return None;
    }
    Some(place_blocks(kept, admitted))
}

/// Step 1: the blocks that stay (at most `room`), and everyone else in no particular order.
fn keep_complete_blocks(
    k: usize,
    survivors: Vec<Candidate>,
    mut newcomers: Vec<Candidate>,
    before: Option<&SegmentRuns>,
    room: usize,
) -> (Vec<Kept>, Vec<Candidate>) {
    let mut by_block: BTreeMap<usize, Vec<(usize, Candidate)>> = BTreeMap::new();
    for c in survivors {
        let rank = c.joiner.last.map_or(usize::MAX, |l| l.rank);
        by_block.entry(rank / k).or_default().push((rank % k, c));
    }
    let mut kept = Vec::new();
    let mut left = Vec::new();
    for (block, members) in by_block {
        let label = before
            .and_then(|s| s.segment_of(block * k))
            .map(str::to_string)
            .or_else(|| members[0].1.joiner.segment.clone());
        // A survivor that now names another segment is no longer of this block.
        let (members, moved): (Vec<_>, Vec<_>) =
            members.into_iter().partition(|(_, c)| c.joiner.segment == label);
        left.extend(moved.into_iter().map(|(_, c)| c));
        let holes = k - members.len();
        let fill: Vec<usize> = newcomers
            .iter()
            .enumerate()
            .filter(|(_, c)| c.joiner.segment == label)
            .map(|(i, _)| i)
            .take(holes)
            .collect();
        if fill.len() < holes || kept.len() == room {
            left.extend(members.into_iter().map(|(_, c)| c));
            continue;
        }
        // Removed from the last, so that the indices before stay valid.
        let mut fill: Vec<Participant> =
            fill.iter().rev().map(|i| newcomers.remove(*i).joiner.participant()).collect();
        fill.reverse();
        let mut slots: Vec<Option<Participant>> = vec![None; k];
        for (offset, c) in members {
            slots[offset] = Some(c.joiner.participant());
        }
        let mut fill = fill.drain(..);
        let members = slots.into_iter().map(|slot| slot.or_else(|| fill.next())).collect::<Option<Vec<_>>>();
        kept.extend(members.map(|members| Kept { block, members }));
    }
    newcomers.extend(left);
    (kept, newcomers)
}

/// The blocks of the round before that do not stay, with the segment that held each (where
/// known), lowest first.
fn free_block_labels(k: usize, before: Option<&SegmentRuns>, kept: &[Kept]) -> Vec<(usize, Option<String>)> {
    let Some(before) = before else { return Vec::new() };
    (0..before.world_size() / k)
        .filter(|block| kept.iter().all(|b| b.block != *block))
        .map(|block| (block, before.segment_of(block * k).map(str::to_string)))
        .collect()
}

/// Step 2: up to `room` blocks of `k` workers of one segment from `pool` (in order of
/// arrival): each segment's workers in blocks of `k` by arrival, segments in order of their
/// first arrival, a block in the order of `sizing`'s rank order; each with the free block it
/// is to take when it is of that block's segment.
fn admit_segments(
    k: usize,
    pool: Vec<Candidate>,
    free: &[(usize, Option<String>)],
    room: usize,
    sizing: &Sizing,
) -> Vec<(Option<usize>, Vec<Participant>)> {
    let groups = super::segment_groups::by_segment(pool.into_iter().map(|c| c.joiner.participant()), |p| {
        p.segment.as_deref()
    });
    // A segment of more than `k` workers makes a block of each `k` of them.
    let mut complete: Vec<Option<(Option<String>, Vec<Participant>)>> = groups
        .into_iter()
        .flat_map(|(label, members)| {
            let blocks: Vec<Vec<Participant>> =
                members.chunks_exact(k).map(<[Participant]>::to_vec).collect();
            // Whole segments need an order by segment (`validate`), which reads no node index.
            blocks.into_iter().map(move |block| {
                let block = block.into_iter().map(|p| (p, None)).collect();
                Some((label.clone(), in_rank_order(block, sizing.order)))
            })
        })
        .collect();
    let mut admitted = Vec::new();
    for (block, label) in free {
        let of_label = complete.iter_mut().find(|g| g.as_ref().is_some_and(|(l, _)| l == label));
        if let Some(group) = of_label.filter(|_| admitted.len() < room).and_then(Option::take) {
            admitted.push((Some(*block), group.1));
        }
    }
    let rest = complete.into_iter().flatten().map(|(_, members)| (None, members));
    admitted.extend(rest.take(room - admitted.len()));
    admitted
}

/// Step 3: the world of `kept` blocks and `admitted` segments, in rank order.
fn place_blocks(kept: Vec<Kept>, admitted: Vec<(Option<usize>, Vec<Participant>)>) -> Vec<Participant> {
    let world = kept.len() + admitted.len();
    let mut slots: Vec<Option<Vec<Participant>>> = vec![None; world];
    let mut movers = Vec::new();
    for Kept { block, members } in kept {
        match slots.get_mut(block) {
            Some(slot) => *slot = Some(members),
            None => movers.push(members),
        }
    }
    let mut others = Vec::new();
    for (block, members) in admitted {
        match block.and_then(|b| slots.get_mut(b)).filter(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(members),
            None => others.push(members),
        }
    }
    let mut fill = others.into_iter().chain(movers);
    slots.into_iter().flat_map(|slot| slot.or_else(|| fill.next()).unwrap_or_default()).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::super::decide::{FreezeAction, Trigger, freeze as decide_freeze};
    use super::super::state::LastRound;
    use super::*;
    use crate::params::RankOrder;

    /// Whole segments of 2, `min ..= max` workers.
    fn pairs(min: usize, max: usize) -> Sizing {
        let s = Duration::from_secs(1);
        Sizing { min, max, last_call: s, backup: s, order: RankOrder::Segment, segment_size: Some(2) }
    }

    /// `node` of `segment`, arrived at `created`, member `last = (round, rank)` if given.
    fn cand(
        node: &str,
        segment: &str,
        created: crate::kv::Revision,
        last: Option<(u64, usize)>,
    ) -> Candidate {
        let p = Participant {
            node: node.into(),
            addr: "h".into(),
            pid: 1,
            port: None,
            segment: Some(segment.into()),
        };
        let last = last.map(|(version, rank)| LastRound { version, rank });
        Candidate { joiner: p.joiner(last, None), created }
    }

    fn nodes(action: FreezeAction) -> Vec<String> {
        match action {
            FreezeAction::Freeze(ps) => ps.iter().map(|p| p.node.clone()).collect(),
            other => panic!("expected a freeze, got {other:?}"),
        }
    }

    /// Round 5 was a, b (s1) then c, d (s2).
    fn round_5() -> SegmentRuns {
        SegmentRuns(vec![("s1".into(), 2), ("s2".into(), 2)])
    }

    fn after_round_5(candidates: Vec<Candidate>, sizing: &Sizing) -> FreezeAction {
        decide_freeze(candidates, Some(5), &[], Trigger::Timer, sizing, Some(&round_5()))
    }

    #[test]
    fn a_first_round_admits_complete_segments_in_blocks_in_order_of_first_arrival() {
        let arrivals = || {
            vec![
                cand("a", "s1", 1, None),
                cand("b", "s2", 2, None),
                cand("c", "s1", 3, None),
                cand("x", "s3", 4, None),
                cand("e", "s2", 5, None),
            ]
        };
        let full = decide_freeze(arrivals(), None, &[], Trigger::Full, &pairs(4, 4), None);
        assert_eq!(nodes(full), ["a", "c", "b", "e"]);
        // Four joiners, but one complete segment: wait for one to come or go.
        let mut four = arrivals();
        four.pop();
        assert_eq!(
            decide_freeze(four, None, &[], Trigger::Full, &pairs(4, 4), None),
            FreezeAction::AwaitSegments { count: 4 }
        );
        // A smaller world takes the one complete segment, but only at its last call: four
        // joiners in one complete segment do not fill a round of four.
        let mut four = arrivals();
        four.pop();
        assert_eq!(
            nodes(decide_freeze(four.clone(), None, &[], Trigger::Timer, &pairs(2, 4), None)),
            ["a", "c"]
        );
        assert_eq!(
            decide_freeze(four, None, &[], Trigger::Full, &pairs(2, 4), None),
            FreezeAction::AwaitJoiners { count: 4 }
        );
        let three = arrivals().into_iter().take(3).collect();
        assert_eq!(
            decide_freeze(three, None, &[], Trigger::Timer, &pairs(4, 4), None),
            FreezeAction::AwaitJoiners { count: 3 }
        );
    }

    /// After round 5, b (s1) dead: a, c and d come back, and x and y (a complete s3) wait.
    fn b_dead_and_a_spare_pair() -> Vec<Candidate> {
        vec![
            cand("a", "s1", 1, Some((5, 0))),
            cand("c", "s2", 2, Some((5, 2))),
            cand("d", "s2", 3, Some((5, 3))),
            cand("x", "s3", 4, None),
            cand("y", "s3", 5, None),
        ]
    }

    #[test]
    fn a_spare_of_the_dead_members_segment_takes_its_rank() {
        // n (s1) fills b's place; the complete s3 pair has no room.
        let mut candidates = b_dead_and_a_spare_pair();
        candidates.push(cand("n", "s1", 6, None));
        assert_eq!(nodes(after_round_5(candidates, &pairs(4, 4))), ["a", "n", "c", "d"]);
    }

    #[test]
    fn an_incomplete_segment_leaves_whole_and_a_complete_spare_segment_takes_its_block() {
        assert_eq!(nodes(after_round_5(b_dead_and_a_spare_pair(), &pairs(2, 4))), ["x", "y", "c", "d"]);
    }

    #[test]
    fn without_a_complete_spare_segment_the_world_shrinks_by_a_segment_or_waits() {
        let survivors = || {
            vec![
                cand("a", "s1", 1, Some((5, 0))),
                cand("b", "s1", 2, Some((5, 1))),
                cand("c", "s2", 3, Some((5, 2))),
                cand("x", "s3", 4, None),
            ]
        };
        // d died: its segment's block goes; a, b keep theirs.
        assert_eq!(nodes(after_round_5(survivors(), &pairs(2, 4))), ["a", "b"]);
        assert_eq!(after_round_5(survivors(), &pairs(4, 4)), FreezeAction::AwaitSegments { count: 4 });
        // b died instead: the s2 block is beyond the world of one block, so it moves.
        let moved = vec![
            cand("a", "s1", 1, Some((5, 0))),
            cand("c", "s2", 3, Some((5, 2))),
            cand("d", "s2", 4, Some((5, 3))),
        ];
        assert_eq!(nodes(after_round_5(moved, &pairs(2, 4))), ["c", "d"]);
    }

    #[test]
    fn a_segment_whose_members_all_died_is_replaced_by_a_complete_segment_of_its_own_first() {
        let candidates = vec![
            cand("c", "s2", 1, Some((5, 2))),
            cand("d", "s2", 2, Some((5, 3))),
            cand("x", "s3", 3, None),
            cand("y", "s3", 4, None),
            cand("m", "s1", 5, None),
            cand("n", "s1", 6, None),
        ];
        assert_eq!(nodes(after_round_5(candidates, &pairs(4, 4))), ["m", "n", "c", "d"]);
    }
}
