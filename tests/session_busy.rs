//! A busy process keeps its leases (the scale issue): hundreds of sessions on one client
//! while every worker thread of the runtime is kept busy by CPU-heavy tasks, as thousands
//! of in-process rendezvous handlers keep it. Any task of that runtime waits behind all the
//! busy ones each time it wakes, longer than the TTL; the sessions' refreshes must not.
//! Real time (a paused clock does not move while tasks burn CPU), on memory and on real
//! etcd and Redis servers started by the harnesses.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdzv_core::kv::{PutOptions, RangeOptions};
use rdzv_core::{Kv, Session};

/// Sessions on the one client.
const SESSIONS: usize = 256;
/// Leases of 2 s (etcd's and Redis's shortest), refreshed every 0.67 s.
const TTL: Duration = Duration::from_secs(2);
/// CPU-heavy tasks, each burning `SLICE` between yields: a task that wakes waits about
/// `BUSY × SLICE / 2 workers` = 2.5 s (more than the TTL) before it runs.
const BUSY: usize = 500;
const SLICE: Duration = Duration::from_millis(10);
/// How long the runtime stays busy: several TTLs.
const BUSY_FOR: Duration = Duration::from_secs(7);

fn burn(slice: Duration) {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < slice {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

async fn busy_process_keeps_its_leases(kv: Arc<dyn Kv>) {
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let session = Session::start(kv.clone(), TTL).await.unwrap();
        let key = format!("busy/{i:04}");
        kv.put(key.as_bytes(), b"x", PutOptions::OVERWRITE.with_lease(Some(session.lease()))).await.unwrap();
        sessions.push(session);
    }
    // The run lease of a run: every handler attaches to the one lease.
    let shared = Session::start(kv.clone(), TTL).await.unwrap();
    let attached: Vec<Session> =
        (0..SESSIONS).map(|_| Session::attach(kv.clone(), shared.lease(), TTL)).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let mut busy = Vec::new();
    for _ in 0..BUSY {
        let stop = stop.clone();
        busy.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                burn(SLICE);
                tokio::task::yield_now().await;
            }
        }));
    }
    // The test's own body runs on the thread that blocks on the runtime, not on a busy
    // worker: its timer is not starved.
    tokio::time::sleep(BUSY_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for task in busy {
        task.await.unwrap();
    }

    let lost = sessions.iter().chain(&attached).chain([&shared]).filter(|s| s.is_lost()).count();
    let left =
        kv.range(b"busy/", RangeOptions { count_only: true, ..Default::default() }).await.unwrap().count;
    assert_eq!(
        (lost, left),
        (0, SESSIONS as u64),
        "sessions lost and keys left after {BUSY_FOR:?} of a busy runtime (TTL {TTL:?})"
    );
    for session in sessions {
        session.close().await.unwrap();
    }
    drop(attached);
    shared.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_busy_process_keeps_its_leases() {
    busy_process_keeps_its_leases(Arc::new(rdzv_mem::MemKv::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_busy_process_keeps_its_leases() {
    busy_process_keeps_its_leases(rdzv_etcd::testing::fresh_namespace().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_busy_process_keeps_its_leases() {
    busy_process_keeps_its_leases(rdzv_redis::testing::shared().kv().await).await;
}
