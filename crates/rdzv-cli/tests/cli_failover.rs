//! `rdzv join` processes on a real three-member etcd cluster (their URL names every
//! member) whose leader is SIGKILLed: while they wait for a round, and while the round
//! runs. A leader election is a passing server condition ("no leader", "request timed out,
//! possibly due to previous leader failure"): it must cost no worker its call, and no member
//! its membership when it is shorter than the keep-alive TTL.

#![allow(clippy::unwrap_used)]

mod cli_support;

use std::time::Duration;

use cli_support::{Proc, run_id};
use rdzv_etcd::testing::EtcdCluster;
use tokio::time::Instant;

/// The keep-alive TTL of the waiting workers: the election lasts about as long.
const TTL: Duration = Duration::from_secs(3);
/// The keep-alive TTL of the members of a running round: a session survives a leader
/// change that ends within two thirds of it (its last refresh may be a third old), and an
/// election here takes 1–3 s.
const MEMBER_TTL: Duration = Duration::from_secs(5);

fn join(url: &str, node: &str, hold: &str) -> Proc {
    Proc::spawn(node, &["join", url, "--node-id", node, "--hold", hold])
}

async fn leader(cluster: &EtcdCluster) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match cluster.leader().await {
            Ok(index) => return index,
            Err(e) if Instant::now() >= deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Four of five wait; the leader is killed; the fifth starts right after the kill, during
/// the election. All five must complete one round (the fifth used to exit 5 at once with
/// "lease_grant failed: etcdserver: request timed out, possibly due to previous leader
/// failure", and the four then timed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_while_four_wait_and_the_fifth_starts_all_five_complete() {
    cli_support::bounded(async {
        let mut cluster = EtcdCluster::start(3).await.unwrap();
        let url = cluster.url(&format!(
            "{}?min_workers=5&keep_alive_ttl={}s&timeout=40s",
            run_id("failover"),
            TTL.as_secs()
        ));
        let mut procs: Vec<Proc> = (0..4).map(|i| join(&url, &format!("w{i}"), "0s")).collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let killed = leader(&cluster).await;
        cluster.member_mut(killed).kill().await.unwrap();
        let kill = Instant::now();
        procs.push(join(&url, "w4", "0s"));
        let mut versions = Vec::new();
        for p in &mut procs {
            let round = p.json(Duration::from_secs(30)).await;
            assert_eq!(round["world_size"], 5, "{round}");
            versions.push(round["version"].clone());
        }
        assert!(versions.iter().all(|v| *v == versions[0]), "{versions:?}");
        println!("round of 5 complete {:?} after the leader was killed", kill.elapsed());
        for p in &mut procs {
            assert_eq!(p.exit_code(Duration::from_secs(10)).await, 0, "{}: {}", p.name, p.stderr());
        }
    })
    .await;
}

/// A round of three runs (`--hold`); the leader is killed. The election is shorter than
/// the keep-alive TTL, so no member may lose its session or see its round broken; each
/// prints its one round and exits 0 when its hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_while_a_round_runs_loses_no_member() {
    cli_support::bounded(async {
        let mut cluster = EtcdCluster::start(3).await.unwrap();
        let url = cluster.url(&format!(
            "{}?min_workers=3&keep_alive_ttl={}s&timeout=30s",
            run_id("failover-running"),
            MEMBER_TTL.as_secs()
        ));
        let hold = format!("{}s", 3 * MEMBER_TTL.as_secs());
        let mut procs: Vec<Proc> = (0..3).map(|i| join(&url, &format!("m{i}"), &hold)).collect();
        for p in &mut procs {
            let round = p.json(Duration::from_secs(20)).await;
            assert_eq!(round["world_size"], 3, "{round}");
        }
        let killed = leader(&cluster).await;
        cluster.member_mut(killed).kill().await.unwrap();
        // A new leader within the TTL; then a TTL more for anything lost to show.
        let quiet = Instant::now() + 2 * MEMBER_TTL + Duration::from_secs(1);
        for p in &mut procs {
            let left = quiet.saturating_duration_since(Instant::now());
            if let Some(line) = p.try_line(left).await {
                panic!("{}: a second round over a leader change: {line}; stderr:\n{}", p.name, p.stderr());
            }
            let err = p.stderr();
            assert!(!err.contains("lost") && !err.contains("is over"), "{}: {err}", p.name);
        }
        for p in &mut procs {
            assert_eq!(p.exit_code(Duration::from_secs(20)).await, 0, "{}: {}", p.name, p.stderr());
        }
    })
    .await;
}

/// Two of three members down: the one left answers every request "no leader". A worker that
/// starts then keeps asking (the first contact, its session's lease grant) and completes
/// its round once a member is back and a leader elected; it used to exit 5 at once. With
/// no member reachable at all it still fails fast (exit 5, `cli_etcd::server_down`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starting_while_the_cluster_has_no_leader_waits_for_one() {
    cli_support::bounded(async {
        let mut cluster = EtcdCluster::start(3).await.unwrap();
        let url = cluster.url(&format!("{}?min_workers=1&timeout=30s", run_id("no-leader")));
        cluster.member_mut(1).kill().await.unwrap();
        cluster.member_mut(2).kill().await.unwrap();
        let mut worker = join(&url, "lonely", "0s");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(worker.running(), "gave up while the cluster had no leader: {}", worker.stderr());
        cluster.member_mut(1).restart().await.unwrap();
        let round = worker.json(Duration::from_secs(20)).await;
        assert_eq!(round["world_size"], 1, "{round}");
        assert_eq!(worker.exit_code(Duration::from_secs(10)).await, 0, "{}", worker.stderr());
    })
    .await;
}
