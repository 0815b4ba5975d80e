//! A server restarted in the middle of a rendezvous: the call either completes after the
//! server is back or fails with a clear error by its deadline — nothing hangs, nothing
//! panics, nothing is silently wrong.
#![allow(clippy::unwrap_used)]

use rdzv_core::testing::rendezvous as support;

use std::time::Duration;

use rdzv::RendezvousError;
use rdzv_core::RendezvousHandler;
use rdzv_etcd::testing::EtcdServer;
use rdzv_redis::testing::RedisServer;
use tokio::time::{Instant, timeout};

/// Deadline of each call, and the most it may overrun (docs/PROTOCOL.md "Guarantees").
const CALL: Duration = Duration::from_secs(20);
const SLACK: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_mid_rendezvous_completes_after_it_returns() {
    let mut server = EtcdServer::start().await.unwrap();
    let kv = server.kv().await;
    let mut p = support::params(&support::run_id("etcd-outage"), 2, 2);
    p.timeout = CALL;
    p.keep_alive_ttl = Duration::from_secs(10);
    let ws = support::workers(&kv, &p, 2).await;
    let first = ws[0].handler.clone();
    let started = Instant::now();
    let waiting = tokio::spawn(async move { first.next_rendezvous().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // etcd keeps its data (and leases) across a restart: the round resumes.
    server.kill().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await.unwrap();
    let second = timeout(CALL + SLACK, ws[1].handler.next_rendezvous()).await.unwrap();
    let first = timeout(CALL + SLACK, waiting).await.unwrap().unwrap();
    assert!(started.elapsed() <= CALL + SLACK);
    let infos = vec![first.unwrap(), second.unwrap()];
    support::assert_agreement(&infos, 2, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_for_good_fails_clearly_by_the_deadline() {
    let mut server = EtcdServer::start().await.unwrap();
    let kv = server.kv().await;
    let mut p = support::params(&support::run_id("etcd-down"), 2, 2);
    p.timeout = Duration::from_secs(6);
    let h = RendezvousHandler::new(kv, p.clone()).await.unwrap();
    let started = Instant::now();
    let call = tokio::spawn(async move { h.next_rendezvous().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill().await.unwrap();
    let r = timeout(p.timeout + SLACK * 2, call).await.expect("the call hung past its deadline").unwrap();
    assert!(started.elapsed() <= p.timeout + SLACK, "returned after {:?}", started.elapsed());
    match r {
        Err(
            RendezvousError::Timeout { .. } | RendezvousError::Unavailable(_) | RendezvousError::LeaseLost,
        ) => {}
        other => panic!("expected a timeout or an unavailable error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_rendezvous_never_hangs_or_lies() {
    let mut server = RedisServer::start().unwrap();
    let kv = server.kv().await;
    let mut p = support::params(&support::run_id("redis-outage"), 2, 2);
    p.timeout = Duration::from_secs(10);
    let ws = support::workers(&kv, &p, 2).await;
    let first = ws[0].handler.clone();
    let started = Instant::now();
    let waiting = tokio::spawn(async move { first.next_rendezvous().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A non-persistent Redis forgets everything on restart: that must surface as an error
    // (or as a fresh, consistent round), never as a round built on lost state.
    tokio::task::spawn_blocking(move || {
        server.restart().unwrap();
        server
    })
    .await
    .unwrap();
    let second = timeout(p.timeout + SLACK * 2, ws[1].handler.next_rendezvous()).await.expect("hung");
    let first = timeout(p.timeout + SLACK * 2, waiting).await.expect("hung").unwrap();
    assert!(started.elapsed() <= p.timeout + 2 * SLACK);
    for r in [&first, &second] {
        if let Err(e) = r {
            assert!(
                matches!(
                    e,
                    RendezvousError::Timeout { .. }
                        | RendezvousError::Unavailable(_)
                        | RendezvousError::Backend(_)
                        | RendezvousError::LeaseLost
                ),
                "{e:?}"
            );
            assert!(!e.to_string().is_empty());
        }
    }
    println!(
        "after the restart: {:?} / {:?}",
        first.as_ref().map(|i| i.version),
        second.as_ref().map(|i| i.version)
    );
    if let (Ok(a), Ok(b)) = (&first, &second) {
        support::assert_agreement(&[a.clone(), b.clone()], 2, 2);
    }
}
