//! The guarantees of docs/PROTOCOL.md, checked on a world's records: one function per
//! property, each naming itself in what it reports ([`Violation::property`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdzv_core::{RendezvousInfo, RoundBroken};

use super::{
    Failure, KEYS_CONSTANT, KEYS_PER_WORKER, PIECES_PER_WORKER, Record, SLACK, TIMEOUT, World, healed_bound,
    rerun_bound,
};

/// A guarantee a world broke.
#[derive(Debug)]
pub struct Violation {
    /// A short name of the property.
    pub property: &'static str,
    pub message: String,
}

macro_rules! ensure {
    ($v:expr, $property:literal, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $v.push(Violation { property: $property, message: format!($($fmt)+) });
        }
    };
}

/// Checks every guarantee on the records of `world`; panics listing the broken ones.
pub fn check(world: &World, records: &[Record]) {
    let broken = violations(world, records);
    if broken.is_empty() {
        return;
    }
    let names: BTreeSet<&str> = broken.iter().map(|v| v.property).collect();
    let mut text = format!("broken: {names:?}\n");
    for name in &names {
        for v in broken.iter().filter(|v| v.property == *name).take(3) {
            text.push_str(&format!("- {}: {}\n", v.property, v.message));
        }
    }
    panic!("{text}");
}

/// One property's check: what the world broke of it.
type Property = fn(&Facts) -> Vec<Violation>;

/// Every property, each its own function (see their docs).
const PROPERTIES: &[Property] = &[
    deadline,
    error_kinds,
    healed_calls_succeed,
    closed_propagates,
    shutdown_prompt,
    shutdown_cancels_pending_call,
    bounds,
    agreement,
    unique_node_ids,
    monotonic,
    completeness,
    told_why,
    no_false_death,
    failure_detection,
    calm_liveness,
    healed_liveness,
    rerun_liveness,
    stable_ranks,
    segments_carried,
    first_round_by_segment,
    first_round_by_node_index,
    whole_blocks,
    settles,
    key_count,
];

/// Every guarantee `world` broke, by its records.
pub fn violations(world: &World, records: &[Record]) -> Vec<Violation> {
    let facts = Facts::of(world, records);
    PROPERTIES.iter().flat_map(|property| property(&facts)).collect()
}

/// What the records say, gathered once for every property.
struct Facts<'a> {
    world: &'a World,
    records: &'a [Record],
    /// When the run was closed, if it was.
    closed_at: Option<Duration>,
    /// When the world ended.
    end: Duration,
    /// The rounds returned, by version: who returned each, what, and when.
    rounds: BTreeMap<u64, Vec<(usize, &'a RendezvousInfo, Duration)>>,
    /// The rounds each worker returned, in order.
    versions_of: BTreeMap<usize, Vec<u64>>,
}

