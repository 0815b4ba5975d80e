//! `rdzv join` processes each reaching the server through a link of their own
//! (`rdzv_netfault::Link`), one of which is cut off — packets vanish, nothing is reset —
//! for longer than its keep-alive TTL while it waits for a round, then healed: the round
//! must complete with it, by its deadline, and nobody exits with an error.

#![allow(clippy::unwrap_used)]

mod cli_support;

use std::net::SocketAddr;
use std::time::Duration;

use cli_support::{Proc, run_id, run_once};
use rdzv_netfault::Link;
use serde_json::Value;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);
/// How long the node is cut off: three TTLs, so that its session is lost for sure.
const CUT_OFF: Duration = Duration::from_secs(6);
/// From the heal to the round: the cut-off node notices its lost session within a TTL,
/// starts a new one (a backoff of at most 2 s) and joins at once, being the last.
const HEALED: Duration = Duration::from_secs(10);

fn join(url: &str, node: &str) -> Proc {
    Proc::spawn(node, &["join", url, "--node-id", node, "--hold", "0s"])
}

/// Waits until `status` shows `n` workers joined to the forming round.
async fn joined(status_url: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, out, _) = run_once(&["status", status_url, "--format", "json"]).await;
        let v: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
        if v["joined_count"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "never {n} joined: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A, B and C must form a round of three; A and B wait, A is cut off for `CUT_OFF`, C
/// arrives meanwhile (after A's keys are gone), then A is healed.
async fn waiting_worker_cut_off_then_healed(server: SocketAddr, url: impl Fn(&str, &str) -> String) {
    let run = run_id("partition");
    let query = format!("min_workers=3&keep_alive_ttl={}s&timeout=40s", TTL.as_secs());
    let direct = url(&server.to_string(), &format!("{run}?{query}"));
    let status_url = url(&server.to_string(), &run);
    let a_link = Link::start([server]).unwrap();
    let a_url = url(&a_link.endpoint_list(), &format!("{run}?{query}"));
    let mut procs = vec![join(&a_url, "a"), join(&direct, "b")];
    joined(&status_url, 2).await;

    a_link.freeze();
    let cut = Instant::now();
    // A's session expires on the server after one TTL; only then does C arrive, so that the
    // round cannot form from what was there before the cut.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    joined(&status_url, 1).await;
    procs.push(join(&direct, "c"));
    tokio::time::sleep(CUT_OFF.saturating_sub(cut.elapsed())).await;
    a_link.heal();
    let healed = Instant::now();

    let mut rounds = Vec::new();
    for p in &mut procs {
        let left = (healed + HEALED).saturating_duration_since(Instant::now());
        rounds.push(p.json(left).await);
    }
    println!("round of 3 complete {:?} after the heal", healed.elapsed());
    for r in &rounds {
        assert_eq!(r["world_size"], 3, "{rounds:?}");
        assert_eq!(r["version"], rounds[0]["version"], "{rounds:?}");
    }
    for p in &mut procs {
        assert_eq!(p.exit_code(Duration::from_secs(10)).await, 0, "{}: {}", p.name, p.stderr());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_waiting_worker_cut_off_longer_than_its_ttl_completes_the_round() {
    let server = rdzv_etcd::testing::EtcdServer::start().await.unwrap();
    let endpoint = server.endpoint();
    let addr: SocketAddr = format!("{}:{}", endpoint.host, endpoint.port).parse().unwrap();
    cli_support::bounded(waiting_worker_cut_off_then_healed(addr, |hosts, rest| {
        format!("etcd://{hosts}/{rest}")
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_waiting_worker_cut_off_longer_than_its_ttl_completes_the_round() {
    let server = rdzv_redis::testing::RedisServer::start().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    cli_support::bounded(waiting_worker_cut_off_then_healed(addr, |hosts, rest| {
        format!("redis://{hosts}/{rest}")
    }))
    .await;
}
