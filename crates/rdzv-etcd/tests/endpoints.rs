//! Several endpoints: requests are balanced over the ones that answer; a dead member does
//! not fail requests while a live one is left.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use rdzv_core::Kv;
use rdzv_core::kv::{PutOptions, PutOutcome, WatchScope};
use rdzv_core::url::Endpoint;
use rdzv_etcd::EtcdKv;
use rdzv_etcd::testing::shared;

fn dead_endpoint() -> Endpoint {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    Endpoint { host: "127.0.0.1".to_string(), port: listener.local_addr().unwrap().port() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_among_live_ones_does_not_fail_requests() {
    let server = shared().await.unwrap();
    let mut options = server.options();
    // The dead one first, and twice: it must not matter.
    options.endpoints = vec![dead_endpoint(), server.endpoint(), dead_endpoint()];
    options.connect_timeout = Duration::from_secs(2);
    let kv = EtcdKv::connect(options).await.expect("one live endpoint is enough").with_namespace("multi/");
    assert_eq!(kv.endpoints().split(',').count(), 3);
    let mut failures = Vec::new();
    for i in 0..30 {
        let key = format!("k{i}");
        match kv.put(key.as_bytes(), b"v", PutOptions::OVERWRITE).await {
            Ok(PutOutcome::Written { revision, .. }) => {
                let mut events = match kv.watch(key.as_bytes(), WatchScope::Key, revision).await {
                    Ok(events) => events,
                    Err(e) => {
                        failures.push(format!("watch: {e}"));
                        continue;
                    }
                };
                let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
                assert!(matches!(event, Ok(Some(Ok(_)))), "{event:?}");
            }
            Ok(other) => panic!("not written: {other:?}"),
            Err(e) => failures.push(format!("put: {e}")),
        }
        if let Err(e) = kv.get(key.as_bytes()).await {
            failures.push(format!("get: {e}"));
        }
        match kv.lease_grant(Duration::from_secs(5)).await {
            Ok(lease) => {
                if let Err(e) = kv.lease_revoke(lease).await {
                    failures.push(format!("revoke: {e}"));
                }
            }
            Err(e) => failures.push(format!("grant: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} requests failed, e.g. {:?}", failures.len(), failures.first());
}

#[tokio::test]
async fn only_dead_endpoints_fail_fast() {
    let mut options = rdzv_etcd::EtcdOptions::new(vec![dead_endpoint(), dead_endpoint()]);
    options.connect_timeout = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let err = EtcdKv::connect(options).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}