impl<'a> Facts<'a> {
    fn of(world: &'a World, records: &'a [Record]) -> Facts<'a> {
        let mut rounds: BTreeMap<u64, Vec<_>> = BTreeMap::new();
        let mut versions_of: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for r in records {
            if let Record::Call { worker, returned, result: Ok(info), .. } = r {
                rounds.entry(info.version).or_default().push((*worker, info, *returned));
                versions_of.entry(*worker).or_default().push(info.version);
            }
        }
        let closed_at = records.iter().find_map(|r| match r {
            Record::Closed { at } => Some(*at),
            _ => None,
        });
        let end = records
            .iter()
            .find_map(|r| match r {
                Record::End { at } => Some(*at),
                _ => None,
            })
            .expect("the world has an end");
        Facts { world, records, closed_at, end, rounds, versions_of }
    }

    fn node(w: usize) -> String {
        format!("w{w}")
    }

    fn worker_of(node: &str) -> usize {
        node.strip_prefix('w').and_then(|s| s.parse().ok()).expect("a node id of this world")
    }

    fn killed_at(&self, w: usize) -> Option<Duration> {
        self.records.iter().find_map(|r| match r {
            Record::Killed { worker, at } if *worker == w => Some(*at),
            _ => None,
        })
    }

    /// When worker `w`'s shutdown started and returned, and whether it succeeded.
    fn shutdown_of(&self, w: usize) -> Option<(Duration, Duration, bool)> {
        self.records.iter().find_map(|r| match r {
            Record::Shutdown { worker, started, returned, ok } if *worker == w => {
                Some((*started, *returned, *ok))
            }
            _ => None,
        })
    }

    /// Worker `w`'s calls that returned: when each started and returned, and what it gave.
    fn calls_of(
        &self,
        w: usize,
    ) -> impl Iterator<Item = (Duration, Duration, &'a Result<RendezvousInfo, Failure>)> + use<'a> {
        self.records.iter().filter_map(move |r| match r {
            Record::Call { worker, started, returned, result } if *worker == w => {
                Some((*started, *returned, result))
            }
            _ => None,
        })
    }

    /// Every call's start, including a call still pending when the world ended.
    fn starts_of(&self, w: usize) -> impl Iterator<Item = Duration> + use<'a> {
        self.records.iter().filter_map(move |r| match r {
            Record::Call { worker, started, .. } | Record::Cancelled { worker, started, .. }
                if *worker == w =>
            {
                Some(*started)
            }
            _ => None,
        })
    }

    /// Every call that returned: its worker, start, return and result.
    fn calls(
        &self,
    ) -> impl Iterator<Item = (usize, Duration, Duration, &'a Result<RendezvousInfo, Failure>)> + use<'a>
    {
        self.records.iter().filter_map(|r| match r {
            Record::Call { worker, started, returned, result } => {
                Some((*worker, *started, *returned, result))
            }
            _ => None,
        })
    }

    /// The records about worker `w` (and the world's own), one line each.
    fn history(&self, w: usize) -> Vec<String> {
        history(self.records, w)
    }
}

/// `deadline`: every call returns by its deadline (plus slack).
fn deadline(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for (w, started, returned, _) in f.calls() {
        ensure!(
            v,
            "deadline",
            returned - started <= TIMEOUT + SLACK,
            "worker {w}: a call took {:?}",
            returned - started
        );
    }
    v
}

/// `error-kinds`: a call fails only with `Closed`, `Shutdown`, `Timeout`, or — on a faulty or
/// dead link — `Unavailable`/`LeaseLost`; nothing else (no `State`, no raw backend error).
fn error_kinds(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for (w, started, _, result) in f.calls() {
        match result {
            Err(Failure::Other(e)) => ensure!(v, "error-kinds", false, "worker {w}: unexpected error {e}"),
            Err(Failure::Unavailable | Failure::LeaseLost) if started < f.world.heal() => ensure!(
                v,
                "error-kinds",
                f.world.faulty(w) || f.killed_at(w).is_some(),
                "worker {w}: {result:?} on a clean link"
            ),
            _ => {}
        }
    }
    v
}

/// `healed-calls-succeed`: when enough workers stay to form a round, a call begun after
/// healing never fails (least of all by timing out), and a handler can be made.
fn healed_calls_succeed(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let heal = f.world.heal();
    for (w, started, returned, result) in f.calls() {
        if started >= heal
            && matches!(result, Err(Failure::Timeout | Failure::Unavailable | Failure::LeaseLost))
        {
            ensure!(
                v,
                "healed-calls-succeed",
                !f.world.owes_liveness(),
                "worker {w}: a call started at {started:?}, after healing at {heal:?}, failed at {returned:?}: {result:?}"
            );
        }
    }
    for r in f.records {
        if let Record::HandlerFailed { worker, at, error } = r {
            ensure!(
                v,
                "healed-calls-succeed",
                *at <= heal + SLACK,
                "worker {worker}: no handler at {at:?}, after healing at {heal:?}: {error}"
            );
        }
    }
    v
}

/// `closed-propagates`: calls begun after the close fail with `Closed`; pending ones end
/// within slack of it.
fn closed_propagates(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let Some(tc) = f.closed_at else { return v };
    for (w, started, returned, result) in f.calls() {
        if f.world.faulty(w) && started < f.world.heal() {
            continue;
        }
        if started > tc + SLACK {
            ensure!(
                v,
                "closed-propagates",
                matches!(result, Err(Failure::Closed | Failure::Shutdown)),
                "worker {w}: {result:?} in a call started at {started:?}, after the close at {tc:?}"
            );
        } else if returned > tc {
            ensure!(
                v,
                "closed-propagates",
                returned <= tc + SLACK,
                "worker {w}: returned {:?} after the close",
                returned - tc
            );
        }
    }
    v
}

