//! A run leaves nothing behind, seen from outside with the `rdzv` binary: two `rdzv join`
//! processes form a round (rank 0 publishes its bootstrap keys in the round's Store) and
//! leave; `run_ttl` later no key of the run remains on the real server.

#![allow(clippy::unwrap_used)]

mod cli_support;

use std::sync::Arc;
use std::time::Duration;

use cli_support::{Proc, run_id};
use rdzv_core::Kv;
use rdzv_core::kv::RangeOptions;
use tokio::time::Instant;

async fn keys_under(kv: &dyn Kv, prefix: &str) -> Vec<String> {
    let read = kv.range(prefix.as_bytes(), RangeOptions::default()).await.unwrap();
    read.kvs.iter().map(|kv| String::from_utf8_lossy(&kv.key).into_owned()).collect()
}

/// `url(run)` is the run's URL; `kv` sees the server's keys under the default prefix.
async fn nothing_left(url: String, run: &str, kv: Arc<dyn Kv>) {
    let prefix = format!("/torchelastic/p2p/run_{run}/");
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            Proc::spawn(&format!("w{i}"), &["join", &url, "--node-id", &format!("w{i}"), "--hold", "0s"])
        })
        .collect();
    for p in &mut procs {
        assert_eq!(p.json(Duration::from_secs(20)).await["world_size"], 2);
    }
    assert!(
        keys_under(&*kv, &prefix).await.iter().any(|k| k.ends_with("MASTER_ADDR")),
        "rank 0 did not publish its bootstrap keys"
    );
    for p in &mut procs {
        assert_eq!(p.exit_code(Duration::from_secs(10)).await, 0, "{}", p.stderr());
    }
    let deadline = Instant::now() + Duration::from_secs(3 + 5);
    let mut left = keys_under(&*kv, &prefix).await;
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        left = keys_under(&*kv, &prefix).await;
    }
    assert!(left.is_empty(), "keys of the run left after run_ttl: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_run_leaves_nothing_behind() {
    let server = rdzv_etcd::testing::shared().await.unwrap();
    let run = run_id("ttl");
    let url = server.url(&format!("{run}?min_workers=2&run_ttl=4s&keep_alive_ttl=2s&timeout=20s"));
    cli_support::bounded(nothing_left(url, &run, server.kv().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_run_leaves_nothing_behind() {
    let server = rdzv_redis::testing::shared();
    let run = run_id("ttl");
    let url = server.url(&run, "min_workers=2&run_ttl=4s&keep_alive_ttl=2s&timeout=20s");
    cli_support::bounded(nothing_left(url, &run, server.kv_in("rdzv").await)).await;
}
