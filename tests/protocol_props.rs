//! Property tests of the rendezvous protocol (docs/PROTOCOL.md "Guarantees") on the in-memory
//! backend under a paused clock: generated worlds of 1–64 workers (the engine and every
//! property are in `props/mod.rs`). Until a random heal time a world is hostile — links
//! that fail calls before the request or after it took effect (a lost answer), dropped
//! watches, latency, deaths, leaves racing pending calls, a close; afterwards every stayer
//! must complete a round within a bound (a timeout there fails the case), and again after
//! re-entering together. Every case also checks agreement, bounds, unique ranks and node
//! ids, monotonic rounds, completeness, deadlines, prompt shutdown, failure detection with
//! no false deaths, closed propagation and a bounded key count. In half the worlds the workers
//! name segments (1–4 labels at random): every guarantee holds with them, each member's label
//! reaches every round, and the first round keeps each segment's ranks together.
//!
//! Cases: `PROPTEST_CASES`, else 20000 with `RDZV_SOAK=1`, else 1000. A failing case prints
//! its world, shrunk, the broken properties with the records that show it, and the
//! `RDZV_PROPS_SEED` that generates the same worlds again. `RDZV_PROPS_SURVEY=<n>` tallies
//! the broken properties over `n` worlds instead.
#![allow(clippy::unwrap_used)]

mod props;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use rdzv_core::Kv;
use rdzv_mem::MemKv;

use props::{Shape, World};

/// The longest a generated world may run (virtual time) before it counts as a hang.
const WORLD_LIMIT: Duration = Duration::from_secs(1800);

fn cases() -> u32 {
    let soak = std::env::var("RDZV_SOAK").is_ok_and(|v| v == "1");
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(if soak {
        20_000
    } else {
        1000
    })
}

fn shape() -> Shape {
    Shape {
        small: 1..9,
        medium: 9..25,
        large: 25..65,
        ttl_ms: 2000..6000,
        last_call_ms: 200..3000,
        heal_ms: 1000..12_000,
        arrive_ms: 0..4000,
        calm: 0.25,
        allow_overflow: true,
        faulty: 0.35,
    }
}

fn run(world: &World) -> Vec<props::Record> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    let records = rt.block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        tokio::time::timeout(WORLD_LIMIT, props::run_world(world, kv, "prop"))
            .await
            .expect("the world did not finish: something hangs")
    });
    drop(rt);
    records
}

/// `RDZV_PROPS_SURVEY=<n>` (worlds from `RDZV_PROPS_SEED`, default random): instead of
/// stopping (and shrinking) at the first failing world, runs `n` worlds and reports how many
/// broke each property, with the smallest such world — to see at a glance which guarantees a
/// change breaks. Fails if any world broke any.
fn survey(n: u32) {
    use proptest::strategy::ValueTree;
    let seed = seed();
    let mut runner = runner(ProptestConfig::default(), seed);
    let strategy = props::worlds(shape());
    let mut tally: std::collections::BTreeMap<&str, (usize, World, String)> = Default::default();
    for _ in 0..n {
        let world = strategy.new_tree(&mut runner).unwrap().current();
        let records = run(&world);
        for v in props::check::violations(&world, &records) {
            let entry = tally.entry(v.property).or_insert((0, world.clone(), v.message.clone()));
            if entry.1.plans.len() > world.plans.len() {
                (entry.1, entry.2) = (world.clone(), v.message.clone());
            }
            entry.0 += 1;
        }
    }
    for (property, (count, world, message)) in &tally {
        println!("{property}: {count} violations; smallest world: {world:?}\n  {message}\n");
    }
    let counts: Vec<_> = tally.iter().map(|(p, (c, _, _))| (*p, *c)).collect();
    assert!(tally.is_empty(), "{n} worlds (seed {seed}); violations per property: {counts:?}");
}