/// `shutdown-prompt`: `shutdown()` returns within slack, even while a call is pending.
fn shutdown_prompt(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for w in 0..f.world.plans.len() {
        if let Some((started, returned, _)) = f.shutdown_of(w) {
            ensure!(
                v,
                "shutdown-prompt",
                returned - started <= SLACK,
                "worker {w}: shutdown took {:?}",
                returned - started
            );
        }
    }
    v
}

/// `shutdown-cancels-pending-call`: a call pending when shutdown started then fails with
/// `Shutdown` (or `Closed`, when the run was closed at that moment) within slack, and never
/// returns a round after the shutdown began.
fn shutdown_cancels_pending_call(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for r in f.records {
        let Record::Call { worker: w, started, returned, result } = r else { continue };
        let Some((s_started, _, _)) = f.shutdown_of(*w).filter(|(s, _, _)| returned > s) else { continue };
        ensure!(
            v,
            "shutdown-cancels-pending-call",
            // `Closed` if the run was closed at the same moment: terminal either way.
            matches!(result, Err(Failure::Shutdown | Failure::Closed)),
            "worker {w}: shutdown started at {s_started:?}; its call {started:?}..{returned:?} gave {}",
            brief(r)
        );
        ensure!(
            v,
            "shutdown-cancels-pending-call",
            *returned <= s_started.max(*started) + SLACK,
            "worker {w}: shut down at {s_started:?}, its call returned at {returned:?}"
        );
    }
    v
}

/// `bounds`: every returned round has `min ≤ W ≤ max`, and W participants.
fn bounds(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for members in f.rounds.values() {
        for (_, info, _) in members {
            ensure!(
                v,
                "bounds",
                f.world.min <= info.world_size && info.world_size <= f.world.max,
                "W = {}",
                info.world_size
            );
            ensure!(
                v,
                "bounds",
                info.participants.len() == info.world_size,
                "round {}: {} participants, W = {}",
                info.version,
                info.participants.len(),
                info.world_size
            );
        }
    }
    v
}

/// `agreement`: every member of a round got the same participants, its rank names it, and
/// no rank is given twice.
fn agreement(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for (version, members) in &f.rounds {
        let first = members[0].1;
        let mut ranks = BTreeSet::new();
        for (worker, info, _) in members {
            ensure!(
                v,
                "agreement",
                info.participants.get(info.rank).is_some_and(|p| p.node == Facts::node(*worker)),
                "round {version}: rank {} does not name its holder, worker {worker}",
                info.rank
            );
            ensure!(
                v,
                "agreement",
                info.participants == first.participants,
                "round {version}: participants differ"
            );
            ensure!(
                v,
                "agreement",
                ranks.insert(info.rank),
                "round {version}: rank {} twice (worker {worker})",
                info.rank
            );
        }
    }
    v
}

/// `unique-node-ids`: no round lists a node id twice.
fn unique_node_ids(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for (version, members) in &f.rounds {
        let participants = &members[0].1.participants;
        let nodes: BTreeSet<_> = participants.iter().map(|p| &p.node).collect();
        ensure!(v, "unique-node-ids", nodes.len() == participants.len(), "round {version}: a node id twice");
    }
    v
}

/// `monotonic`: a worker's rounds strictly increase (it never gets back a round it left).
fn monotonic(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for (worker, versions) in &f.versions_of {
        ensure!(
            v,
            "monotonic",
            versions.windows(2).all(|w| w[0] < w[1]),
            "worker {worker}: rounds {versions:?}"
        );
    }
    v
}

