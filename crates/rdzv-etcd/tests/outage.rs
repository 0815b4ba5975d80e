//! The server going away under a running client: operations fail quickly and retryably,
//! watches resume without gap or duplicate when it comes back (or end with an error when
//! it does not), leases can be refreshed again after it returns; nothing hangs or panics.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use rdzv_core::kv::{EventKind, PutOptions, PutOutcome, WatchScope};
use rdzv_core::url::Endpoint;
use rdzv_core::{Kv, KvError};
use rdzv_etcd::testing::EtcdServer;
use rdzv_etcd::{EtcdKv, EtcdOptions};

const WAIT: Duration = Duration::from_secs(30);

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out {what}"))
}

async fn put(kv: &EtcdKv, key: &[u8], value: &[u8]) -> i64 {
    match within("put", kv.put(key, value, PutOptions::OVERWRITE)).await.unwrap() {
        PutOutcome::Written { revision, .. } => revision,
        other => panic!("not written: {other:?}"),
    }
}

/// A client with a short request timeout, so that outage errors come fast.
async fn client(server: &EtcdServer) -> EtcdKv {
    let options = server
        .options()
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2));
    EtcdKv::connect(options).await.unwrap()
}

/// Retries `put` until the server answers again.
async fn put_when_back(kv: &EtcdKv, key: &[u8], value: &[u8]) -> i64 {
    within("the server to answer again", async {
        loop {
            match kv.put(key, value, PutOptions::OVERWRITE).await {
                Ok(PutOutcome::Written { revision, .. }) => return revision,
                Ok(other) => panic!("not written: {other:?}"),
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("non-retryable error after a restart: {e}"),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_during_an_outage_fail_quickly_and_retryably() {
    let mut server = EtcdServer::start().await.unwrap();
    let kv = client(&server).await;
    put(&kv, b"k", b"v").await;
    server.stop().await.unwrap();

    let started = Instant::now();
    let get = kv.get(b"k").await.unwrap_err();
    let put_err = kv.put(b"k", b"w", PutOptions::OVERWRITE).await.unwrap_err();
    let grant = kv.lease_grant(Duration::from_secs(5)).await.unwrap_err();
    let watch = kv.watch(b"k", WatchScope::Key, 1).await.err();
    let elapsed = started.elapsed();
    for err in [&get, &put_err, &grant] {
        assert!(err.is_retryable(), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&server.client_url()), "names the endpoint: {text}");
    }
    let watch = watch.expect("opening a watch on a stopped server fails");
    assert!(watch.is_retryable(), "{watch:?}");
    assert!(elapsed < Duration::from_secs(9), "four failures took {elapsed:?}");

    server.restart().await.unwrap();
    put_when_back(&kv, b"k", b"again").await;
    assert_eq!(kv.get(b"k").await.unwrap().kv.unwrap().value, &b"again"[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_after_a_restart_without_gap_or_duplicate() {
    let mut server = EtcdServer::start().await.unwrap();
    let kv = client(&server).await;
    let first = put(&kv, b"w/1", b"a").await;
    put(&kv, b"w/2", b"b").await;
    let mut events = kv.watch(b"w/", WatchScope::Prefix, first).await.unwrap();
    for expected in [b"w/1", b"w/2"] {
        let event = within("event", events.next()).await.unwrap().unwrap();
        assert_eq!(event.kv.key, expected);
    }
    // A crash, not a clean stop.
    server.kill().await.unwrap();
    server.restart().await.unwrap();
    let third = put_when_back(&kv, b"w/3", b"c").await;
    kv.delete(b"w/1", rdzv_core::kv::DeleteMode::Any).await.unwrap();
    let event = within("the first event after the restart", events.next()).await.unwrap().unwrap();
    assert_eq!(event.kv.key, b"w/3");
    assert_eq!(event.revision(), third);
    let event = within("the delete", events.next()).await.unwrap().unwrap();
    assert_eq!(event.kind, EventKind::Delete);
    assert_eq!(event.kv.key, b"w/1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_with_unavailable_when_the_server_stays_away() {
    let mut server = EtcdServer::start().await.unwrap();
    let kv = client(&server).await;
    let rev = put(&kv, b"k", b"v").await;
    let mut events = kv.watch(b"k", WatchScope::Key, rev + 1).await.unwrap();
    server.stop().await.unwrap();
    let started = Instant::now();
    match within("the watch to give up", events.next()).await {
        Some(Err(KvError::Unavailable { endpoint, message, .. })) => {
            assert_eq!(endpoint, server.client_url());
            assert!(message.contains(&format!("revision {}", rev + 1)), "{message}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(25), "{:?}", started.elapsed());
    assert!(within("end", events.next()).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_can_be_kept_alive_again_after_a_restart() {
    let mut server = EtcdServer::start().await.unwrap();
    let kv = client(&server).await;
    let lease = kv.lease_grant(Duration::from_secs(10)).await.unwrap();
    kv.put(b"owned", b"v", PutOptions::OVERWRITE.with_lease(Some(lease))).await.unwrap();
    server.stop().await.unwrap();
    let started = Instant::now();
    let err = kv.lease_keep_alive(lease).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    server.restart().await.unwrap();
    let ttl = within("keep-alive after the restart", async {
        loop {
            match kv.lease_keep_alive(lease).await {
                Ok(ttl) => return ttl,
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("the lease should survive a short outage: {e}"),
            }
        }
    })
    .await;
    assert_eq!(ttl, Duration::from_secs(10));
    assert!(kv.get(b"owned").await.unwrap().kv.is_some());
}

#[tokio::test]
async fn connecting_to_nothing_is_unavailable_and_names_the_endpoint() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let options = EtcdOptions::new(vec![Endpoint { host: "127.0.0.1".to_string(), port }])
        .with_connect_timeout(Duration::from_secs(2));
    let started = Instant::now();
    let err = EtcdKv::connect(options).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert!(matches!(err, KvError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_instead_of_hanging() {
    // Accepts connections but never speaks: every request must end by its deadline.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let options = EtcdOptions::new(vec![Endpoint { host: "127.0.0.1".to_string(), port }])
        .with_connect_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let err = EtcdKv::connect(options).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_survives_an_outage_shorter_than_its_ttl() {
    let mut server = EtcdServer::start().await.unwrap();
    let kv: std::sync::Arc<dyn Kv> = std::sync::Arc::new(client(&server).await);
    let session = rdzv_core::Session::start(kv.clone(), Duration::from_secs(6)).await.unwrap();
    kv.put(b"member", b"me", PutOptions::OVERWRITE.with_lease(Some(session.lease()))).await.unwrap();
    server.kill().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.restart().await.unwrap();
    // Several refresh periods (TTL/3) after the restart.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!session.is_lost(), "a short outage must not lose the session");
    assert!(kv.get(b"member").await.unwrap().kv.is_some());
    session.close().await.unwrap();
    assert!(kv.get(b"member").await.unwrap().kv.is_none(), "closing revokes at once");
}
