//! `rdzv join` processes waiting for a round while their etcd is paused (SIGSTOP) or killed
//! and restarted for longer than their keep-alive TTL: they must start new sessions and
//! carry on, and with the late arrivals they complete the round (they used to exit 1 with
//! "this worker's session lease was lost"). How long the round took after the server came
//! back is printed.

#![allow(clippy::unwrap_used)]

mod cli_support;

use std::time::Duration;

use cli_support::{Proc, run_id};
use rdzv_etcd::testing::EtcdServer;
use tokio::time::Instant;

/// Outage longer than twice the keep-alive TTL (3 s).
const OUTAGE: Duration = Duration::from_secs(7);

fn join(url: &str, node: &str) -> Proc {
    Proc::spawn(node, &["join", url, "--node-id", node, "--hold", "0s"])
}

enum Fault {
    Pause,
    Restart,
}

async fn waiting_workers_survive(fault: Fault) {
    let mut server = EtcdServer::start().await.unwrap();
    let url = server.url(&format!("{}?min_workers=4&keep_alive_ttl=3s&timeout=60s", run_id("outage")));
    let mut procs: Vec<Proc> = (0..2).map(|i| join(&url, &format!("early{i}"))).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    match fault {
        Fault::Pause => {
            server.pause().unwrap();
            tokio::time::sleep(OUTAGE).await;
            server.resume().unwrap();
        }
        Fault::Restart => {
            server.kill().await.unwrap();
            tokio::time::sleep(OUTAGE).await;
            server.restart().await.unwrap();
        }
    }
    let back = Instant::now();
    procs.extend((0..2).map(|i| join(&url, &format!("late{i}"))));
    let mut versions = Vec::new();
    for p in &mut procs {
        let round = p.json(Duration::from_secs(20)).await;
        versions.push(round["version"].as_u64().unwrap());
        assert_eq!(round["world_size"], 4, "{round}");
    }
    println!("round of 4 complete {:?} after the server was back", back.elapsed());
    assert!(versions.iter().all(|v| *v == versions[0]), "{versions:?}");
    for p in &mut procs {
        assert_eq!(p.exit_code(Duration::from_secs(10)).await, 0, "{}", p.stderr());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_workers_survive_an_etcd_pause() {
    cli_support::bounded(waiting_workers_survive(Fault::Pause)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_workers_survive_an_etcd_restart() {
    cli_support::bounded(waiting_workers_survive(Fault::Restart)).await;
}