/// `completeness`: every participant of a completed round returned it, died, shut down, or
/// its call pending at that moment failed, or was cut by the world's end right after, or —
/// on a faulty link, begun before healing — lost track of the round, which then ended.
fn completeness(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for (version, members) in &f.rounds {
        let completed = members.iter().map(|(_, _, at)| *at).min().unwrap_or_default();
        for p in members[0].1.participants.iter() {
            let w = Facts::worker_of(&p.node);
            if f.versions_of.get(&w).is_some_and(|v| v.contains(version))
                || f.killed_at(w).is_some()
                || f.shutdown_of(w).is_some()
            {
                continue;
            }
            // The call of `w` pending when the round completed: the last one begun before it
            // (`None` as its result: still pending when the world ended).
            let cancelled = f.records.iter().filter_map(|r| match r {
                Record::Cancelled { worker, started, .. } if *worker == w => Some((*started, None)),
                _ => None,
            });
            let pending = f
                .calls_of(w)
                .map(|(s, _, r)| (s, Some(r)))
                .chain(cancelled)
                .filter(|(s, _)| *s <= completed)
                .max_by_key(|(s, _)| *s);
            let failed = pending.is_some_and(|(_, r)| r.is_some_and(|r| r.is_err()));
            // Frozen in just before the world ended, its call cut before it could return.
            let cut = completed + SLACK >= f.end && pending.is_some_and(|(_, r)| r.is_none());
            // A fault before healing (a lost answer, a dropped watch) may send a confirmed
            // member back to the start, from where it can no longer see the round if it ended
            // meanwhile; it then goes on to a later one. A round is over once a later one
            // completed, a member was told it broke, or a member re-entered (which ends it).
            let ended = f.rounds.keys().any(|later| later > version)
                || f.records.iter().any(|r| matches!(r, Record::Broken { version: b, .. } if b == version))
                || members.iter().any(|(m, _, got)| f.starts_of(*m).any(|s| s > *got));
            let faulted = f.world.faulty(w)
                && ended
                && pending.is_some_and(|(s, r)| {
                    s < f.world.heal() && r.is_none_or(|r| r.as_ref().is_ok_and(|i| i.version > *version))
                });
            ensure!(
                v,
                "completeness",
                failed || cut || faulted,
                "round {version} (completed at {completed:?}) lists worker {w} ({:?}), which never returned it \
                 (its call pending then: {:?}); its history: {:#?}",
                f.world.plans[w],
                pending.map(|(s, r)| (s, r.map(|r| r.as_ref().map(|i| i.version)))),
                f.history(w)
            );
        }
    }
    v
}

/// `told-why`: a member is told why its round ended: never "no round", never "left" unless
/// it shut down.
fn told_why(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for r in f.records {
        let Record::Broken { worker, version, at, reason } = r else { continue };
        let left =
            matches!(reason, RoundBroken::Left) && f.shutdown_of(*worker).is_some_and(|(s, _, _)| s <= *at);
        ensure!(
            v,
            "told-why",
            left || !matches!(reason, RoundBroken::NoRound | RoundBroken::Left),
            "worker {worker}: told {reason:?} at {at:?} about round {version}; its history: {:#?}",
            f.history(*worker)
        );
    }
    v
}

/// `no-false-death`: a member is never told that a member is gone while that member, on a
/// clean link, is alive and still holding the round.
fn no_false_death(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for r in f.records {
        let Record::Broken { worker, version, at, reason: RoundBroken::MemberGone { rank: Some(rank) } } = r
        else {
            continue;
        };
        let Some(p) = f.rounds.get(version).and_then(|m| m[0].1.participants.get(*rank)) else { continue };
        let g = Facts::worker_of(&p.node);
        // At the end of the world every worker goes (dropping its handler revokes its lease).
        let went = *at >= f.end
            || f.killed_at(g).is_some_and(|k| k <= *at)
            || f.shutdown_of(g).is_some_and(|(s, _, _)| s <= *at)
            || f.starts_of(g).any(|s| {
                s <= *at
                    && f.calls_of(g)
                        .any(|(s0, _, r)| s0 < s && r.as_ref().is_ok_and(|i| i.version == *version))
            })
            || !f.versions_of.get(&g).is_some_and(|v| v.contains(version));
        ensure!(
            v,
            "no-false-death",
            went || f.world.faulty(g),
            "worker {worker} was told at {at:?} that worker {g} (rank {rank} of round {version}) is gone, \
             but it was alive and holding the round; its history: {:#?}",
            f.history(g)
        );
    }
    v
}

