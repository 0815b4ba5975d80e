//! Who waits for the next round while one runs, and how many of them it could admit: what
//! `num_nodes_waiting` answers and `rdzv status` shows (docs/PROTOCOL.md "Spares").

use crate::error::RendezvousError;
use crate::ext::KvExt;
use crate::kv::{Kv, RangeOptions, RangeOrder};

use super::current::Current;
use super::keys::RunKeys;
use std::collections::HashSet;

use super::state::{Joiner, Participant, State};

/// The workers waiting for the round after the running one, and how many of them it could
/// admit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waiting {
    /// The running round (`None`: no round is running; then nobody counts as waiting).
    pub version: Option<u64>,
    /// Its members whose keep-alive keys exist.
    pub members_alive: usize,
    /// Its world size.
    pub world_size: usize,
    /// The largest world size, when known (the reader's `max_workers`, else the one the
    /// round's `final` value records).
    pub max_workers: Option<usize>,
    /// The waiting workers in the order the next round takes them: arrival in the run, except
    /// that with whole segments (`segment_size`) those the next round could admit come first.
    pub waiters: Vec<Joiner>,
    /// How many of `waiters`, from the first, the next round could admit: the room
    /// `max_workers` leaves beside the members still alive (all of them when `max_workers` is
    /// not known); with `segment_size`, only workers that fill a dead member's place in its
    /// segment's block, or that make complete segments in the room left. The rest are
    /// *spares*.
    pub admissible: usize,
}

impl Waiting {
    /// The waiters of the spares that are not admissible.
    pub fn spares(&self) -> &[Joiner] {
        &self.waiters[self.admissible.min(self.waiters.len())..]
    }

    /// Reads the run's state, the running round's keep-alive keys and its waiting keys.
    /// `max_workers` and `segment_size` are the reader's parameters, if it has them.
    pub async fn read(
        kv: &dyn Kv,
        keys: &RunKeys,
        max_workers: Option<usize>,
        segment_size: Option<usize>,
    ) -> Result<Waiting, RendezvousError> {
        let state = Current::read(kv, keys).await?.into_state();
        let Some(State::Final { version, participants, max_workers: recorded, .. }) = state else {
            return Ok(Waiting::default());
        };
        let members_alive = (kv.count(&keys.ranks(version), None).await? as usize).min(participants.len());
        let options = RangeOptions { order: RangeOrder::ByCreateRevision, ..RangeOptions::default() };
        let found = kv.range(&keys.waiting(version), options).await?;
        let mut waiters = Vec::with_capacity(found.kvs.len());
        for kv in &found.kvs {
            let joiner = Joiner::parse(&kv.key, &kv.value)?;
            let arrival = joiner.since.map_or(kv.create_revision, |since| since.min(kv.create_revision));
            waiters.push((arrival, kv.create_revision, joiner));
        }
        waiters.sort_by_key(|(arrival, created, _)| (*arrival, *created));
        let mut waiters: Vec<Joiner> = waiters.into_iter().map(|(_, _, joiner)| joiner).collect();
        let max_workers = max_workers.or(recorded);
        let room = max_workers.map_or(usize::MAX, |max| max.saturating_sub(members_alive));
        let admissible = match segment_size {
            Some(k) => {
                let holes = if members_alive < participants.len() {
                    dead_segments(kv, keys, version, &participants).await?
                } else {
                    Vec::new()
                };
                whole_segments_first(&mut waiters, k, holes, room)
            }
            None => waiters.len().min(room),
        };
        Ok(Waiting {
            version: Some(version),
            members_alive,
            world_size: participants.len(),
            max_workers,
            admissible,
            waiters,
        })
    }
}

/// The segments of the members of round `version` whose keep-alive keys are gone, one entry
/// per dead member.
async fn dead_segments(
    kv: &dyn Kv,
    keys: &RunKeys,
    version: u64,
    participants: &[Participant],
) -> Result<Vec<Option<String>>, RendezvousError> {
    let options = RangeOptions { keys_only: true, ..RangeOptions::default() };
    let prefix = keys.ranks(version);
    let alive: HashSet<usize> = kv
        .range(&prefix, options)
        .await?
        .kvs
        .iter()
        .filter_map(|kv| std::str::from_utf8(kv.key.get(prefix.len()..)?).ok()?.parse().ok())
        .collect();
    Ok(participants
        .iter()
        .enumerate()
        .filter(|(rank, _)| !alive.contains(rank))
        .map(|(_, p)| p.segment.clone())
        .collect())
}

/// Puts first the `waiters` (in arrival order) the next round of whole segments of `k`
/// could admit, and says how many: one per dead member's place (`holes`, their segments) by a
/// waiter of that segment, then the `k` earliest of each segment with `k` waiting, in order of
/// the segment's first arrival, as long as `room` allows.
fn whole_segments_first(
    waiters: &mut Vec<Joiner>,
    k: usize,
    mut holes: Vec<Option<String>>,
    room: usize,
) -> usize {
    let mut admitted = vec![false; waiters.len()];
    let mut room = room;
    for (i, w) in waiters.iter().enumerate() {
        if let Some(hole) = holes.iter().position(|segment| *segment == w.segment).filter(|_| room > 0) {
            holes.swap_remove(hole);
            admitted[i] = true;
            room -= 1;
        }
    }
    let unadmitted = waiters.iter().enumerate().filter(|(i, _)| !admitted[*i]);
    for (_, members) in super::segment_groups::by_segment(unadmitted, |(_, w)| w.segment.as_deref()) {
        for block in members.chunks_exact(k) {
            if room < k {
                break;
            }
            block.iter().for_each(|(i, _)| admitted[*i] = true);
            room -= k;
        }
    }
    let (mut first, rest): (Vec<_>, Vec<_>) =
        std::mem::take(waiters).into_iter().zip(&admitted).partition(|(_, a)| **a);
    let count = first.len();
    first.extend(rest);
    *waiters = first.into_iter().map(|(w, _)| w).collect();
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(node: &str, segment: &str) -> Joiner {
        Participant { node: node.into(), addr: "h".into(), pid: 1, port: None, segment: Some(segment.into()) }
            .joiner(None, None)
    }

    fn names(waiters: &[Joiner]) -> Vec<&str> {
        waiters.iter().map(|w| w.node.as_str()).collect()
    }

    #[test]
    fn waiters_that_make_whole_segments_or_fill_a_dead_members_place_come_first() {
        let all = || {
            vec![
                waiter("x", "s3"),
                waiter("a", "s1"),
                waiter("y", "s3"),
                waiter("b", "s1"),
                waiter("z", "s4"),
            ]
        };
        // Room for one segment of two: the first complete one (s3); z, alone, is a spare.
        let mut waiters = all();
        assert_eq!(whole_segments_first(&mut waiters, 2, Vec::new(), 2), 2);
        assert_eq!(names(&waiters), ["x", "y", "a", "b", "z"]);
        // A member of s4 died: z takes its place, and s3 the room left.
        let mut waiters = all();
        assert_eq!(whole_segments_first(&mut waiters, 2, vec![Some("s4".into())], 3), 3);
        assert_eq!(names(&waiters), ["x", "y", "z", "a", "b"]);
        // No room: nobody.
        let mut waiters = all();
        assert_eq!(whole_segments_first(&mut waiters, 2, Vec::new(), 1), 0);
        assert_eq!(names(&waiters), ["x", "a", "y", "b", "z"]);
    }
}