#[test]
fn guarantees_hold() {
    if let Some(n) = std::env::var("RDZV_PROPS_SURVEY").ok().and_then(|n| n.parse().ok()) {
        return survey(n);
    }
    let config = ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() };
    let seed = seed();
    let mut runner = runner(config, seed);
    let outcome = runner.run(&props::worlds(shape()), |world| {
        let records = run(&world);
        props::check(&world, &records);
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}\nTo generate the same worlds again: RDZV_PROPS_SEED={seed}");
    }
}

/// `RDZV_PROPS_SEED`, else a fresh random one (printed on failure). Worlds on the in-memory
/// backend under a paused clock replay nearly identically from it (only the retry backoff's
/// jitter is not seeded).
fn seed() -> u64 {
    std::env::var("RDZV_PROPS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new().build_hasher().finish()
    })
}

fn runner(config: ProptestConfig, seed: u64) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// A spare's session losses past its deadline (issue 39, defect 3), on the in-memory backend
/// under a paused clock: a full round of `members`, `spares` behind it with a `timeout` far
/// shorter than their wait, and cuts of the spares' links — every call fails, their watches
/// dropped or left silent, each cut long enough to lose the session — the first only once
/// they have waited past their timeout. After the last cut heals a member dies: a spare must
/// take its place within a bound, and no spare's call may fail meanwhile (a spare waits for
/// as long as the run lasts, across any number of lost and renewed sessions).
mod spares {
    use std::time::Duration;

    use proptest::prelude::*;
    use rdzv_core::testing::rendezvous::{Worker, params, run_id};
    use rdzv_core::{Kv, RendezvousError, RendezvousInfo};
    use rdzv_mem::MemKv;
    use std::sync::Arc;
    use tokio::time::Instant;

    /// The longest retry pause (2 s, up to 100 % jitter), and what a bound allows beyond its
    /// named terms.
    const BACKOFF_MAX: Duration = Duration::from_secs(4);
    const SLACK: Duration = Duration::from_secs(2);

    #[derive(Clone, Debug)]
    pub struct Cut {
        /// How long after the previous cut healed (or, for the first, after the spares'
        /// timeout passed) it starts.
        gap_ms: u64,
        /// How long it lasts, in per cent of the TTL (always long enough to lose the session).
        percent_of_ttl: u64,
        /// Whether the spares' open watches are cut too (else they stay open and silent).
        drop_watches: bool,
    }

    #[derive(Clone, Debug)]
    pub struct SpareWorld {
        members: usize,
        spares: usize,
        ttl_ms: u64,
        /// The spares' timeout beyond the longest cut and a retry pause.
        timeout_beyond_cuts_ms: u64,
        cuts: Vec<Cut>,
    }

    impl SpareWorld {
        fn ttl(&self) -> Duration {
            Duration::from_millis(self.ttl_ms)
        }

        fn cut_length(&self, cut: &Cut) -> Duration {
            Duration::from_millis(self.ttl_ms * cut.percent_of_ttl / 100)
        }

        /// Longer than every cut and a retry pause after it: a spare that lost its session
        /// has a whole timeout from then to start a new one and wait as a spare again.
        fn timeout(&self) -> Duration {
            let longest = self.cuts.iter().map(|c| self.cut_length(c)).max().unwrap_or_default();
            longest + BACKOFF_MAX + SLACK + Duration::from_millis(self.timeout_beyond_cuts_ms)
        }
    }

    fn worlds() -> impl Strategy<Value = SpareWorld> {
        // A gap lets a healed spare start a session again (after a retry pause) and wait as a
        // spare before the next cut.
        let cut = (BACKOFF_MAX.as_millis() as u64 + 2000..15_000u64, 150u64..400, any::<bool>())
            .prop_map(|(gap_ms, percent_of_ttl, drop_watches)| Cut { gap_ms, percent_of_ttl, drop_watches });
        (1usize..4, 1usize..3, 2000u64..5000, 0u64..5000, prop::collection::vec(cut, 1..4)).prop_map(
            |(members, spares, ttl_ms, timeout_beyond_cuts_ms, cuts)| SpareWorld {
                members,
                spares,
                ttl_ms,
                timeout_beyond_cuts_ms,
                cuts,
            },
        )
    }

