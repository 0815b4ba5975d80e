//! Store throughput: `set`, `get` and `add` through one shared client, by one caller at a
//! time and by 16 concurrent callers (each on its own key, so this measures the backend's
//! throughput, not contention on one key — `cas_contention` covers that). Criterion
//! reports operations per second; each sample also goes to `<results>/store_ops.jsonl`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Throughput};
use rdzv::Store;

const CALLERS: [usize; 2] = [1, 16];
const VALUE: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[derive(Clone, Copy)]
enum Op {
    Set,
    Get,
    Add,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Set => "set",
            Op::Get => "get",
            Op::Add => "add",
        }
    }
}

async fn one(store: &Store, op: Op, key: &str) {
    match op {
        Op::Set => store.set(key, VALUE).await.expect("set"),
        Op::Get => {
            store.get(key).await.expect("get");
        }
        Op::Add => {
            store.add(key, 1).await.expect("add");
        }
    }
}

/// `total` operations by `callers` concurrent tasks, each on its own key.
async fn run(store: Arc<Store>, op: Op, callers: usize, total: u64) -> Duration {
    let remaining = Arc::new(AtomicI64::new(total as i64));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (store, remaining) = (store.clone(), remaining.clone());
            tokio::spawn(async move {
                let key = format!("k{i}");
                while remaining.fetch_sub(1, Ordering::Relaxed) > 0 {
                    one(&store, op, &key).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("caller task");
    }
    started.elapsed()
}

fn main() {
    let rt = common::runtime();
    let backends = rt.block_on(common::backends());
    let mut c = common::criterion();
    for backend in &backends {
        let label = backend.label();
        let kv = rt.block_on(backend.kv());
        let store =
            Arc::new(Store::new(kv, format!("/rdzv-bench/store/{}/", common::unique("store")).into_bytes()));
        // `get` waits for a key that does not exist yet: write every caller's key first.
        rt.block_on(async {
            for i in 0..16 {
                store.set(format!("k{i}"), VALUE).await.expect("prepare keys");
            }
        });
        let mut group = c.benchmark_group(format!("store_ops/{label}"));
        group.throughput(Throughput::Elements(1));
        for op in [Op::Set, Op::Get, Op::Add] {
            for callers in CALLERS {
                // `add` needs a number under the key; give it keys of its own.
                let store =
                    if let Op::Add = op { Arc::new(store.with_prefix("add/")) } else { store.clone() };
                group.bench_with_input(BenchmarkId::new(op.name(), callers), &callers, |b, &callers| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let (store, label) = (store.clone(), label.clone());
                        async move {
                            let took = run(store, op, callers, iters).await;
                            common::record(
                                "store_ops",
                                serde_json::json!({
                                    "backend": label, "op": op.name(), "callers": callers,
                                    "ops": iters, "seconds": took.as_secs_f64(),
                                }),
                            );
                            took
                        }
                    });
                });
            }
        }
        group.finish();
    }
    c.final_summary();
}