/// `failure-detection`: members on clean links still holding a round are told of a member's
/// death within its TTL, of its leave within slack (a TTL if the leave failed).
fn failure_detection(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let ttl = f.world.ttl();
    for w in 0..f.world.plans.len() {
        let gone_at = match (f.killed_at(w), f.shutdown_of(w)) {
            (Some(k), _) => Some((k, k + ttl)),
            (None, Some((s, e, ok))) => Some((s, if ok { e } else { e + ttl })),
            _ => None,
        };
        let Some((gone, deadline)) = gone_at else { continue };
        let bound = deadline + SLACK;
        for (version, members) in &f.rounds {
            if !members[0].1.participants.iter().any(|p| p.node == Facts::node(w)) {
                continue;
            }
            for (j, _, joined) in members {
                if *j == w || f.world.faulty(*j) || *joined > bound {
                    continue;
                }
                // Only members still holding the round at the bound are owed the news.
                let left_before = f.starts_of(*j).any(|s| s > *joined && s <= bound)
                    || f.killed_at(*j).is_some_and(|k| k <= bound)
                    || f.shutdown_of(*j).is_some_and(|(s, _, _)| s <= bound);
                if left_before || f.end < bound {
                    continue;
                }
                let told = f.records.iter().find_map(|r| match r {
                    Record::Broken { worker, version: v, at, .. } if worker == j && v == version => Some(*at),
                    _ => None,
                });
                ensure!(
                    v,
                    "failure-detection",
                    told.is_some_and(|t| t <= bound),
                    "worker {j} (round {version}, since {joined:?}) was told of worker {w}'s end at {gone:?} \
                     only at {told:?}, bound {bound:?}; histories: {:#?} {:#?}",
                    f.history(*j),
                    f.history(w)
                );
            }
        }
    }
    v
}

/// `calm-liveness`: in a calm world the first round completes within the last call of the
/// `min`-th arrival (plus round trips).
fn calm_liveness(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let world = f.world;
    let mut by_arrival: Vec<usize> = (0..world.plans.len()).collect();
    by_arrival.sort_by_key(|&w| world.plans[w].arrive_ms);
    // The arrival that makes `min` workers a round could take (whole segments, with a size).
    let enough = (1..=by_arrival.len()).find(|&n| world.admissible(&by_arrival[..n]) >= world.min);
    if let Some(n) = enough.filter(|_| world.calm()) {
        let t_min = Duration::from_millis(world.plans[by_arrival[n - 1]].arrive_ms);
        let first = f.rounds.values().flatten().map(|(_, _, at)| *at).min();
        let bound = t_min + world.last_call() + SLACK;
        ensure!(
            v,
            "calm-liveness",
            first.is_some_and(|t| t <= bound),
            "first round at {first:?}, bound {bound:?}"
        );
    }
    v
}

/// `healed-liveness`: once healed, every stayer completes a round within [`healed_bound`]
/// (all of them if they fit in a round, else at least `max`).
fn healed_liveness(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let (world, heal) = (f.world, f.world.heal());
    if !world.owes_liveness() {
        return v;
    }
    let bound = healed_bound(world);
    let mut late = Vec::new();
    let mut done = 0;
    for &w in &world.stayers() {
        let from = heal.max(Duration::from_millis(world.plans[w].arrive_ms));
        let first = f.calls_of(w).find_map(|(_, ret, r)| (r.is_ok() && ret >= heal).then_some(ret));
        if first.is_some_and(|t| t <= from + bound) {
            done += 1;
        } else {
            late.push((w, first, from + bound));
        }
    }
    ensure!(
        v,
        "healed-liveness",
        done >= world.owed_witnesses(),
        "after healing at {heal:?}, only {done} of {} stayers completed a round in time \
         (owed {}); late (worker, first round, bound): {late:?}; records:\n{}",
        world.stayers().len(),
        world.owed_witnesses(),
        f.records.iter().map(brief).collect::<Vec<_>>().join("\n")
    );
    v
}

