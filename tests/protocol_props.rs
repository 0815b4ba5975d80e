//! Property tests of the rendezvous protocol (docs/PROTOCOL.md "Guarantees") on the in-memory
//! backend under a paused clock: generated worlds of 1–64 workers (the engine and every
//! property are in `props/mod.rs`). Until a random heal time a world is hostile — links
//! that fail calls before the request or after it took effect (a lost answer), dropped
//! watches, latency, deaths, leaves racing pending calls, a close; afterwards every stayer
//! must complete a round within a bound (a timeout there fails the case), and again after
//! re-entering together. Every case also checks agreement, bounds, unique ranks and node
//! ids, monotonic rounds, completeness, deadlines, prompt shutdown, failure detection with
//! no false deaths, closed propagation and a bounded key count.
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
        for v in props::violations(&world, &records) {
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
