//! The test harness itself: start, TLS, metrics, stop/restart, no orphans.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use rdzv_core::PutOptions;
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
    assert_eq!(got.kv.expect("kept").value, b"v");
}
