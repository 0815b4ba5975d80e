//! The test harness itself: start, TLS, metrics, stop/restart, no orphans.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use rdzv_core::kv::PutOptions;
use rdzv_etcd::testing::EtcdServer;

#[tokio::test]
async fn starts_answers_and_counts_proposals() {
    let server = EtcdServer::start().await.expect("etcd starts");
    let kv = server.kv().await;
    let before = server.proposals_committed().await.expect("metrics");
    kv.put(b"k", b"v", PutOptions::OVERWRITE).await.expect("put");
    let after = server.proposals_committed().await.expect("metrics");
    assert!(after > before, "a put is a proposal: {before} -> {after}");
    assert!(server.url("job?min_workers=2").starts_with("etcd://127.0.0.1:"));
    assert!(server.url("job?min_workers=2").ends_with("/job?min_workers=2"));
}

#[tokio::test]
async fn restart_keeps_data() {
    let mut server = EtcdServer::start().await.expect("etcd starts");
    let kv = server.kv().await;
    kv.put(b"k", b"v", PutOptions::OVERWRITE).await.expect("put");
    server.stop().await.expect("stop");
    assert!(!server.is_running());
    server.restart().await.expect("restart");
    let got = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(read) = kv.get(b"k").await {
                return read;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the client reconnects after the restart");
    assert_eq!(got.kv.expect("kept").value, &b"v"[..]);
}

#[test]
fn a_panicking_test_leaves_no_server_behind() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let server = EtcdServer::start().await.expect("etcd starts");
            tx.send(server.endpoint().port).expect("send the port");
            panic!("a test fails while its server runs");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let port = rx.recv().expect("the server had started");
    let refused = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(refused.is_err(), "the server on port {port} is gone after the panic");
}

/// What each operation costs in Raft proposals (what `etcd_server_proposals_committed_total`
/// counts): writes and lease grants/revokes one each, a failed compare-and-swap one too
/// (it is a write transaction), reads, watches and keep-alives none.
#[tokio::test]
async fn proposal_costs_of_the_operations() {
    use rdzv_core::kv::{PutMode, RangeOptions, WatchScope};

    let server = EtcdServer::start().await.expect("etcd starts");
    let kv = server.kv().await;
    let proposals = || async { server.proposals_committed().await.expect("metrics") };
    let mut last = proposals().await;
    let mut cost = |what: &str, expected: u64, now: u64| {
        assert_eq!(now - last, expected, "{what}");
        last = now;
    };
    let written = kv.put(b"k", b"v", PutOptions::new(PutMode::Create)).await.expect("put");
    cost("a put", 1, proposals().await);
    let lost = kv.put(b"k", b"w", PutOptions::new(PutMode::Create)).await.expect("put");
    assert!(!lost.is_written());
    cost("a failed create", 1, proposals().await);
    kv.get(b"k").await.expect("get");
    kv.range(b"", RangeOptions { count_only: true, ..RangeOptions::default() }).await.expect("count");
    let _events = kv.watch(b"k", WatchScope::Key, 1).await.expect("watch");
    cost("reads and a watch", 0, proposals().await);
    let lease = kv.lease_grant(Duration::from_secs(5)).await.expect("grant");
    cost("a lease grant", 1, proposals().await);
    kv.lease_keep_alive(lease).await.expect("keep-alive");
    cost("a keep-alive", 0, proposals().await);
    kv.lease_revoke(lease).await.expect("revoke");
    cost("a revoke", 1, proposals().await);
    let _ = written;
}
