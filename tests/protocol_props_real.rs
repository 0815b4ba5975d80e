//! The protocol's property run (`props/mod.rs`) against real servers, in real time: the
//! fault wrapper over a real etcd client and a real Redis client, so that what only a real
//! backend does — etcd's `count_at_revision`, real watch delivery, server-side lease expiry,
//! network round trips — meets the same hostile worlds and the same guarantees as the
//! in-memory run. Worlds are small (2–6 workers, TTL 1–2 s, last call ≤ 1 s, faults for up
//! to 3 s) and few, so each backend takes well under two minutes.
//!
//! Cases per backend: `RDZV_REAL_PROPS_CASES`, else 60 with `RDZV_SOAK=1`, else 6, run as two
//! tests of half each ([`PARTS`]).
#![allow(clippy::unwrap_used)]

mod props;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use rdzv_core::Kv;

use props::Shape;

fn cases() -> u32 {
    let soak = std::env::var("RDZV_SOAK").is_ok_and(|v| v == "1");
    std::env::var("RDZV_REAL_PROPS_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(if soak {
        60
    } else {
        6
    })
}

fn shape(ttl_ms: std::ops::Range<u64>) -> Shape {
    Shape {
        small: 2..5,
        medium: 5..7,
        large: 5..7,
        ttl_ms,
        last_call_ms: 200..1000,
        heal_ms: 500..3000,
        arrive_ms: 0..1000,
        calm: 0.2,
        // Every worker fits in a round: a world then ends as soon as all have completed,
        // rather than waiting out its bound for the ones left over.
        allow_overflow: false,
        // Few, short worlds: make most links faulty so that each case tests something.
        faulty: 0.6,
    }
}

/// Each backend's worlds run as two tests of half the cases each, which run side by side (a
/// world costs seconds of real time, mostly waiting).
const PARTS: u32 = 2;

/// Runs the property over this part's share of the worlds of `shape`, each on a fresh
/// namespace from `backend`, from a random seed (printed on failure).
fn property<F, Fut>(name: &str, shape: Shape, backend: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Kv>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let config = ProptestConfig {
        cases: cases().div_ceil(PARTS),
        failure_persistence: None,
        // Each case costs seconds of real time (a wedged one, its whole bound): report the
        // failing world as found rather than spend minutes shrinking it.
        max_shrink_iters: 0,
        ..ProptestConfig::default()
    };
    let seed: [u8; 32] = std::array::from_fn(|_| fastrand_byte());
    let rng = proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &seed);
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config, rng);
    let n = std::sync::atomic::AtomicU64::new(0);
    let outcome = runner.run(&props::worlds(shape), |world| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let records = rt.block_on(async {
            let kv = backend().await;
            let limit = world.heal() + 2 * props::healed_bound(&world) + Duration::from_secs(30);
            tokio::time::timeout(limit, props::run_world(&world, kv, &format!("{name}-{n}")))
                .await
                .expect("the world did not finish: something hangs")
        });
        props::check(&world, &records);
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{name}: {e} (seed {seed:?})");
    }
}

/// A random byte (each test's worlds differ from the other part's and from the last run's).
fn fastrand_byte() -> u8 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish() as u8
}

/// etcd grants no lease shorter than about 2 s: a shorter TTL would silently be longer.
fn on_etcd() {
    property("etcd", shape(2000..2001), rdzv_etcd::testing::fresh_namespace);
}

fn on_redis() {
    property("redis", shape(1000..2001), || rdzv_redis::testing::shared().kv());
}

#[test]
fn guarantees_hold_on_etcd_part_1() {
    on_etcd();
}

#[test]
fn guarantees_hold_on_etcd_part_2() {
    on_etcd();
}

#[test]
fn guarantees_hold_on_redis_part_1() {
    on_redis();
}

#[test]
fn guarantees_hold_on_redis_part_2() {
    on_redis();
}