/// `rerun-liveness`: the members of the latest round, re-entering together once all
/// completed one after healing, complete again within [`rerun_bound`] (spares keep waiting;
/// with whole segments, so do the members left over from a segment that lost one).
fn rerun_liveness(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let world = f.world;
    if !world.owes_liveness() {
        return v;
    }
    let Some((rerun_at, members)) = f.records.iter().find_map(|r| match r {
        Record::Rerun { at, members } => Some((*at, members)),
        _ => None,
    }) else {
        return v;
    };
    let bound = rerun_at + rerun_bound(world);
    let stayers: Vec<usize> = members.iter().copied().filter(|w| world.stayers().contains(w)).collect();
    let mut late = Vec::new();
    for &w in &stayers {
        let again = f.calls_of(w).find_map(|(s, ret, r)| (s >= rerun_at && r.is_ok()).then_some(ret));
        if again.is_none_or(|t| t > bound) {
            late.push((w, again));
        }
    }
    // With whole segments, the stayers left over from a segment that lost a member wait as
    // spares: only those that make whole segments are owed a round.
    let owed = world.admissible(&stayers);
    ensure!(
        v,
        "rerun-liveness",
        stayers.len() - late.len() >= owed,
        "of the {} members that re-entered at {rerun_at:?} and stay, {} completed again by {bound:?} \
         (owed {owed}); late (worker, completed again): {late:?}",
        stayers.len(),
        stayers.len() - late.len()
    );
    v
}

/// `stable-ranks`: a worker that returned a round and the next final round of the run keeps
/// its rank in it while the rank is below the new world size (the survivors of a round keep
/// their ranks; spares and newcomers only fill holes). With whole segments, the members of a
/// block all of whom returned both rounds (an untouched segment) keep their ranks; a block
/// that lost a member may leave whole.
fn stable_ranks(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut finals: Vec<(u64, &Vec<String>)> = f
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Final { version, participants, .. } => Some((*version, participants)),
            _ => None,
        })
        .collect();
    finals.sort_by_key(|(version, _)| *version);
    let returned = |node: &String, version| {
        f.versions_of.get(&Facts::worker_of(node)).is_some_and(|vs| vs.contains(&version))
    };
    for pair in finals.windows(2) {
        let ((v1, before), (v2, after)) = (pair[0], pair[1]);
        for (rank, node) in before.iter().enumerate() {
            let w = Facts::worker_of(node);
            let untouched = match f.world.segment_size {
                Some(k) => before
                    .chunks(k)
                    .nth(rank / k)
                    .is_some_and(|block| block.iter().all(|n| returned(n, v1) && returned(n, v2))),
                None => returned(node, v1) && returned(node, v2),
            };
            if !untouched || rank >= after.len() {
                continue;
            }
            ensure!(
                v,
                "stable-ranks",
                after.get(rank) == Some(node),
                "worker {w} was rank {rank} of round {v1} ({before:?}) and is in round {v2} of {} at rank {:?} ({after:?})",
                after.len(),
                after.iter().position(|n| n == node)
            );
        }
    }
    v
}

/// `segments-carried`: every participant of every round returned carries the segment its
/// worker named (or none).
fn segments_carried(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for (version, returned) in &f.rounds {
        for (w, info, _) in returned {
            for p in info.participants.iter() {
                let named = f.world.plans[Facts::worker_of(&p.node)].segment.map(|s| format!("s{s}"));
                ensure!(
                    v,
                    "segments-carried",
                    p.segment == named,
                    "worker {w}'s round {version} gives {} the segment {:?}; it named {named:?}",
                    p.node,
                    p.segment
                );
            }
        }
    }
    v
}

/// The run's first final round (no survivors, no round before to follow), as the state key
/// showed it: a [`Record::Final`].
fn first_final(records: &[Record]) -> Option<&Record> {
    records.iter().filter(|r| matches!(r, Record::Final { .. })).min_by_key(|r| match r {
        Record::Final { version, .. } => *version,
        _ => u64::MAX,
    })
}

/// `first-round-by-segment`: in the run's first final round (no survivors, no round before
/// to follow), the workers of each segment hold consecutive ranks.
fn first_round_by_segment(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let Some(Record::Final { version, segments, .. }) = first_final(f.records) else { return v };
    let mut runs: Vec<&Option<String>> = segments.iter().collect();
    runs.dedup();
    let mut distinct = runs.clone();
    distinct.sort();
    distinct.dedup();
    ensure!(
        v,
        "first-round-by-segment",
        runs.len() == distinct.len(),
        "round {version}, the first final one, splits a segment: segments by rank {segments:?}"
    );
    v
}

