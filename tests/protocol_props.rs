//! Property tests of the rendezvous protocol (docs/PROTOCOL.md "Guarantees") on the in-memory
//! backend under a paused clock: generated worlds of 1–64 workers with random `min ≤ max`,
//! arrival times, deaths (a cut link: the lease expires on the server), graceful leaves,
//! re-entries, a close, slow links and injected backend errors. Every case checks
//! agreement, bounds, unique ranks, monotonic rounds, deadlines, failure detection, closed
//! propagation and (in calm worlds) liveness.
//!
//! Cases: `PROPTEST_CASES` (default 1000). A failing case prints its world; proptest also
//! prints the seed to reproduce it.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use rdzv::core::{Kv, RendezvousError, RendezvousHandler, RendezvousInfo, RendezvousParams, RoundBroken};
use rdzv_mem::{FaultyKv, Latency, MemKv};
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(20);
/// The longest a generated world may run (virtual time) before it counts as a hang.
const WORLD_LIMIT: Duration = Duration::from_secs(1800);

#[derive(Clone, Copy, Debug)]
enum Fate {
    /// Stays; re-enters after holding its round, or when told the round broke.
    Stay,
    /// Dies this long after its first round completes (its link is cut, no goodbye).
    DieAfter(u64),
    /// Leaves gracefully (shutdown) this long after its first round completes.
    LeaveAfter(u64),
}

#[derive(Clone, Debug)]
struct Plan {
    arrive_ms: u64,
    fate: Fate,
    latency_ms: u64,
    flaky: bool,
    calls: usize,
}

#[derive(Clone, Debug)]
struct World {
    min: usize,
    max: usize,
    last_call_ms: u64,
    ttl_s: u64,
    plans: Vec<Plan>,
    close_at_ms: Option<u64>,
}

impl World {
    fn calm(&self) -> bool {
        self.close_at_ms.is_none() && self.plans.iter().all(|p| matches!(p.fate, Fate::Stay) && !p.flaky)
    }

    fn hold(&self) -> Duration {
        Duration::from_secs(2 * self.ttl_s + 3)
    }
}

fn plan(calm: bool) -> impl Strategy<Value = Plan> {
    let fate = if calm {
        Just(Fate::Stay).boxed()
    } else {
        prop_oneof![6 => Just(Fate::Stay), 2 => (0u64..5000).prop_map(Fate::DieAfter), 1 => (0u64..5000).prop_map(Fate::LeaveAfter)].boxed()
    };
    let flaky = if calm { Just(false).boxed() } else { prop::bool::weighted(0.15).boxed() };
    (0u64..4000, fate, prop_oneof![Just(0u64), 1u64..50], flaky, 1usize..=3).prop_map(
        |(arrive_ms, fate, latency_ms, flaky, calls)| Plan { arrive_ms, fate, latency_ms, flaky, calls },
    )
}

fn world() -> impl Strategy<Value = World> {
    let n = prop_oneof![6 => 1usize..=8, 3 => 9usize..=24, 1 => 25usize..=64];
    (n, any::<bool>(), prop::bool::weighted(0.4)).prop_flat_map(|(n, calm, sized_to_max)| {
        (1..=n).prop_flat_map(move |min| {
            let max = if sized_to_max { (min..=n).boxed() } else { (min..=min + 4).boxed() };
            let close =
                if calm { Just(None).boxed() } else { prop::option::weighted(0.2, 0u64..15_000).boxed() };
            (Just(min), max, 200u64..3000, 2u64..6, prop::collection::vec(plan(calm), n), close).prop_map(
                |(min, max, last_call_ms, ttl_s, plans, close_at_ms)| World {
                    min,
                    max,
                    last_call_ms,
                    ttl_s,
                    plans,
                    close_at_ms,
                },
            )
        })
    })
}

#[derive(Debug)]
enum Record {
    Call { worker: usize, started: Duration, returned: Duration, result: Result<RendezvousInfo, String> },
    Killed { worker: usize, version: u64, at: Duration },
    Broken { worker: usize, version: u64, at: Duration, reason: RoundBroken },
    Closed { at: Duration },
}

