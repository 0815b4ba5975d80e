//! The cost guarantee on real servers: a round of 64 in-process workers on one shared
//! client, counting backend writes and reads per worker (and, on etcd, the server's own
//! committed raft proposals from its `/metrics`).
#![allow(clippy::unwrap_used)]

use rdzv_core::testing::rendezvous as support;

use std::sync::Arc;

use rdzv_core::layer::CountingKv;
use rdzv_core::{Kv, RendezvousHandler};
use rdzv_etcd::testing::EtcdServer;
use rdzv_redis::testing::RedisServer;

const N: usize = 64;

async fn handlers(kv: Arc<dyn Kv>) -> Vec<RendezvousHandler> {
    let params = support::params(&support::run_id("cost-real"), N, N);
    let mut all = Vec::new();
    for i in 0..N {
        let mut p = params.clone();
        p.node_id = Some(format!("n{i}"));
        all.push(RendezvousHandler::new(kv.clone(), p).await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_round_of_64_costs_at_most_4_proposals_per_worker() {
    let server = EtcdServer::start().await.unwrap();
    let counting = CountingKv::new(server.kv().await);
    let hs = handlers(counting.clone() as Arc<dyn Kv>).await;
    for round in 1..=2 {
        let before = counting.snapshot();
        let proposals_before = server.proposals_committed().await.unwrap();
        let started = std::time::Instant::now();
        let infos: Vec<_> = support::rendezvous_all(&hs).await.into_iter().map(Result::unwrap).collect();
        let took = started.elapsed();
        support::assert_agreement(&infos, N, N);
        let proposals = server.proposals_committed().await.unwrap() - proposals_before;
        let used = counting.snapshot() - before;
        let per_worker = proposals as f64 / N as f64;
        println!(
            "etcd N={N} round {round}: {took:?}, {per_worker:.2} proposals/worker, {:.2} reads/worker",
            used.reads() as f64 / N as f64
        );
        assert!(per_worker <= 4.0, "round {round}: {per_worker:.2} proposals per worker");
        assert!(used.reads() as f64 / N as f64 <= 4.0, "round {round}: {used:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_round_of_64_costs_at_most_4_writes_per_worker() {
    let server = RedisServer::start().unwrap();
    let counting = CountingKv::new(server.kv().await);
    let hs = handlers(counting.clone() as Arc<dyn Kv>).await;
    for round in 1..=2 {
        let before = counting.snapshot();
        let started = std::time::Instant::now();
        let infos: Vec<_> = support::rendezvous_all(&hs).await.into_iter().map(Result::unwrap).collect();
        let took = started.elapsed();
        support::assert_agreement(&infos, N, N);
        let used = counting.snapshot() - before;
        let writes = used.writes() as f64 / N as f64;
        println!("redis N={N} round {round}: {took:?}, {writes:.2} writes/worker ({used:?})");
        assert!(writes <= 4.0, "round {round}: {writes:.2} writes per worker");
        assert!(used.reads() as f64 / N as f64 <= 4.0, "round {round}: {used:?}");
    }
}