/// `first-round-by-node-index`: with `rank_order=slurm`, the run's first final round holds
/// its workers in the order of their node indexes, those without one last.
fn first_round_by_node_index(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    if !f.world.slurm_order {
        return v;
    }
    let Some(Record::Final { version, participants, .. }) = first_final(f.records) else { return v };
    let order: Vec<(bool, Option<u64>)> = participants
        .iter()
        .map(|node| f.world.plans[Facts::worker_of(node)].node_index)
        .map(|index| (index.is_none(), index))
        .collect();
    ensure!(
        v,
        "first-round-by-node-index",
        order.is_sorted(),
        "round {version}, the first final one, is not in node index order: {participants:?} have {:?}",
        order.iter().map(|(_, index)| index).collect::<Vec<_>>()
    );
    v
}

/// `whole-blocks`: with `segment_size = K`, every final round is whole blocks of `K` ranks,
/// each block's members all of one segment.
fn whole_blocks(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let Some(k) = f.world.segment_size else { return v };
    for r in f.records {
        let Record::Final { version, segments, .. } = r else { continue };
        ensure!(
            v,
            "whole-blocks",
            segments.len() % k == 0 && segments.chunks(k).all(|block| block.iter().all(|s| *s == block[0])),
            "round {version} is not whole blocks of {k} of one segment each: segments by rank {segments:?}"
        );
    }
    v
}

/// `settles`: after the rerun the group forms no further round within two settle windows
/// (agents re-enter whenever `num_nodes_waiting() > 0`, however many wait beyond `max`).
fn settles(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    let settled: Vec<(Duration, Option<u64>)> = f
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Settled { at, version } => Some((*at, *version)),
            _ => None,
        })
        .collect();
    if let [(t1, first), (t2, second)] = settled[..] {
        ensure!(
            v,
            "settles",
            first == second,
            "the healed group formed rounds {first:?} (at {t1:?}) → {second:?} (at {t2:?}) without any fault: a livelock"
        );
    }
    v
}

/// `key-count`: the keys under the run stay within [`KEYS_PER_WORKER`] per worker and
/// [`KEYS_CONSTANT`], the pieces of member lists aside; those within
/// [`PIECES_PER_WORKER`] per worker in each round.
fn key_count(f: &Facts) -> Vec<Violation> {
    let mut v = Vec::new();
    for r in f.records {
        if let Record::Keys { at, count, workers, by_part } = r {
            let pieces = by_part.iter().filter(|(part, _)| part.ends_with("/members"));
            let limit = KEYS_PER_WORKER * *workers as u64 + KEYS_CONSTANT;
            let others = count - pieces.clone().map(|(_, n)| n).sum::<u64>();
            ensure!(
                v,
                "key-count",
                others <= limit,
                "{others} keys under the run (pieces aside) at {at:?} ({workers} workers; limit {limit}): {by_part:?}"
            );
            let pieces_limit = PIECES_PER_WORKER * *workers as u64;
            for (round, n) in pieces {
                ensure!(
                    v,
                    "key-count",
                    *n <= pieces_limit,
                    "{n} pieces of member lists under {round} at {at:?} ({workers} workers; limit {pieces_limit}): {by_part:?}"
                );
            }
        }
    }
    v
}

/// The records about one worker (and the world's own), one line each, for failure messages.
fn history(records: &[Record], w: usize) -> Vec<String> {
    records
        .iter()
        .filter(|r| match r {
            Record::Call { worker, .. }
            | Record::Cancelled { worker, .. }
            | Record::Killed { worker, .. }
            | Record::Shutdown { worker, .. }
            | Record::Broken { worker, .. }
            | Record::HandlerFailed { worker, .. } => *worker == w,
            _ => true,
        })
        .map(brief)
        .collect()
}

/// One line about a record.
pub fn brief(r: &Record) -> String {
    match r {
        Record::Call { worker, started, returned, result: Ok(info) } => {
            let nodes: Vec<&str> = info.participants.iter().map(|p| p.node.as_str()).collect();
            format!(
                "w{worker} call {started:?}..{returned:?}: round {} rank {} of {nodes:?}",
                info.version, info.rank
            )
        }
        Record::Call { worker, started, returned, result: Err(e) } => {
            format!("w{worker} call {started:?}..{returned:?}: {e:?}")
        }
        other => format!("{other:?}"),
    }
}
