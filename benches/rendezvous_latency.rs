//! Rendezvous latency: N in-process workers (min = max = N) on one shared backend client
//! call `next_rendezvous` at once (the facade's, bootstrap exchange included); one
//! measurement is the time until the last of them returned. Creating the workers before
//! and making them leave after are not timed.
//!
//! Each round also goes to `<results>/rendezvous_latency.jsonl` with the slowest worker's
//! phase timings (joined, frozen, completed), to see where the time goes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::BenchmarkId;
use rdzv::{Rendezvous, Round};
use rdzv_core::{Kv, RendezvousParams};

const SIZES: [usize; 6] = [2, 8, 32, 128, 512, 1024];

/// A round slower than this (in the probe) is measured by `SLOW_ROUNDS` plain rounds instead
/// of criterion's 10+ samples, to keep the whole run short.
const SLOW: Duration = Duration::from_secs(3);
const SLOW_ROUNDS: usize = 3;

async fn workers(kv: &Arc<dyn Kv>, n: usize) -> Vec<Arc<Rendezvous>> {
    let mut params = RendezvousParams::new(common::unique("latency"), n, n).expect("valid parameters");
    params.prefix = "/rdzv-bench".into();
    params.timeout = Duration::from_secs(60);
    let created = (0..n).map(|i| {
        let mut p = params.clone();
        p.node_id = Some(format!("w{i}"));
        let kv = kv.clone();
        async move { Arc::new(Rendezvous::new(kv, p).await.expect("a worker")) }
    });
    futures::future::join_all(created).await
}

/// One round: the time until all returned, and the rounds they returned; or how many
/// failed and the first error.
async fn round(workers: &[Arc<Rendezvous>]) -> (Duration, Result<Vec<Round>, String>) {
    let started = Instant::now();
    let tasks: Vec<_> =
        workers.iter().cloned().map(|w| tokio::spawn(async move { w.next_rendezvous().await })).collect();
    let mut rounds = Vec::with_capacity(tasks.len());
    let mut errors = Vec::new();
    for t in tasks {
        match t.await.expect("worker task") {
            Ok(r) => rounds.push(r),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let took = started.elapsed();
    match errors.first() {
        None => (took, Ok(rounds)),
        Some(first) => {
            (took, Err(format!("{} of {} workers failed; first: {first}", errors.len(), workers.len())))
        }
    }
}

/// Creates `n` workers, runs one round, records it, makes them leave. The round's time, or
/// the failure.
async fn measured_round(kv: &Arc<dyn Kv>, label: &str, n: usize, how: &str) -> Result<Duration, String> {
    let ws = workers(kv, n).await;
    let (took, rounds) = round(&ws).await;
    let result = match rounds {
        Ok(rounds) => {
            assert!(rounds.iter().all(|r| r.info.world_size == n), "a round of {n}");
            let slowest =
                |f: fn(&Round) -> Duration| rounds.iter().map(f).max().unwrap_or_default().as_secs_f64();
            common::record(
                "rendezvous_latency",
                serde_json::json!({
                    "backend": label, "workers": n, "seconds": took.as_secs_f64(), "how": how,
                    "max_joined": slowest(|r| r.info.timings.joined),
                    "max_frozen": slowest(|r| r.info.timings.frozen),
                    "max_completed": slowest(|r| r.info.timings.completed),
                }),
            );
            Ok(took)
        }
        Err(e) => {
            eprintln!("rendezvous_latency/{label}/{n}: round failed after {took:.1?}: {e}");
            common::record(
                "rendezvous_latency",
                serde_json::json!({"backend": label, "workers": n, "seconds": took.as_secs_f64(),
                    "how": how, "failed": e}),
            );
            Err(e)
        }
    };
    leave(ws).await;
    result
}

async fn leave(workers: Vec<Arc<Rendezvous>>) {
    let gone = workers.iter().map(|w| w.shutdown());
    for r in futures::future::join_all(gone).await {
        if let Err(e) = r {
            eprintln!("rendezvous_latency: a worker could not leave: {e}");
        }
    }
}

fn main() {
    let rt = common::runtime();
    let backends = rt.block_on(common::backends());
    let mut c = common::criterion();
    let sizes: &[usize] = if common::quick() { &[2, 32] } else { &SIZES };
    for backend in &backends {
        let label = backend.label();
        let kv = rt.block_on(backend.kv());
        let mut group = c.benchmark_group(format!("rendezvous_latency/{label}"));
        group.sample_size(10);
        for &n in sizes {
            // A probe round (also a warm-up): a size that fails is reported and the larger
            // ones skipped; a slow one gets a few plain rounds instead of criterion's samples.
            let probe = rt.block_on(measured_round(&kv, &label, n, "probe"));
            match probe {
                Err(_) => {
                    eprintln!("rendezvous_latency/{label}: skipping N ≥ {n} after a failed round");
                    break;
                }
                Ok(took) if took > SLOW => {
                    eprintln!(
                        "rendezvous_latency/{label}/{n}: {took:.1?} per round; {SLOW_ROUNDS} plain rounds"
                    );
                    for _ in 0..SLOW_ROUNDS {
                        if rt.block_on(measured_round(&kv, &label, n, "plain")).is_err() {
                            break;
                        }
                    }
                    continue;
                }
                Ok(_) => {}
            }
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
                b.to_async(&rt).iter_custom(|iters| {
                    let (kv, label) = (kv.clone(), label.clone());
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            // A failure is recorded; criterion gets the time it took.
                            total += match measured_round(&kv, &label, n, "criterion").await {
                                Ok(took) => took,
                                Err(_) => Duration::from_secs(60),
                            };
                        }
                        total
                    }
                });
            });
        }
        group.finish();
    }
    c.final_summary();
}
