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
use rdzv::core::{Kv, RendezvousParams};
use rdzv::{Rendezvous, Round};

const SIZES: [usize; 6] = [2, 8, 32, 128, 512, 1024];

async fn workers(kv: &Arc<dyn Kv>, n: usize) -> Vec<Arc<Rendezvous>> {
    let mut params = RendezvousParams::new(common::unique("latency"), n, n).expect("valid parameters");
    params.prefix = "/rdzv-bench".into();
    params.timeout = Duration::from_secs(120);
    let created = (0..n).map(|i| {
        let mut p = params.clone();
        p.node_id = Some(format!("w{i}"));
        let kv = kv.clone();
        async move { Arc::new(Rendezvous::new(kv, p).await.expect("a worker")) }
    });
    futures::future::join_all(created).await
}

/// One round: the time until all returned, and the rounds they returned.
async fn round(workers: &[Arc<Rendezvous>]) -> (Duration, Vec<Round>) {
    let started = Instant::now();
    let tasks: Vec<_> =
        workers.iter().cloned().map(|w| tokio::spawn(async move { w.next_rendezvous().await })).collect();
    let mut rounds = Vec::with_capacity(tasks.len());
    for t in tasks {
        rounds.push(t.await.expect("worker task").expect("a completed round"));
    }
    (started.elapsed(), rounds)
}

async fn leave(workers: Vec<Arc<Rendezvous>>) {
    let gone = workers.iter().map(|w| w.handler().shutdown());
    for r in futures::future::join_all(gone).await {
        r.expect("leave");
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
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
                b.to_async(&rt).iter_custom(|iters| {
                    let (kv, label) = (kv.clone(), label.clone());
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let ws = workers(&kv, n).await;
                            let (took, rounds) = round(&ws).await;
                            assert!(rounds.iter().all(|r| r.world_size == n), "a round of {n}");
                            let slowest = |f: fn(&Round) -> Duration| {
                                rounds.iter().map(f).max().unwrap_or_default().as_secs_f64()
                            };
                            common::record(
                                "rendezvous_latency",
                                serde_json::json!({
                                    "backend": label, "workers": n, "seconds": took.as_secs_f64(),
                                    "max_joined": slowest(|r| r.timings.joined),
                                    "max_frozen": slowest(|r| r.timings.frozen),
                                    "max_completed": slowest(|r| r.timings.completed),
                                }),
                            );
                            total += took;
                            leave(ws).await;
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
