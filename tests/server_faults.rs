//! Real server faults in the middle of a rendezvous (docs/PROTOCOL.md "Failure handling"):
//! etcd paused with SIGSTOP for longer than the keep-alive TTL, etcd killed and restarted
//! on its data directory, and every client connection reset by a `rdzv_netfault::Link`
//! while watches are open (etcd and Redis). In each, once the world has healed, the workers
//! that keep calling must complete a round: a timeout is a failure. How long that took after the server came
//! back is printed.
#![allow(clippy::unwrap_used)]

use rdzv_core::testing::rendezvous as support;

use std::sync::Arc;
use std::time::Duration;

use rdzv_core::{Kv, RendezvousHandler, RendezvousInfo, RendezvousParams, RoundBroken};
use rdzv_etcd::testing::EtcdServer;
use rdzv_netfault::Link;
use tokio::time::{Instant, timeout};

/// The keep-alive TTL of the workers: outages below last longer than this.
const TTL: Duration = Duration::from_secs(2);
/// Each call's deadline: long, so that a wedge shows as a missed bound, not a timeout.
const CALL: Duration = Duration::from_secs(60);
/// How soon after the server is back the round must complete: a lost session is renewed
/// within a backoff (≤ 2 s) plus a TTL, a stale `frozen` value lasts 10 s at most.
const HEALED: Duration = Duration::from_secs(15);

fn params(run: &str, n: usize) -> RendezvousParams {
    let mut p = support::params(run, n, n);
    p.timeout = CALL;
    p.keep_alive_ttl = TTL;
    p
}

fn spawn_calls(handlers: &[RendezvousHandler]) -> Vec<tokio::task::JoinHandle<RendezvousInfo>> {
    handlers
        .iter()
        .cloned()
        .map(|h| tokio::spawn(async move { h.next_rendezvous().await.unwrap() }))
        .collect()
}

async fn handlers(kv: &Arc<dyn Kv>, p: &RendezvousParams, names: &[&str]) -> Vec<RendezvousHandler> {
    let mut all = Vec::new();
    for name in names {
        let mut p = p.clone();
        p.node_id = Some((*name).into());
        all.push(RendezvousHandler::new(kv.clone(), p).await.unwrap());
    }
    all
}

/// Waits for every call, each within `HEALED` of `back`, and checks their agreement.
async fn all_complete(
    calls: Vec<tokio::task::JoinHandle<RendezvousInfo>>,
    back: Instant,
    n: usize,
) -> Duration {
    let mut infos = Vec::new();
    for call in calls {
        let left = (back + HEALED).saturating_duration_since(Instant::now());
        let info = timeout(left, call).await.expect("no round within the bound after the server was back");
        infos.push(info.unwrap());
    }
    support::assert_agreement(&infos, n, n);
    back.elapsed()
}

/// What happens to etcd while two of four workers wait.
enum Fault {
    /// SIGSTOP, then SIGCONT: the server's clock runs on, and the sessions expire.
    Pause,
    /// SIGKILL, then a restart on the same data directory.
    Restart,
}

/// Two of four workers wait; etcd is out for 3 TTLs; the last two arrive once it is back,
/// and all four must complete within `HEALED`.
async fn etcd_outage(fault: Fault) -> Duration {
    let mut server = EtcdServer::start().await.unwrap();
    let kv = server.kv().await;
    let p = params(&support::run_id("etcd-outage"), 4);
    let early = handlers(&kv, &p, &["a", "b"]).await;
    let mut calls = spawn_calls(&early);
    tokio::time::sleep(Duration::from_millis(500)).await;
    match fault {
        Fault::Pause => {
            server.pause().unwrap();
            tokio::time::sleep(3 * TTL).await;
            server.resume().unwrap();
        }
        Fault::Restart => {
            server.kill().await.unwrap();
            tokio::time::sleep(3 * TTL).await;
            server.restart().await.unwrap();
        }
    }
    let back = Instant::now();
    let late = handlers(&kv, &p, &["c", "d"]).await;
    calls.extend(spawn_calls(&late));
    all_complete(calls, back, 4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_paused_longer_than_the_ttl_then_the_round_completes() {
    let took = etcd_outage(Fault::Pause).await;
    println!("etcd paused {:?}: round complete {took:?} after it resumed", 3 * TTL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_and_restarted_then_the_round_completes() {
    let took = etcd_outage(Fault::Restart).await;
    println!("etcd down {:?}: round complete {took:?} after it restarted", 3 * TTL);
}

fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// Workers wait with open watches; every connection is cut; the round still completes. Then
/// the members' monitors lose their connections too, and a member's death is still told.
async fn cut_connections(kv: Arc<dyn Kv>, link: &Link, name: &str) {
    let p = params(&support::run_id(name), 3);
    let early = handlers(&kv, &p, &["a", "b"]).await;
    // The third worker's handler exists before the cut (its session is kept alive across
    // it); its call starts after.
    let late = handlers(&kv, &p, &["c"]).await;
    let calls = spawn_calls(&early);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(link.cut() > 0, "no connection went through the link");
    let back = Instant::now();
    let mut calls = calls;
    calls.extend(spawn_calls(&late));
    let took = all_complete(calls, back, 3).await;
    println!("{name}: round complete {took:?} after the connections were cut");

    // Running: cut again, then one member leaves; the others are told.
    tokio::time::sleep(Duration::from_millis(300)).await;
    link.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    late[0].shutdown().await.unwrap();
    for h in &early {
        let told =
            timeout(TTL + Duration::from_secs(5), h.round_broken()).await.expect("a member was not told");
        assert!(matches!(told, RoundBroken::MemberGone { .. } | RoundBroken::Ended), "{told:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_connections_cut_while_watching() {
    let server = EtcdServer::start().await.unwrap();
    let link = Link::start([loopback(server.endpoint().port)]).unwrap();
    let url = format!("etcd://{}/x?min_workers=1", link.endpoint_list());
    let (kv, _) = rdzv::registry().connect_backend(&url).await.unwrap();
    cut_connections(kv, &link, "etcd-cut").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_connections_cut_while_watching() {
    let server = rdzv_redis::testing::RedisServer::start().unwrap();
    let link = Link::start([loopback(server.port())]).unwrap();
    let url = format!("redis://{}/x?min_workers=1", link.endpoint_list());
    let (kv, _) = rdzv::registry().connect_backend(&url).await.unwrap();
    cut_connections(kv, &link, "redis-cut").await;
}