type Log = Arc<Mutex<Vec<Record>>>;

fn params_for(world: &World, run: &str) -> RendezvousParams {
    let mut p = RendezvousParams::new(run, world.min, world.max).unwrap();
    p.timeout = TIMEOUT;
    p.last_call_timeout = Duration::from_millis(world.last_call_ms);
    p.keep_alive_ttl = Duration::from_secs(world.ttl_s);
    p
}

async fn run_worker(i: usize, plan: Plan, world: World, kv: Arc<dyn Kv>, log: Log, t0: Instant) {
    tokio::time::sleep(Duration::from_millis(plan.arrive_ms)).await;
    let link = FaultyKv::new(kv, i as u64);
    if plan.latency_ms > 0 {
        link.set_latency(Latency::Uniform {
            min: Duration::ZERO,
            max: Duration::from_millis(plan.latency_ms),
        });
    }
    if plan.flaky {
        link.set_failure_probability(0.03);
    }
    let mut p = params_for(&world, "prop");
    p.node_id = Some(format!("w{i}"));
    let mut handler = None;
    for _ in 0..50 {
        match RendezvousHandler::new(link.clone() as Arc<dyn Kv>, p.clone()).await {
            Ok(h) => {
                handler = Some(h);
                break;
            }
            Err(e) if plan.flaky => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("worker {i}: handler failed on a clean link: {e}"),
        }
    }
    let Some(h) = handler else { return };
    let now = || t0.elapsed();
    for _ in 0..plan.calls {
        let started = now();
        let result = h.next_rendezvous().await;
        let returned = now();
        let closed = matches!(result, Err(RendezvousError::Closed { .. }));
        if let Err(e) = &result {
            let expected = matches!(e, RendezvousError::Closed { .. } | RendezvousError::Timeout { .. })
                || (plan.flaky && matches!(e, RendezvousError::Unavailable(_) | RendezvousError::LeaseLost));
            assert!(expected, "worker {i}: unexpected error {e:?}");
        }
        let info = result.as_ref().ok().cloned();
        log.lock().unwrap().push(Record::Call {
            worker: i,
            started,
            returned,
            result: result.map_err(|e| e.to_string()),
        });
        if closed {
            return;
        }
        let Some(info) = info else { continue };
        match plan.fate {
            Fate::DieAfter(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                log.lock().unwrap().push(Record::Killed { worker: i, version: info.version, at: now() });
                link.set_failure_probability(1.0);
                link.drop_open_watches();
                // A dead process does not say goodbye: never drop the handler.
                std::mem::forget(h);
                return;
            }
            Fate::LeaveAfter(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let _ = h.shutdown().await;
                return;
            }
            Fate::Stay => {
                tokio::select! {
                    reason = h.round_broken() => {
                        log.lock().unwrap().push(Record::Broken { worker: i, version: info.version, at: now(), reason });
                    }
                    _ = tokio::time::sleep(world.hold()) => {}
                }
            }
        }
    }
    let _ = h.shutdown().await;
}

