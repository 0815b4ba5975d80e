//! CAS contention: k concurrent writers increment one key by compare-and-swap, on each
//! backend. Two ways of losing a race are compared:
//! - `reread`: the naive loop — get, put `Update(rev)`, and on a conflict read the key again;
//! - `swap`: [`KvExt::compare_and_swap`], where a lost swap returns the winner's value in the
//!   same round trip, so the retry needs no read.
//!
//! Criterion reports committed increments per second (throughput, one element = one commit);
//! conflicts per commit go to `<results>/cas_contention.jsonl` and to stderr.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Throughput};
use rdzv_core::kv::{PutMode, PutOptions, PutOutcome};
use rdzv_core::{Kv, KvExt};

const WRITERS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

#[derive(Clone, Copy, Debug)]
enum Mode {
    Reread,
    Swap,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Reread => "reread",
            Mode::Swap => "swap",
        }
    }
}

fn next_value(current: Option<&[u8]>) -> Vec<u8> {
    let n: u64 = current.and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(0);
    (n + 1).to_string().into_bytes()
}

/// One committed increment; returns how many conflicts it took.
async fn increment(kv: &dyn Kv, key: &[u8], mode: Mode) -> u64 {
    match mode {
        Mode::Reread => {
            let mut conflicts = 0;
            loop {
                let current = kv.get(key).await.expect("get").kv;
                let mode = match &current {
                    Some(kv) => PutMode::Update(kv.mod_revision),
                    None => PutMode::Create,
                };
                let value = next_value(current.as_ref().map(|kv| &kv.value[..]));
                match kv.put(key, &value, PutOptions::new(mode)).await.expect("put") {
                    PutOutcome::Written { .. } => return conflicts,
                    // The naive loop ignores what the conflict told it and reads again.
                    PutOutcome::Conflict { .. } => conflicts += 1,
                }
            }
        }
        Mode::Swap => {
            let mut attempts = 0u64;
            kv.compare_and_swap(key, PutOptions::new(PutMode::Overwrite), |current| {
                attempts += 1;
                Some(next_value(current.map(|kv| &kv.value[..])))
            })
            .await
            .expect("compare_and_swap");
            attempts - 1
        }
    }
}

/// `commits` increments by `writers` concurrent tasks; returns the time and the conflicts.
async fn run(
    kv: Arc<dyn Kv>,
    key: Arc<Vec<u8>>,
    writers: usize,
    mode: Mode,
    commits: u64,
) -> (Duration, u64) {
    let remaining = Arc::new(AtomicI64::new(commits as i64));
    let conflicts = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let (kv, key, remaining, conflicts) =
                (kv.clone(), key.clone(), remaining.clone(), conflicts.clone());
            tokio::spawn(async move {
                while remaining.fetch_sub(1, Ordering::Relaxed) > 0 {
                    let c = increment(kv.as_ref(), &key, mode).await;
                    conflicts.fetch_add(c, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer task");
    }
    (started.elapsed(), conflicts.load(Ordering::Relaxed))
}

fn main() {
    let rt = common::runtime();
    let backends = rt.block_on(common::backends());
    let mut c = common::criterion();
    let writers: &[usize] = if common::quick() { &[1, 8] } else { &WRITERS };
    for backend in &backends {
        let label = backend.label();
        let kv = rt.block_on(backend.kv());
        let mut group = c.benchmark_group(format!("cas_contention/{label}"));
        group.throughput(Throughput::Elements(1));
        for mode in [Mode::Reread, Mode::Swap] {
            for &k in writers {
                let key = Arc::new(format!("/rdzv-bench/cas/{}", common::unique(mode.name())).into_bytes());
                let totals = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
                group.bench_with_input(BenchmarkId::new(mode.name(), k), &k, |b, &k| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let (kv, key, totals, label) =
                            (kv.clone(), key.clone(), totals.clone(), label.clone());
                        async move {
                            let (took, conflicts) = run(kv, key, k, mode, iters).await;
                            totals.0.fetch_add(iters, Ordering::Relaxed);
                            totals.1.fetch_add(conflicts, Ordering::Relaxed);
                            common::record(
                                "cas_contention",
                                serde_json::json!({
                                    "backend": label, "mode": mode.name(), "writers": k,
                                    "commits": iters, "conflicts": conflicts,
                                    "seconds": took.as_secs_f64(),
                                }),
                            );
                            took
                        }
                    });
                });
                let (commits, conflicts) =
                    (totals.0.load(Ordering::Relaxed), totals.1.load(Ordering::Relaxed));
                eprintln!(
                    "cas_contention/{label}/{}/{k}: {:.2} conflicts per commit ({conflicts} over {commits} commits)",
                    mode.name(),
                    conflicts as f64 / commits.max(1) as f64
                );
            }
        }
        group.finish();
    }
    c.final_summary();
}