    /// Runs one world; `Err` says what went wrong.
    async fn run(world: &SpareWorld) -> Result<(), String> {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let mut p = params(&run_id("spare-cuts"), world.members, world.members);
        p.keep_alive_ttl = world.ttl();
        p.timeout = world.timeout();
        let mut members = Vec::new();
        for i in 0..world.members {
            let mut p = p.clone();
            p.node_id = Some(format!("member{i}"));
            members.push(Worker::new(&kv, p, i as u64).await);
        }
        // Members re-enter whenever their round breaks, as agents do.
        let (formed, mut rounds) = tokio::sync::mpsc::unbounded_channel::<RendezvousInfo>();
        let member_tasks: Vec<_> = members
            .iter()
            .map(|m| {
                let (handler, formed) = (m.handler.clone(), formed.clone());
                tokio::spawn(async move {
                    loop {
                        if let Ok(info) = handler.next_rendezvous().await {
                            let _ = formed.send(info);
                            handler.round_broken().await;
                        }
                    }
                })
            })
            .collect();
        for _ in 0..world.members {
            tokio::time::timeout(world.timeout(), rounds.recv()).await.map_err(|_| "no first round")?;
        }
        let mut spares = Vec::new();
        let mut calls = Vec::new();
        for i in 0..world.spares {
            let mut p = p.clone();
            p.node_id = Some(format!("spare{i}"));
            let spare = Worker::new(&kv, p, 100 + i as u64).await;
            let handler = spare.handler.clone();
            calls.push(tokio::spawn(async move { handler.next_rendezvous().await }));
            spares.push(spare);
        }
        tokio::time::sleep(world.timeout() + Duration::from_secs(1)).await;
        for (n, cut) in world.cuts.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(cut.gap_ms)).await;
            if let Some(ended) = calls.iter().position(|c| c.is_finished()) {
                return Err(format!("spare {ended}'s call ended before cut {n}"));
            }
            for spare in &spares {
                spare.link.set_failure_probability(1.0);
                if cut.drop_watches {
                    spare.link.drop_open_watches();
                }
            }
            tokio::time::sleep(world.cut_length(cut)).await;
            for spare in &spares {
                spare.link.clear();
            }
        }
        tokio::time::sleep(BACKOFF_MAX + world.ttl() + SLACK).await;
        if let Some(ended) = calls.iter().position(|c| c.is_finished()) {
            let result = calls.swap_remove(ended).await.map_err(|e| e.to_string())?;
            return Err(format!("spare {ended}'s call ended after the cuts healed: {result:?}"));
        }
        // A member dies: a spare takes its place.
        while rounds.try_recv().is_ok() {}
        members[0].kill();
        member_tasks[0].abort();
        let killed = Instant::now();
        let bound = 3 * world.ttl() + BACKOFF_MAX + SLACK;
        let promoted = tokio::time::timeout(bound, async {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if let Some(i) = calls.iter().position(|c| c.is_finished()) {
                    break calls.swap_remove(i).await;
                }
            }
        })
        .await
        .map_err(|_| format!("no spare was promoted within {bound:?} of a member's death"))?
        .map_err(|e| e.to_string())?;
        let info: Result<RendezvousInfo, RendezvousError> = promoted;
        let info = info.map_err(|e| format!("a spare's call failed: {e}"))?;
        if info.world_size != world.members || !info.participants[info.rank].node.starts_with("spare") {
            return Err(format!("the promoted spare's round is not a full one with it: {info:?}"));
        }
        let _ = killed;
        for task in member_tasks {
            task.abort();
        }
        for call in calls {
            call.abort();
        }
        Ok(())
    }

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64)
    }

    #[test]
    fn a_spare_waits_past_its_timeout_across_session_losses() {
        let config =
            ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() };
        let seed = super::seed();
        let mut runner = super::runner(config, seed);
        let outcome = runner.run(&worlds(), |world| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            let result = rt.block_on(run(&world));
            drop(rt);
            result.map_err(TestCaseError::fail)
        });
        if let Err(e) = outcome {
            panic!("{e}\nTo generate the same worlds again: RDZV_PROPS_SEED={seed}");
        }
    }
}
