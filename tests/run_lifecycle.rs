//! A run leaves nothing behind (docs/PROTOCOL.md "Leases", docs/STORE.md "Lifetime"): after
//! its last worker leaves and `run_ttl` passes, no key of the run remains — state, counter,
//! extra data and the round's Store alike — and a run id used again starts clean, at round 1
//! with an empty Store. On memory (paused clock), real etcd and real Redis.
#![allow(clippy::unwrap_used)]

use rdzv_core::testing::rendezvous as support;

use std::sync::Arc;
use std::time::Duration;

use rdzv_core::kv::RangeOptions;
use rdzv_core::{Kv, RendezvousParams};
use tokio::time::Instant;

const RUN_TTL: Duration = Duration::from_secs(4);

fn params(run: &str, min: usize, node: &str) -> RendezvousParams {
    let mut p = support::params(run, min, min);
    p.run_ttl = RUN_TTL;
    p.keep_alive_ttl = Duration::from_secs(2);
    p.node_id = Some(node.into());
    p
}

async fn keys_under(kv: &dyn Kv, prefix: &str) -> Vec<String> {
    let read = kv.range(prefix.as_bytes(), RangeOptions::default()).await.unwrap();
    read.kvs.iter().map(|kv| String::from_utf8_lossy(&kv.key).into_owned()).collect()
}

async fn run_leaves_nothing_behind(kv: Arc<dyn Kv>) {
    let run = support::run_id("lifecycle");
    let prefix = format!("/rdzv-test/run_{run}/");
    let a = rdzv::Rendezvous::new(kv.clone(), params(&run, 2, "a")).await.unwrap();
    let b = rdzv::Rendezvous::new(kv.clone(), params(&run, 2, "b")).await.unwrap();
    let (ra, rb) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    // Every kind of Store write, and extra data.
    ra.store.set("x", "1").await.unwrap();
    ra.store.add("counter", 5).await.unwrap();
    ra.store.append("log", "a").await.unwrap();
    ra.store.compare_set("cas", "", "v").await.unwrap();
    ra.store.queue_push("q", "item").await.unwrap();
    let (x, y) = tokio::join!(
        ra.store.barrier("finish", 2, Duration::from_secs(10)),
        rb.store.barrier("finish", 2, Duration::from_secs(10))
    );
    x.unwrap();
    y.unwrap();
    a.store_extra_data(ra.info.version, "extra", b"e").await.unwrap();
    assert!(!keys_under(&*kv, &prefix).await.is_empty());

    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    // The run lease was refreshed at most `RUN_TTL / 3` ago: gone by `RUN_TTL` + a margin.
    let deadline = Instant::now() + RUN_TTL + Duration::from_secs(4);
    let mut left = keys_under(&*kv, &prefix).await;
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = keys_under(&*kv, &prefix).await;
    }
    assert!(left.is_empty(), "keys of the run left {RUN_TTL:?} after its last worker: {left:?}");

    // The same run id again: a new run, at round 1, with an empty Store.
    let c = rdzv::Rendezvous::new(kv.clone(), params(&run, 1, "c")).await.unwrap();
    let rc = c.next_rendezvous().await.unwrap();
    assert_eq!(rc.info.version, 1, "a reused run id did not start clean");
    assert!(!rc.store.check(["x", "counter", "finish"]).await.unwrap());
    assert_eq!(rc.store.num_keys().await.unwrap(), 2, "only rank 0's bootstrap keys");
    c.shutdown().await.unwrap();
}

#[test]
fn mem() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    rt.block_on(run_leaves_nothing_behind(Arc::new(rdzv_mem::MemKv::new())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd() {
    run_leaves_nothing_behind(rdzv_etcd::testing::fresh_namespace().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    run_leaves_nothing_behind(rdzv_redis::testing::shared().kv().await).await;
}