fn run_world(world: &World) -> Vec<Record> {
    let log: Log = Arc::default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    rt.block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (i, plan) in world.plans.iter().enumerate() {
            tasks.push(tokio::spawn(run_worker(i, plan.clone(), world.clone(), kv.clone(), log.clone(), t0)));
        }
        if let Some(at) = world.close_at_ms {
            let (kv, log, params) = (kv.clone(), log.clone(), params_for(world, "prop"));
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(at)).await;
                let closer = RendezvousHandler::new(kv, params).await.unwrap();
                closer.set_closed().await.unwrap();
                log.lock().unwrap().push(Record::Closed { at: t0.elapsed() });
            }));
        }
        let all = async {
            for t in tasks {
                if let Err(e) = t.await {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        };
        tokio::time::timeout(WORLD_LIMIT, all).await.expect("the world did not finish: something hangs");
    });
    drop(rt);
    std::mem::take(&mut *log.lock().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(1000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn guarantees_hold(world in world()) {
        let records = run_world(&world);
        check(&world, &records);
    }
}

fn check(world: &World, records: &[Record]) {
    let ttl = Duration::from_secs(world.ttl_s);
    let slack = Duration::from_secs(1);
    let node = |w: usize| format!("w{w}");
    let mut rounds: BTreeMap<u64, Vec<(usize, &RendezvousInfo, Duration)>> = BTreeMap::new();
    let mut versions_of: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    let closed_at = records.iter().find_map(|r| match r {
        Record::Closed { at } => Some(*at),
        _ => None,
    });
    for r in records {
        let Record::Call { worker, started, returned, result } = r else { continue };
        let plan = &world.plans[*worker];
        // Timeout: every call returns by its deadline plus at most one second.
        assert!(
            *returned - *started <= TIMEOUT + slack,
            "worker {worker}: a call took {:?}",
            *returned - *started
        );
        // Closed propagates: calls after the close fail with it, calls during it end soon.
        if let Some(tc) = closed_at
            && !plan.flaky
        {
            if *started > tc {
                assert!(
                    result.as_ref().is_err_and(|e| e.contains("closed")),
                    "worker {worker}: {result:?} after the close"
                );
            } else if *returned > tc {
                assert!(
                    *returned <= tc + 2 * slack,
                    "worker {worker}: returned {:?} after the close",
                    *returned - tc
                );
            }
        }
        if let Ok(info) = result {
            // Bounds, and the rank names this worker.
            assert!(world.min <= info.world_size && info.world_size <= world.max, "W = {}", info.world_size);
            assert_eq!(info.participants.len(), info.world_size);
            assert_eq!(info.participants[info.rank].node, node(*worker), "rank does not name its holder");
            rounds.entry(info.version).or_default().push((*worker, info, *returned));
            versions_of.entry(*worker).or_default().push(info.version);
        }
    }
    // Agreement: same W and participants; ranks unique.
    for (version, members) in &rounds {
        let first = members[0].1;
        let mut ranks = BTreeSet::new();
        for (worker, info, _) in members {
            assert_eq!(info.participants, first.participants, "round {version}: participants differ");
            assert!(ranks.insert(info.rank), "round {version}: rank {} twice (worker {worker})", info.rank);
        }
    }
    // A member waiting on its round is told why it ended, never "no round".
    for r in records {
        if let Record::Broken { worker, reason, .. } = r {
            assert!(
                !matches!(reason, RoundBroken::NoRound | RoundBroken::Left),
                "worker {worker}: {reason:?}"
            );
        }
    }
    // Monotonic rounds.
    for (worker, versions) in &versions_of {
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "worker {worker}: rounds {versions:?}");
    }
    // Failure detection: members still holding a round are told of a death within TTL + a round trip.
    for r in records {
        let Record::Killed { worker: dead, version, at } = r else { continue };
        let bound = *at + ttl + slack;
        for (j, _, joined) in rounds.get(version).into_iter().flatten() {
            let plan = &world.plans[*j];
            if j == dead
                || plan.flaky
                || !matches!(plan.fate, Fate::Stay)
                || *joined > *at
                || *joined + world.hold() <= bound
            {
                continue;
            }
            let told = records.iter().find_map(|r| match r {
                Record::Broken { worker, version: v, at, .. } if worker == j && v == version => Some(*at),
                _ => None,
            });
            assert!(
                told.is_some_and(|t| t <= bound),
                "worker {j} was told of worker {dead}'s death at {told:?}, bound {bound:?}"
            );
        }
    }
    // Liveness: in a calm world with at least `min` workers, a round completes within the
    // last call plus a few round trips of the `min`-th arrival.
    if world.calm() && world.plans.len() >= world.min {
        let mut arrivals: Vec<u64> = world.plans.iter().map(|p| p.arrive_ms).collect();
        arrivals.sort();
        let t_min = Duration::from_millis(arrivals[world.min - 1]);
        let first = rounds.values().flatten().map(|(_, _, at)| *at).min();
        let bound = t_min + Duration::from_millis(world.last_call_ms) + 2 * slack;
        assert!(first.is_some_and(|t| t <= bound), "first round at {first:?}, bound {bound:?}");
    }
}
