//! What the conformance suite cannot see: server-clock leases, history trimming, server
//! restarts and dropped connections, foreign data under our keys, TLS, URLs.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rdzv_core::{
    BackendFactory, Endpoint, EventKind, Kv, KvError, PutOptions, PutOutcome, RangeOptions, RendezvousUrl,
    Secret, WatchScope, WatchStream,
};
use rdzv_redis::testing::{RedisServer, shared};
use rdzv_redis::{RedisConfig, RedisFactory, RedisKv};

/// Bound of every wait in these tests.
const WAIT: Duration = Duration::from_secs(15);

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out {what}"))
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

async fn connect(config: RedisConfig) -> Arc<dyn Kv> {
    Arc::new(within("connecting", RedisKv::connect(config)).await.expect("connect"))
}

async fn put(kv: &dyn Kv, key: &[u8], value: &[u8], options: PutOptions) -> i64 {
    match within("put", kv.put(key, value, options)).await.expect("put") {
        PutOutcome::Written { revision, .. } => revision,
        other => panic!("not written: {other:?}"),
    }
}

async fn next(events: &mut WatchStream) -> rdzv_core::KvResult<rdzv_core::Event> {
    within("waiting for a watch event", events.next()).await.expect("watch ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_deadline_comes_from_the_server_clock_and_expires_without_writes() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let kv = connect(server.config(&ns)).await;
    let watcher = connect(server.config(&ns)).await;
    let mut events = within("watch", watcher.watch(b"/a/", WatchScope::Prefix, 0)).await.unwrap();

    let lease = within("grant", kv.lease_grant(Duration::from_secs(1))).await.unwrap();
    let mut conn = raw(server).await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let server_now_ms = secs * 1000 + micros / 1000;
    let deadline: f64 = redis::cmd("ZSCORE")
        .arg(format!("{{rdzv:{ns}}}:leases"))
        .arg(lease)
        .query_async(&mut conn)
        .await
        .unwrap();
    let delta = deadline as i64 - server_now_ms as i64;
    // At most the TTL after the server's now (the grant came first), and not much less.
    assert!((500..=1000).contains(&delta), "deadline is {delta} ms after the server's now, not ~1000");

    let r1 = put(&*kv, b"/a/1", b"x", PutOptions::OVERWRITE.with_lease(Some(lease))).await;
    let r2 = put(&*kv, b"/a/2", b"y", PutOptions::OVERWRITE.with_lease(Some(lease))).await;
    assert_eq!(next(&mut events).await.unwrap().revision(), r1);
    assert_eq!(next(&mut events).await.unwrap().revision(), r2);
    // Nobody writes or reads from now on: the reapers alone must end the lease.
    let started = tokio::time::Instant::now();
    let d1 = next(&mut events).await.unwrap();
    let d2 = next(&mut events).await.unwrap();
    let waited = started.elapsed();
    assert_eq!((d1.kind, d2.kind), (EventKind::Delete, EventKind::Delete));
    assert_eq!(d1.revision(), d2.revision(), "keys of one lease go at one revision");
    assert!(d1.revision() > r2);
    assert!(waited < Duration::from_secs(3), "expiry took {waited:?}");
    assert!(matches!(kv.lease_keep_alive(lease).await, Err(KvError::LeaseNotFound(l)) if l == lease));
    // The lease is server state: another client sees it gone too.
    assert!(matches!(watcher.lease_revoke(lease).await, Err(KvError::LeaseNotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_trimmed_to_its_bound_and_detected_exactly() {
    let server = shared();
    let mut config = server.config(&RedisServer::fresh_namespace());
    config.history = 10;
    let kv = connect(config.clone()).await;
    let mut last = 0;
    for i in 0..30 {
        last = put(&*kv, b"k", format!("{i}").as_bytes(), PutOptions::OVERWRITE).await;
    }
    assert_eq!(last, 30);
    let oldest = last - 10 + 1;
    match kv.watch(b"k", WatchScope::Key, oldest - 1).await {
        Err(KvError::Compacted { requested, oldest: o }) => assert_eq!((requested, o), (oldest - 1, oldest)),
        Err(e) => panic!("expected Compacted, got {e}"),
        Ok(_) => panic!("expected Compacted, got a watch"),
    }
    let mut events = within("watch", kv.watch(b"k", WatchScope::Key, oldest)).await.unwrap();
    for rev in oldest..=last {
        assert_eq!(next(&mut events).await.unwrap().revision(), rev);
    }
    let mut conn = raw(server).await;
    let len: u64 =
        redis::cmd("XLEN").arg(format!("{}log", config.key_base())).query_async(&mut conn).await.unwrap();
    assert_eq!(len, 10, "the log keeps exactly `history` revisions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_after_its_connection_is_killed() {
    let server = RedisServer::start().expect("redis-server");
    let kv = connect(server.config("resume")).await;
    let mut events = within("watch", kv.watch(b"/w/", WatchScope::Prefix, 0)).await.unwrap();
    let r1 = put(&*kv, b"/w/1", b"1", PutOptions::OVERWRITE).await;
    assert_eq!(next(&mut events).await.unwrap().revision(), r1);
    // Kill every client connection but the killer's; the server keeps its data.
    let mut conn = raw(&server).await;
    let _: redis::Value =
        redis::cmd("CLIENT").arg("KILL").arg("SKIPME").arg("yes").query_async(&mut conn).await.unwrap();
    // Writes are never retried blindly: the first after the kill may fail, later ones work.
    let mut revisions = Vec::new();
    for i in 2..=6 {
        let key = format!("/w/{i}");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match kv.put(key.as_bytes(), b"v", PutOptions::OVERWRITE).await {
                Ok(PutOutcome::Written { revision, .. }) => {
                    revisions.push(revision);
                    break;
                }
                Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {}
                other => panic!("put after reconnect: {other:?}"),
            }
        }
    }
    for rev in revisions {
        assert_eq!(next(&mut events).await.unwrap().revision(), rev, "no gap, no duplicate");
    }
}

/// Every connection of a client reset (a middlebox dropped them, the server was fine): the
/// first request after it must not fail — not a read, not a write, not a lease grant (what
/// `RendezvousHandler::new` starts with). They used to fail once with a broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_requests_after_every_connection_was_reset_succeed() {
    let server = RedisServer::start().expect("redis-server");
    let link =
        rdzv_netfault::Link::start([std::net::SocketAddr::from(([127, 0, 0, 1], server.port()))]).unwrap();
    let mut config = server.config("reset");
    config.endpoint = Endpoint { host: "127.0.0.1".into(), port: link.endpoints()[0].port() };
    let kv = connect(config).await;
    put(&*kv, b"/r/0", b"v", PutOptions::OVERWRITE).await;
    let lease = within("grant", kv.lease_grant(Duration::from_secs(30))).await.unwrap();
    within("keep-alive", kv.lease_keep_alive(lease)).await.unwrap();
    for round in 0..3 {
        assert!(link.cut() > 0, "no connection to reset");
        // The resets reach the client (a real one arrives before the next request, too).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let key = format!("/r/{round}-put");
        within("put", kv.put(key.as_bytes(), b"v", PutOptions::OVERWRITE))
            .await
            .unwrap_or_else(|e| panic!("put after reset {round}: {e}"));
        link.cut();
        tokio::time::sleep(Duration::from_millis(200)).await;
        within("grant", kv.lease_grant(Duration::from_secs(30)))
            .await
            .unwrap_or_else(|e| panic!("grant after reset {round}: {e}"));
        link.cut();
        tokio::time::sleep(Duration::from_millis(200)).await;
        within("keep-alive", kv.lease_keep_alive(lease))
            .await
            .unwrap_or_else(|e| panic!("keep-alive after reset {round}: {e}"));
        link.cut();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut params = rdzv_core::RendezvousParams::new("reset", 1, 1).unwrap();
        params.node_id = Some(format!("n{round}"));
        let handler = within("new", rdzv_core::RendezvousHandler::new(kv.clone(), params)).await;
        handler.unwrap_or_else(|e| panic!("RendezvousHandler::new after reset {round}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_is_unavailable_then_reported_as_lost_data() {
    let mut server = RedisServer::start().expect("redis-server");
    let mut config = server.config("restart");
    config.request_timeout = Duration::from_secs(2);
    let kv = connect(config.clone()).await;
    let rev = put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;
    let mut events = within("watch", kv.watch(b"k", WatchScope::Key, rev + 1)).await.unwrap();

    server.stop();
    let started = tokio::time::Instant::now();
    for op in 0..3 {
        let e = within("an operation during the outage", kv.get(b"k")).await.unwrap_err();
        assert!(matches!(e, KvError::Unavailable { .. } | KvError::Timeout { .. }), "op {op}: {e}");
        let text = e.to_string();
        assert!(text.contains(&format!("127.0.0.1:{}", server.port())), "{text}");
    }
    let e = within("a write during the outage", kv.put(b"k", b"w", PutOptions::OVERWRITE)).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(started.elapsed() < Duration::from_secs(12), "the outage errors took {:?}", started.elapsed());

    server.restart().expect("restart");
    // The restarted server is empty: the old client must say so, not serve a new history.
    let deadline = tokio::time::Instant::now() + WAIT;
    let lost = loop {
        match kv.get(b"k").await {
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => break e,
            Ok(r) => panic!("a read after the data loss succeeded: {r:?}"),
        }
    };
    assert!(matches!(lost, KvError::Backend { .. }), "{lost}");
    assert!(lost.to_string().contains("lost"), "{lost}");
    // The open watch ends with an error: the outage outlasted its reconnect window, or it
    // came back to a namespace that is not the one it watched.
    let e = next(&mut events).await.unwrap_err();
    assert!(e.is_retryable() || e.to_string().contains("lost"), "{e}");
    assert!(within("watch end", events.next()).await.is_none());
    // A new client starts over.
    let fresh = connect(config).await;
    assert!(within("get", fresh.get(b"k")).await.unwrap().kv.is_none());
    // And the old one still refuses (the namespace is not the one it knew).
    assert!(matches!(kv.get(b"k").await, Err(KvError::Backend { .. })));
}

/// The error of a client that found its server rolled back: clear, and never retryable.
fn assert_rolled_back(e: &KvError, what: &str) {
    assert!(matches!(e, KvError::Backend { .. }) && !e.is_retryable(), "{what}: {e:?}");
    assert!(e.to_string().contains("rolled back"), "{what}: {e}");
}

/// Retries `op` while the server is coming back (retryable errors), for at most `WAIT`.
async fn once_back<T, F, Fut>(mut op: F) -> rdzv_core::KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = rdzv_core::KvResult<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match op().await {
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_an_older_snapshot_is_a_rollback_for_operations_and_watches() {
    let mut server = RedisServer::start().expect("redis-server");
    let mut config = server.config("rollback");
    config.request_timeout = Duration::from_secs(2);
    let kv = connect(config.clone()).await;
    let watcher = connect(config.clone()).await;
    let first = put(&*kv, b"/p/a", b"before", PutOptions::OVERWRITE).await;
    let mut events = within("watch", watcher.watch(b"/p/", WatchScope::Prefix, first + 1)).await.unwrap();
    let saved = put(&*kv, b"/p/b", b"before", PutOptions::OVERWRITE).await;
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    // Acknowledged after the snapshot: the restart loses them.
    let lost = put(&*kv, b"/p/a", b"after", PutOptions::OVERWRITE).await;
    let last = put(&*kv, b"/p/c", b"after", PutOptions::OVERWRITE).await;
    for rev in [saved, lost, last] {
        assert_eq!(next(&mut events).await.unwrap().revision(), rev);
    }

    server.restart_from_snapshot().expect("restart from the snapshot");
    // A client that attaches after the restart carries on from the snapshot and is handed
    // the lost revision again, for a different value. (If an old client has already
    // detected the rollback, the namespace was reset and it attaches to the new epoch.)
    let mut reused = None;
    for _ in 0..3 {
        let fresh = connect(config.clone()).await;
        match once_back(|| fresh.put(b"/p/a", b"stranger", PutOptions::OVERWRITE)).await {
            Ok(PutOutcome::Written { revision, .. }) => {
                reused = Some(revision);
                break;
            }
            Err(e) => assert_rolled_back(&e, "a client attached just before the reset"),
            Ok(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(reused, Some(lost), "the restored server hands out revision {lost} again");

    // A compare-and-swap on the revision the old client remembers would match the
    // stranger's value: it must be refused, loudly.
    let e = once_back(|| kv.put(b"/p/a", b"mine", PutOptions::new(rdzv_core::PutMode::Update(lost))))
        .await
        .expect_err("a swap on a reused revision succeeded");
    assert_rolled_back(&e, "the swap");
    let e = kv.get(b"/p/a").await.expect_err("a read after the rollback succeeded");
    assert_rolled_back(&e, "the next read");
    // The open watch ends with the same error instead of skipping the reused revisions.
    let e = next(&mut events).await.expect_err("the watch went on after the rollback");
    assert_rolled_back(&e, "the watch");
    assert!(within("watch end", events.next()).await.is_none());
    let e = once_back(|| watcher.get(b"/p/a")).await.expect_err("the watcher's client went on");
    assert_rolled_back(&e, "the watcher's client");
    // A new client starts over on what the server has.
    let fresh = connect(config).await;
    let got = within("get", fresh.get(b"/p/a")).await.unwrap().kv.unwrap();
    assert_eq!(got.value, &b"stranger"[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_keeps_every_write_is_not_a_rollback() {
    let mut server = RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"])
        .expect("redis-server with AOF");
    let mut config = server.config("durable");
    config.request_timeout = Duration::from_secs(2);
    let kv = connect(config.clone()).await;
    let first = put(&*kv, b"/d/a", b"1", PutOptions::OVERWRITE).await;
    let mut events = within("watch", kv.watch(b"/d/", WatchScope::Prefix, first)).await.unwrap();
    let last = put(&*kv, b"/d/b", b"2", PutOptions::OVERWRITE).await;
    for rev in [first, last] {
        assert_eq!(next(&mut events).await.unwrap().revision(), rev);
    }

    server.restart_keeping_files().expect("restart");
    // Everything acknowledged is still there: the same client carries on, watch included.
    let got = once_back(|| kv.get(b"/d/b")).await.expect("a read after a lossless restart");
    assert_eq!((got.revision, got.kv.unwrap().value.to_vec()), (last, b"2".to_vec()));
    let next_rev = once_back(|| kv.put(b"/d/c", b"3", PutOptions::OVERWRITE)).await.expect("write");
    assert!(matches!(next_rev, PutOutcome::Written { revision, .. } if revision == last + 1), "{next_rev:?}");
    assert_eq!(next(&mut events).await.unwrap().revision(), last + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_that_go_back_without_a_restart_are_a_rollback_too() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let base = format!("{{rdzv:{ns}}}:");
    let mut conn = raw(server).await;

    // A lease id handed out again: a keep-alive could renew a stranger's lease.
    let kv = connect(server.config(&ns)).await;
    let lease = within("grant", kv.lease_grant(Duration::from_secs(30))).await.unwrap();
    let _: () =
        redis::cmd("SET").arg(format!("{base}leaseid")).arg(lease - 1).query_async(&mut conn).await.unwrap();
    let e = kv.lease_keep_alive(lease).await.expect_err("keep-alive after the lease ids went back");
    assert_rolled_back(&e, "keep-alive");
    assert!(e.to_string().contains("lease"), "{e}");

    // The revision going back under a quiet watch (no reconnect): the feed's own check.
    let ns = RedisServer::fresh_namespace();
    let base = format!("{{rdzv:{ns}}}:");
    let kv = connect(server.config(&ns)).await;
    // A client that never saw past the restored revision, so cannot tell by itself.
    let other = connect(server.config(&ns)).await;
    let rev = put(&*kv, b"/q/1", b"v", PutOptions::OVERWRITE).await;
    put(&*kv, b"/q/2", b"v", PutOptions::OVERWRITE).await;
    let mut events = within("watch", kv.watch(b"/q/", WatchScope::Prefix, rev)).await.unwrap();
    assert_eq!(next(&mut events).await.unwrap().revision(), rev);
    assert_eq!(next(&mut events).await.unwrap().revision(), rev + 1);
    let _: () =
        redis::cmd("SET").arg(format!("{base}rev")).arg(rev - 1).query_async(&mut conn).await.unwrap();
    let e = next(&mut events).await.expect_err("the watch went on after the rollback");
    assert_rolled_back(&e, "the quiet watch");
    let e = kv.get(b"/q/1").await.expect_err("a read after the rollback");
    assert_rolled_back(&e, "the read");
    // The watcher's client told the others: they stop too, within about a second.
    let deadline = tokio::time::Instant::now() + WAIT;
    let e = loop {
        match other.get(b"/q/1").await {
            Err(e) => break e,
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Ok(r) => panic!("another client still reads after the rollback: {r:?}"),
        }
    };
    assert_rolled_back(&e, "another client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_is_unavailable_in_time() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut config = RedisConfig::new("127.0.0.1", port);
    config.connect_timeout = Duration::from_millis(500);
    config.password = Some(Secret::new("sekrit-pw"));
    let e = within("connect", RedisKv::connect(config)).await.unwrap_err();
    assert!(matches!(e, KvError::Unavailable { .. }), "{e}");
    let text = format!("{e} {e:?}");
    assert!(text.contains(&port.to_string()) && !text.contains("sekrit-pw"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_under_our_keys_is_a_clear_error() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let kv = connect(server.config(&ns)).await;
    put(&*kv, b"/x/good", b"1", PutOptions::OVERWRITE).await;
    let base = format!("{{rdzv:{ns}}}:");
    let mut conn = raw(server).await;

    // A string where a key record (a hash) belongs.
    let _: () =
        redis::cmd("SET").arg(format!("{base}k:/x/bad")).arg("garbage").query_async(&mut conn).await.unwrap();
    let e = kv.get(b"/x/bad").await.unwrap_err();
    assert!(matches!(e, KvError::Backend { .. }) && e.to_string().contains("/x/bad"), "{e}");
    let e = kv.put(b"/x/bad", b"v", PutOptions::OVERWRITE).await.unwrap_err();
    assert!(e.to_string().contains("/x/bad"), "{e}");
    // A hash without our metadata.
    let _: () = redis::cmd("HSET")
        .arg(format!("{base}k:/x/odd"))
        .arg("v")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = kv.get(b"/x/odd").await.unwrap_err();
    assert!(e.to_string().contains("/x/odd"), "{e}");
    // A hash with bad metadata on an indexed key: a range names it.
    let _: () = redis::cmd("HSET")
        .arg(format!("{base}k:/x/good"))
        .arg("m")
        .arg("soon")
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = kv.range(b"/x/", RangeOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("/x/good"), "{e}");
    // Other keys still work; the damage is named, not spread.
    put(&*kv, b"/y/1", b"1", PutOptions::OVERWRITE).await;
    // A revision counter that is not a number stops every operation, naming it.
    let _: () = redis::cmd("SET").arg(format!("{base}rev")).arg("many").query_async(&mut conn).await.unwrap();
    let e = kv.get(b"/y/1").await.unwrap_err();
    assert!(e.to_string().contains(&format!("{base}rev")), "{e}");
    // A log of the wrong type ends a watch with an error naming it.
    let _: () = redis::cmd("SET").arg(format!("{base}rev")).arg("5").query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("DEL").arg(format!("{base}log")).query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("SET").arg(format!("{base}log")).arg("x").query_async(&mut conn).await.unwrap();
    let e = match kv.watch(b"/y/", WatchScope::Prefix, 0).await {
        Err(e) => e,
        Ok(mut events) => next(&mut events).await.unwrap_err(),
    };
    assert!(e.to_string().contains(&format!("{base}log")), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connects_with_the_ca_and_refuses_another() {
    let server = RedisServer::start_tls().expect("redis-server with TLS");
    let config = server.tls_config("tls").expect("tls server");
    let kv = connect(config.clone()).await;
    let rev = put(&*kv, b"k", b"over tls", PutOptions::OVERWRITE).await;
    let got = within("get", kv.get(b"k")).await.unwrap();
    assert_eq!((got.revision, got.kv.unwrap().value.to_vec()), (rev, b"over tls".to_vec()));

    let other = tempfile::tempdir().unwrap();
    let wrong = rdzv_redis::testing::TlsFiles::generate(other.path()).unwrap();
    let mut bad = config.clone();
    bad.cacert = Some(wrong.ca);
    let e = within("connect with the wrong CA", RedisKv::connect(bad)).await.unwrap_err();
    assert!(e.to_string().contains(&format!(":{}", server.tls_port().unwrap())), "{e}");

    let mut missing = config;
    missing.cacert = Some(other.path().join("nope.pem"));
    let e = within("connect with a missing CA file", RedisKv::connect(missing)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)) && e.to_string().contains("nope.pem"), "{e}");
}

fn url(server: &RedisServer, options: &[(&str, &str)]) -> RendezvousUrl {
    RendezvousUrl {
        scheme: "redis".into(),
        endpoints: vec![Endpoint { host: "127.0.0.1".into(), port: server.port() }],
        username: None,
        password: None,
        run_id: "job".into(),
        options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        rendezvous_options: BTreeMap::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn factory_connects_from_a_url() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let factory = RedisFactory;
    assert_eq!(factory.default_port(), Some(6379));
    assert!(factory.options().contains(&"db"));
    let kv = within("connect", factory.connect(&url(server, &[("namespace", &ns), ("db", "2")])))
        .await
        .expect("connect");
    assert_eq!(kv.name(), "redis");
    let rev = put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;
    // The data went to database 2.
    let mut conn = raw(server).await;
    let _: () = redis::cmd("SELECT").arg(2).query_async(&mut conn).await.unwrap();
    let stored: Option<String> =
        redis::cmd("GET").arg(format!("{{rdzv:{ns}}}:rev")).query_async(&mut conn).await.unwrap();
    assert_eq!(stored, Some(rev.to_string()));

    let e = factory.connect(&url(server, &[("bogus", "1")])).await.unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
    // A user the server does not know (over RESP3 the default user, which needs no password
    // here, would take any).
    let mut with_password = url(server, &[("namespace", &ns)]);
    with_password.username = Some("nobody".into());
    with_password.password = Some(Secret::new("sekrit-pw"));
    let e = within("connect with a password", factory.connect(&with_password)).await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(!text.contains("sekrit-pw"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_increment_is_exact_or_declines() {
    let server = shared();
    let kv = connect(server.config(&RedisServer::fresh_namespace())).await;
    assert_eq!(kv.increment(b"n", 5).await.unwrap(), Some(5));
    assert_eq!(kv.increment(b"n", -7).await.unwrap(), Some(-2));
    put(&*kv, b"n", b"+40", PutOptions::OVERWRITE).await;
    assert_eq!(kv.increment(b"n", 2).await.unwrap(), Some(42));
    let got = kv.get(b"n").await.unwrap().kv.unwrap();
    assert_eq!((got.value.to_vec(), got.version), (b"42".to_vec(), 4));
    // Beyond what Lua's doubles hold exactly, the backend declines (callers use CAS).
    put(&*kv, b"big", b"9007199254740993", PutOptions::OVERWRITE).await;
    assert_eq!(kv.increment(b"big", 1).await.unwrap(), None);
    assert_eq!(kv.increment(b"n", 1 << 60).await.unwrap(), None);
    put(&*kv, b"text", b"twelve", PutOptions::OVERWRITE).await;
    assert!(matches!(kv.increment(b"text", 1).await, Err(KvError::InvalidArgument(m)) if m.contains("text")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_workers_join_count_and_watch_quickly() {
    let server = shared();
    let kv = connect(server.config(&RedisServer::fresh_namespace())).await;
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let kv = kv.clone();
        tasks.push(tokio::spawn(async move {
            let lease = kv.lease_grant(Duration::from_secs(10)).await.unwrap();
            let key = format!("/run/join/{i:03}");
            let options = PutOptions::new(rdzv_core::PutMode::Create).with_lease(Some(lease));
            let PutOutcome::Written { revision, .. } = kv.put(key.as_bytes(), b"w", options).await.unwrap()
            else {
                panic!("not written")
            };
            let position = kv
                .range(
                    b"/run/join/",
                    RangeOptions {
                        max_create_revision: Some(revision),
                        count_only: true,
                        ..Default::default()
                    },
                )
                .await
                .unwrap()
                .count;
            let events = kv.watch(b"/run/state", WatchScope::Key, revision + 1).await.unwrap();
            (position, events)
        }));
    }
    let mut positions = Vec::new();
    let mut watches = Vec::new();
    for t in tasks {
        let (position, events) = within("a worker joining", t).await.unwrap();
        positions.push(position);
        watches.push(events);
    }
    positions.sort_unstable();
    assert_eq!(positions, (1..=64).collect::<Vec<u64>>(), "each worker learns a distinct position");
    put(&*kv, b"/run/state", b"final", PutOptions::OVERWRITE).await;
    for mut events in watches {
        assert_eq!(next(&mut events).await.unwrap().kv.value, &b"final"[..].to_vec());
    }
    let elapsed = started.elapsed();
    eprintln!("64 workers joined, counted and watched in {elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "64 workers took {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_acl_users_log_in_and_never_show() {
    let server = RedisServer::start_with_args(&[
        "--requirepass",
        "default-pw",
        "--user",
        "alice",
        "on",
        ">alice-pw",
        "~*",
        "&*",
        "+@all",
    ])
    .expect("redis-server with a password");
    let mut config = server.config("auth");
    config.password = Some(Secret::new("default-pw"));
    let kv = connect(config.clone()).await;
    put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;

    let mut alice = config.clone();
    alice.username = Some("alice".into());
    alice.password = Some(Secret::new("alice-pw"));
    let kv = connect(alice.clone()).await;
    assert!(within("get", kv.get(b"k")).await.unwrap().kv.is_some());

    alice.password = Some(Secret::new("wrong-secret-pw"));
    let e = within("connect with a wrong password", RedisKv::connect(alice)).await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(!text.contains("wrong-secret-pw") && text.contains(&server.port().to_string()), "{text}");
    let mut nobody = config;
    nobody.password = None;
    let e = within("connect without a password", RedisKv::connect(nobody)).await.unwrap_err();
    assert!(!format!("{e:?}").contains("default-pw"), "{e:?}");
}

/// A hole in the event log that compaction does not explain (entries lost below the kept
/// history): a watch replaying across it ends as a dropped watch does — retryable, "read
/// again and watch again" — instead of with a final backend error that ended the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_across_lost_history_ends_retryably() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let kv = connect(server.config(&ns)).await;
    let first = put(&*kv, b"/h/1", b"1", PutOptions::OVERWRITE).await;
    let lost = put(&*kv, b"/h/2", b"2", PutOptions::OVERWRITE).await;
    put(&*kv, b"/h/3", b"3", PutOptions::OVERWRITE).await;
    let mut conn = raw(server).await;
    let removed: i64 = redis::cmd("XDEL")
        .arg(format!("{{rdzv:{ns}}}:log"))
        .arg(format!("{lost}-0"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(removed, 1, "the entry of revision {lost}");
    let mut events = within("watch", kv.watch(b"/h/", WatchScope::Prefix, first)).await.unwrap();
    assert_eq!(next(&mut events).await.unwrap().revision(), first);
    let error = next(&mut events).await.unwrap_err();
    assert!(matches!(error, KvError::WatchEnded { .. }) && error.needs_reread(), "{error:?}");
    assert!(within("watch end", events.next()).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_falls_behind_the_trimmed_log_ends_compacted() {
    let server = shared();
    let mut config = server.config(&RedisServer::fresh_namespace());
    config.history = 10;
    let kv = connect(config).await;
    let start = put(&*kv, b"/p/0", b"0", PutOptions::OVERWRITE).await + 1;
    let mut events = within("watch", kv.watch(b"/p/", WatchScope::Prefix, start)).await.unwrap();
    // Not consumed: the watch and its feed buffer some events, then it stops reading while the
    // log moves on and is trimmed past it. So does the feed's memory (32 MiB): the small
    // writes put the watch behind the feed's broadcast, the large ones push them out of memory.
    let (small, large) = (2000, 40);
    let value = vec![b'x'; 1 << 20];
    for i in 1..=small + large {
        let value: &[u8] = if i > small { &value } else { b"v" };
        put(&*kv, format!("/p/{i}").as_bytes(), value, PutOptions::OVERWRITE).await;
    }
    let writes = small + large;
    let mut expected = start;
    let error = loop {
        match next(&mut events).await {
            Ok(event) => {
                assert_eq!(event.revision(), expected, "no gap before the error");
                expected += 1;
            }
            Err(e) => break e,
        }
    };
    match error {
        KvError::Compacted { requested, oldest } => {
            assert_eq!(requested, expected);
            assert!(oldest > requested, "{oldest} <= {requested}");
        }
        e => panic!("expected Compacted, got {e}"),
    }
    assert!(expected < start + writes, "the watch should have fallen behind");
    assert!(within("watch end", events.next()).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_that_fall_behind_the_feed_catch_up_from_its_memory_not_the_log() {
    // A server of its own: the test counts the commands it served.
    let server = RedisServer::start().expect("redis-server");
    let kv = connect(server.config("lag")).await;
    let start = put(&*kv, b"/p/0", b"0", PutOptions::OVERWRITE).await + 1;
    // Busy consumers, as a thousand workers of one process are in a burst: nobody reads these
    // watches for now, so each buffers a few hundred events and then stops taking the feed's,
    // which moves on by more than its broadcast holds (1024 entries) and less than its memory
    // (32 768). A round's prefix delete or its joins are such a burst.
    let mut watches = Vec::new();
    for _ in 0..64 {
        watches.push(within("watch", kv.watch(b"/p/", WatchScope::Prefix, start)).await.unwrap());
    }
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await.unwrap();
    // More than one round of 1024 workers adds (about 4100 entries).
    let writes = 6000;
    for i in 1..=writes {
        put(&*kv, format!("/p/{i}").as_bytes(), b"v", PutOptions::OVERWRITE).await;
    }
    for events in watches.iter_mut() {
        for revision in start..start + writes {
            assert_eq!(next(events).await.unwrap().revision(), revision, "no gap, no duplicate");
        }
    }
    // Re-reading the log instead, 64 watches send ~1500 `XRANGE`s down the client's one shared
    // connection (a thousand watches, ~10 000, large round states among the entries), and the
    // client's writes queue behind them for seconds.
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.unwrap();
    let log_reads = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_xrange:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse::<u64>().unwrap());
    assert_eq!(log_reads, 0, "lagging watches re-read the log:\n{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_closes_its_connections_and_reaper() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = raw(&server).await;
    let clients = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("connected_clients")
    };
    let before = clients(redis::cmd("INFO").arg("clients").query_async(&mut conn).await.unwrap());
    let kv = connect(server.config("drop")).await;
    let mut watches = Vec::new();
    for i in 0..50 {
        let key = format!("k{i}");
        watches.push(within("watch", kv.watch(key.as_bytes(), WatchScope::Key, 0)).await.unwrap());
    }
    let during = clients(redis::cmd("INFO").arg("clients").query_async(&mut conn).await.unwrap());
    assert_eq!(during, before + 2, "one shared connection, and one feed for all 50 watches");
    // Every watch still gets its own events.
    for i in [0, 49] {
        put(&*kv, format!("k{i}").as_bytes(), b"v", PutOptions::OVERWRITE).await;
        assert_eq!(next(&mut watches[i]).await.unwrap().kv.key, format!("k{i}").into_bytes());
    }
    drop(watches);
    drop(kv);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = clients(redis::cmd("INFO").arg("clients").query_async(&mut conn).await.unwrap());
        if now == before {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{now} clients left, expected {before}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parsed_urls_reach_the_server_plain_and_tls() {
    let server = RedisServer::start_tls().expect("redis-server with TLS");
    let ns = RedisServer::fresh_namespace();
    let plain = RendezvousUrl::parse(&server.url("job", &format!("namespace={ns}&db=1&min_workers=2")))
        .expect("plain URL parses");
    let kv = within("connect", RedisFactory.connect(&plain)).await.expect("plain connect");
    let rev = put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;
    let tls = RendezvousUrl::parse(&server.tls_url("job", &format!("namespace={ns}&db=1")).unwrap())
        .expect("TLS URL parses");
    let kv = within("connect", RedisFactory.connect(&tls)).await.expect("TLS connect");
    // Same server, database and namespace over TLS: the same data.
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().mod_revision, rev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_workers_watch_from_their_own_writes_through_one_feed() {
    let server = shared();
    let kv = connect(server.config(&RedisServer::fresh_namespace())).await;
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..1024 {
        let kv = kv.clone();
        tasks.push(tokio::spawn(async move {
            let revision = put(&*kv, format!("/j/{i}").as_bytes(), b"v", PutOptions::OVERWRITE).await;
            // From "my write + 1": replayed from the feed's memory, not re-read per worker.
            kv.watch(b"/state", WatchScope::Key, revision + 1).await.expect("watch")
        }));
    }
    let mut watches = Vec::new();
    for t in tasks {
        watches.push(within("a worker writing and watching", t).await.unwrap());
    }
    let joined = started.elapsed();
    let rev = put(&*kv, b"/state", b"go", PutOptions::OVERWRITE).await;
    for events in watches.iter_mut() {
        assert_eq!(next(events).await.unwrap().revision(), rev);
    }
    eprintln!(
        "1024 workers wrote and watched in {joined:?}; all saw the event after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < WAIT);
}

fn assert_too_large(
    result: rdzv_core::KvResult<impl std::fmt::Debug>,
    what: &str,
    size: usize,
    limit: usize,
) {
    match result {
        Err(e @ KvError::TooLarge { backend: "redis", .. }) => {
            let KvError::TooLarge { what: w, size: s, limit: l, raise, .. } = &e else { unreachable!() };
            assert_eq!((*w, *s, *l), (what, size, limit));
            // Redis's limits are fixed: the message must not send anyone looking for an option.
            assert_eq!(*raise, None);
            assert!(!e.to_string().contains("option") && e.to_string().contains("fixed"), "{e}");
        }
        other => panic!("expected {what} of {size} bytes to be too large, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_values_and_requests_over_the_limits_are_refused_before_sending() {
    use rdzv_redis::{MAX_KEY_BYTES, MAX_REQUEST_BYTES, MAX_VALUE_BYTES};
    let server = shared();
    let kv = connect(server.config(&RedisServer::fresh_namespace())).await;
    let start = within("get", kv.get(b"k")).await.unwrap().revision;

    let long = vec![b'k'; MAX_KEY_BYTES + 1];
    let (size, limit) = (MAX_KEY_BYTES + 1, MAX_KEY_BYTES);
    assert_too_large(kv.put(&long, b"v", PutOptions::OVERWRITE).await, "a key", size, limit);
    assert_too_large(kv.get(&long).await, "a key", size, limit);
    assert_too_large(kv.range(&long, RangeOptions::default()).await, "a key", size, limit);
    assert_too_large(kv.delete(&long, rdzv_core::DeleteMode::Any).await, "a key", size, limit);
    assert_too_large(kv.delete_prefix(&long).await, "a key", size, limit);
    assert_too_large(kv.increment(&long, 1).await, "a key", size, limit);
    assert_too_large(kv.watch(&long, WatchScope::Key, 0).await.map(|_| ()), "a key", size, limit);
    let big = vec![0u8; MAX_VALUE_BYTES + 1];
    assert_too_large(kv.put(b"k", &big, PutOptions::OVERWRITE).await, "a value", big.len(), MAX_VALUE_BYTES);
    let key = vec![b'k'; 100];
    let value = vec![0u8; MAX_REQUEST_BYTES - 50];
    assert_too_large(
        kv.put(&key, &value, PutOptions::OVERWRITE).await,
        "a request",
        100 + value.len(),
        MAX_REQUEST_BYTES,
    );
    let e = kv.put(&key, &value, PutOptions::OVERWRITE).await.unwrap_err();
    assert!(e.to_string().contains(&MAX_REQUEST_BYTES.to_string()), "the error names the limit: {e}");
    // Nothing was sent: no revision was used.
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().revision, start);

    // Exactly at the limits is fine.
    let at_limit = vec![b'k'; MAX_KEY_BYTES];
    put(&*kv, &at_limit, b"v", PutOptions::OVERWRITE).await;
    let value = vec![7u8; MAX_REQUEST_BYTES - 1];
    let rev = put(&*kv, b"k", &value, PutOptions::OVERWRITE).await;
    assert_eq!(rev, start + 2);
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().value, value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_full_of_separators_costs_a_bounded_number_of_indexes() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let kv = connect(server.config(&ns)).await;
    // 4095 bytes, 1365 '/' and 1365 '_': one index per separator would be 2731 sorted sets,
    // each holding the whole key, written by one atomic script.
    let key = b"/a_".repeat(1365);
    let first = put(&*kv, &key, b"1", PutOptions::OVERWRITE).await;
    let mut conn = raw(server).await;
    let indexes: Vec<String> =
        redis::cmd("KEYS").arg(format!("{{rdzv:{ns}}}:i:*")).query_async(&mut conn).await.unwrap();
    assert!(indexes.len() <= 51, "{} index sets for one key", indexes.len());

    // Prefixes past the indexed depth are still answered right, in creation order too.
    let mut sibling = b"/a_".repeat(30);
    sibling.extend_from_slice(b"/zz");
    let second = put(&*kv, &sibling, b"2", PutOptions::OVERWRITE).await;
    let deep_dir = b"/a_".repeat(30);
    let mut deep_dir = deep_dir.to_vec();
    deep_dir.push(b'/');
    let deep_underscore = b"/a_".repeat(25);
    for prefix in [&deep_dir[..], &deep_underscore[..], b"/a_/a_/"] {
        let by_create =
            RangeOptions { order: rdzv_core::RangeOrder::ByCreateRevision, ..RangeOptions::default() };
        let read = within("range", kv.range(prefix, by_create)).await.unwrap();
        let revs: Vec<i64> = read.kvs.iter().map(|kv| kv.create_revision).collect();
        assert_eq!((revs, read.count), (vec![first, second], 2), "prefix of {} bytes", prefix.len());
        let upto_first =
            RangeOptions { max_create_revision: Some(first), count_only: true, ..RangeOptions::default() };
        assert_eq!(within("count", kv.range(prefix, upto_first)).await.unwrap().count, 1);
    }
    // Deleting the key removes it from every index it was in.
    within("delete", kv.delete(&key, rdzv_core::DeleteMode::Any)).await.unwrap();
    let by_create =
        RangeOptions { order: rdzv_core::RangeOrder::ByCreateRevision, ..RangeOptions::default() };
    assert_eq!(within("range", kv.range(b"/a_/", by_create)).await.unwrap().count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_log_is_bounded_in_bytes_as_well_as_revisions() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let mut config = server.config(&ns);
    config.history_bytes = 100_000;
    let kv = connect(config).await;
    let value = vec![b'v'; 10_000];
    let mut revs = Vec::new();
    for i in 0..30 {
        revs.push(put(&*kv, format!("/b/{i:02}").as_bytes(), &value, PutOptions::OVERWRITE).await);
    }
    let log_key = format!("{{rdzv:{ns}}}:log");
    let mut conn = raw(server).await;
    let entries: redis::streams::StreamRangeReply =
        redis::cmd("XRANGE").arg(&log_key).arg("-").arg("+").query_async(&mut conn).await.unwrap();
    let bytes: usize = entries.ids.len() * (64 + 5 + 10_000);
    // Within the bound plus the newest revision, and not emptier than it needs to be.
    assert!(bytes <= 100_000 + 10_069, "the log holds {bytes} bytes of events");
    assert!(bytes > 100_000 - 10_069, "the log holds only {bytes} bytes of events");
    let counted: usize =
        redis::cmd("GET").arg(format!("{{rdzv:{ns}}}:logbytes")).query_async(&mut conn).await.unwrap();
    assert_eq!(counted, bytes);
    let sizes: usize =
        redis::cmd("XLEN").arg(format!("{{rdzv:{ns}}}:logsz")).query_async(&mut conn).await.unwrap();
    assert_eq!(sizes, entries.ids.len(), "one size per event kept");
    // A watch from before the kept history is told so; one from within it replays.
    let oldest = revs[revs.len() - entries.ids.len()];
    match kv.watch(b"/b/", WatchScope::Prefix, revs[0]).await {
        Err(KvError::Compacted { requested, oldest: o }) => assert_eq!((requested, o), (revs[0], oldest)),
        other => panic!("expected Compacted, got {:?}", other.map(|_| ())),
    }
    let mut events = within("watch", kv.watch(b"/b/", WatchScope::Prefix, oldest)).await.unwrap();
    for rev in &revs[revs.len() - entries.ids.len()..] {
        assert_eq!(next(&mut events).await.unwrap().revision(), *rev);
    }
    // Compaction keeps the count right.
    within("compact", kv.compact(*revs.last().unwrap())).await.unwrap();
    let counted: usize =
        redis::cmd("GET").arg(format!("{{rdzv:{ns}}}:logbytes")).query_async(&mut conn).await.unwrap();
    assert_eq!(counted, 64 + 5 + 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates_are_presented_and_their_absence_explained() {
    let server = RedisServer::start_tls_with_client_auth().expect("redis-server with TLS client auth");
    let ns = RedisServer::fresh_namespace();
    let config = server.tls_client_config(&ns).expect("tls server");
    let kv = connect(config.clone()).await;
    let rev = put(&*kv, b"k", b"with a client certificate", PutOptions::OVERWRITE).await;
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().mod_revision, rev);

    // From a URL, with the same option names as etcd's.
    let files = server.tls_files().unwrap();
    let url = server
        .tls_url(
            "job",
            &format!(
                "namespace={ns}&cert={}&key={}",
                files.client_cert.display(),
                files.client_key.display()
            ),
        )
        .unwrap();
    let kv =
        within("connect", RedisFactory.connect(&RendezvousUrl::parse(&url).unwrap())).await.expect("connect");
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().mod_revision, rev);

    // Without one, the server refuses: the error says so and names the options.
    let mut without = config.clone();
    without.cert = None;
    without.key = None;
    let e = within("connect without a client certificate", RedisKv::connect(without)).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, KvError::InvalidArgument(_)), "not retryable: {e:?}");
    assert!(text.contains("client certificate") && text.contains("cert=") && text.contains("key="), "{text}");
    assert!(text.contains(&format!(":{}", server.tls_port().unwrap())), "{text}");

    // A certificate from another CA is refused too; a key file that is not PEM is named.
    let other = tempfile::tempdir().unwrap();
    let stranger = rdzv_redis::testing::TlsFiles::generate(other.path()).unwrap();
    let mut foreign = config.clone();
    foreign.cert = Some(stranger.client_cert);
    foreign.key = Some(stranger.client_key);
    let e = within("connect with a foreign client certificate", RedisKv::connect(foreign)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("refused the client certificate"), "{e}");
    let mut not_pem = config;
    let junk = other.path().join("junk.key");
    std::fs::write(&junk, "not a key").unwrap();
    not_pem.key = Some(junk);
    let e = within("connect with a bad key file", RedisKv::connect(not_pem)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)) && e.to_string().contains("junk.key"), "{e}");
}

/// The ACL rules documented in docs/REDIS.md, for user `user` (password `password`) in
/// namespace `namespace`: the test runs exactly what the documentation says.
fn documented_acl(user: &str, password: &str, namespace: &str) -> Vec<String> {
    let doc = include_str!("../../../docs/REDIS.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER rdzv on >CHANGE-ME "))
        .expect("docs/REDIS.md documents the ACL rules");
    let mut words: Vec<String> = line.split_whitespace().skip(2).map(str::to_string).collect();
    for w in words.iter_mut() {
        match w.as_str() {
            "rdzv" => *w = user.to_string(),
            ">CHANGE-ME" => *w = format!(">{password}"),
            "~{rdzv:rdzv}:*" => *w = format!("~{{rdzv:{namespace}}}:*"),
            _ => {}
        }
    }
    words
}

async fn set_user(conn: &mut redis::aio::MultiplexedConnection, rules: &[String]) {
    let _: () = redis::cmd("ACL").arg("SETUSER").arg(rules).query_async(conn).await.unwrap();
}

/// Everything rdzv does: writes of every kind, reads, leases and their expiry, a watch, and
/// compaction.
async fn exercise(kv: &dyn Kv) {
    let rev = put(kv, b"/acl/a", b"1", PutOptions::OVERWRITE).await;
    let mut events = within("watch", kv.watch(b"/acl/", WatchScope::Prefix, rev)).await.unwrap();
    assert_eq!(next(&mut events).await.unwrap().revision(), rev);
    let lease = within("grant", kv.lease_grant(Duration::from_millis(600))).await.unwrap();
    put(kv, b"/acl/leased", b"x", PutOptions::OVERWRITE.with_lease(Some(lease))).await;
    within("keep-alive", kv.lease_keep_alive(lease)).await.unwrap();
    assert_eq!(within("increment", kv.increment(b"/acl/n", 2)).await.unwrap(), Some(2));
    let by_create =
        RangeOptions { order: rdzv_core::RangeOrder::ByCreateRevision, ..RangeOptions::default() };
    assert_eq!(within("range", kv.range(b"/acl/", by_create)).await.unwrap().count, 3);
    assert_eq!(within("range", kv.range(b"/acl/le", RangeOptions::default())).await.unwrap().count, 1);
    within("delete", kv.delete(b"/acl/n", rdzv_core::DeleteMode::Any)).await.unwrap();
    // The lease ends by itself: the reaper's expiry shows up in the watch.
    let mut kinds = Vec::new();
    while kinds.len() < 4 {
        kinds.push(next(&mut events).await.unwrap().kind);
    }
    assert_eq!(kinds, [EventKind::Put, EventKind::Put, EventKind::Delete, EventKind::Delete]);
    let short = within("grant", kv.lease_grant(Duration::from_secs(5))).await.unwrap();
    within("revoke", kv.lease_revoke(short)).await.unwrap();
    let last = within("delete_prefix", kv.delete_prefix(b"/acl/")).await.unwrap().revision;
    within("compact", kv.compact(last)).await.unwrap();
    assert!(within("get", kv.get(b"/acl/a")).await.unwrap().kv.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_is_enough_and_less_fails_clearly() {
    // A server of its own, so the script is not already cached by a more powerful user.
    let server = RedisServer::start().expect("redis-server");
    let mut admin = raw(&server).await;
    let ns = RedisServer::fresh_namespace();
    let rules = documented_acl("rdzv-exact", "pw-exact", &ns);
    set_user(&mut admin, &rules).await;
    let mut config = server.config(&ns);
    config.username = Some("rdzv-exact".into());
    config.password = Some(Secret::new("pw-exact"));
    let kv = connect(config.clone()).await;
    exercise(&*kv).await;

    // Without the stream read, watches fail, saying what is missing and where to look.
    let without_xread: Vec<String> = rules.iter().filter(|w| *w != "+xread").cloned().collect();
    assert!(without_xread.len() < rules.len());
    let mut user = without_xread.clone();
    user[0] = "rdzv-no-xread".into();
    set_user(&mut admin, &user).await;
    let mut no_xread = config.clone();
    no_xread.username = Some("rdzv-no-xread".into());
    let kv = connect(no_xread).await;
    let rev = put(&*kv, b"/w/1", b"v", PutOptions::OVERWRITE).await;
    let e = match within("watch", kv.watch(b"/w/", WatchScope::Prefix, rev)).await {
        Err(e) => e,
        // What the feed read before it tails the log may come first.
        Ok(mut events) => loop {
            if let Err(e) = next(&mut events).await {
                break e;
            }
        },
    };
    assert!(!e.is_retryable(), "{e:?}");
    assert!(e.to_string().contains("xread") && e.to_string().contains("docs/REDIS.md"), "{e}");

    // Without access to the namespace's keys, connecting fails the same way.
    let mut user = documented_acl("rdzv-other-keys", "pw-exact", "someone-else");
    user[0] = "rdzv-other-keys".into();
    set_user(&mut admin, &user).await;
    let mut other_keys = config.clone();
    other_keys.username = Some("rdzv-other-keys".into());
    let e = within("connect", RedisKv::connect(other_keys)).await.unwrap_err();
    assert!(!e.is_retryable(), "{e:?}");
    assert!(e.to_string().contains("docs/REDIS.md"), "{e}");

    // Another database needs `select` as well, as documented.
    let mut db1 = config.clone();
    db1.db = 1;
    let e = within("connect to db 1", RedisKv::connect(db1.clone())).await.unwrap_err();
    assert!(e.to_string().contains("docs/REDIS.md"), "{e}");
    let mut user = rules.clone();
    user[0] = "rdzv-db1".into();
    user.push("+select".into());
    set_user(&mut admin, &user).await;
    db1.username = Some("rdzv-db1".into());
    let kv = connect(db1.clone()).await;
    put(&*kv, b"/db1", b"v", PutOptions::OVERWRITE).await;
    db1.db = 100;
    let e = within("connect to db 100", RedisKv::connect(db1)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)) && e.to_string().contains("database 100"), "{e}");

    // Without one command used inside the script, the operation that needs it fails, named.
    let mut user: Vec<String> = rules.iter().filter(|w| *w != "+xtrim").cloned().collect();
    user[0] = "rdzv-no-xtrim".into();
    set_user(&mut admin, &user).await;
    let mut no_xtrim = config;
    no_xtrim.username = Some("rdzv-no-xtrim".into());
    let kv = connect(no_xtrim).await;
    put(&*kv, b"/t/1", b"v", PutOptions::OVERWRITE).await;
    let rev = put(&*kv, b"/t/2", b"v", PutOptions::OVERWRITE).await;
    let e = kv.compact(rev).await.unwrap_err();
    assert!(e.to_string().contains("xtrim") && e.to_string().contains("docs/REDIS.md"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_refuses_writes_cleanly_and_still_serves_reads() {
    let server = RedisServer::start_with_args(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"])
        .expect("redis-server with maxmemory");
    let ns = RedisServer::fresh_namespace();
    let kv = connect(server.config(&ns)).await;
    let value = vec![b'v'; 256 * 1024];
    let mut written = Vec::new();
    let e = loop {
        let key = format!("/full/{}", written.len());
        match within("put", kv.put(key.as_bytes(), &value, PutOptions::OVERWRITE)).await {
            Ok(PutOutcome::Written { revision, .. }) => written.push(revision),
            Ok(other) => panic!("{other:?}"),
            Err(e) => break e,
        }
        assert!(written.len() < 100, "4 MB of maxmemory took {} writes of 256 KiB", written.len());
    };
    assert!(!e.is_retryable() && e.to_string().contains("out of memory"), "{e:?}");
    // Nothing of the refused write happened: the revision did not move, no key, no event.
    let last = *written.last().expect("some writes fit");
    let read = within("get", kv.get(format!("/full/{}", written.len()).as_bytes())).await.unwrap();
    assert_eq!((read.revision, read.kv.is_none()), (last, true));
    let range = within("range", kv.range(b"/full/", RangeOptions { keys_only: true, ..Default::default() }))
        .await
        .unwrap();
    assert_eq!(range.count, written.len() as u64);
    let mut conn = raw(&server).await;
    let log_len: usize =
        redis::cmd("XLEN").arg(format!("{{rdzv:{ns}}}:log")).query_async(&mut conn).await.unwrap();
    assert_eq!(log_len, written.len());
    // Deletes and lease expiries write events too, so they wait for room as well.
    let e = kv.delete_prefix(b"/full/").await.unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
    // With room again, writes go on at the next revision.
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0").query_async(&mut conn).await.unwrap();
    within("delete", kv.delete_prefix(b"/full/")).await.unwrap();
    assert_eq!(put(&*kv, b"/after", b"v", PutOptions::OVERWRITE).await, last + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_that_missed_writes_is_a_rollback() {
    // No delay before a full sync (Redis waits 5 s by default, for more replicas to join).
    let primary = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]).expect("redis-server");
    let replica = RedisServer::start_with_args(&[
        "--repl-diskless-sync-delay",
        "0",
        "--replicaof",
        "127.0.0.1",
        &primary.port().to_string(),
    ])
    .expect("redis-server replica");
    let mut config = primary.config("failover");
    config.request_timeout = Duration::from_secs(2);
    let kv = connect(config.clone()).await;
    let first = put(&*kv, b"/f/a", b"1", PutOptions::OVERWRITE).await;
    let mut events = within("watch", kv.watch(b"/f/", WatchScope::Prefix, first)).await.unwrap();
    assert_eq!(next(&mut events).await.unwrap().revision(), first);
    // The replica has everything so far, then stops following.
    let mut to_primary = raw(&primary).await;
    let mut to_replica = raw(&replica).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let rev: Option<i64> =
            redis::cmd("GET").arg("{rdzv:failover}:rev").query_async(&mut to_replica).await.unwrap();
        if rev == Some(first) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the replica did not catch up: {rev:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut to_replica).await.unwrap();
    // Acknowledged by the primary only.
    let lost = put(&*kv, b"/f/b", b"2", PutOptions::OVERWRITE).await;
    assert_eq!(next(&mut events).await.unwrap().revision(), lost);
    // The failover: the endpoint now serves the replica's data (the old primary resyncs
    // from it and is then promoted, so the clients' address stays the same).
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(replica.port())
        .query_async(&mut to_primary)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut to_primary).await.unwrap();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the old primary did not resync: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut to_primary).await.unwrap();

    let e = once_back(|| kv.get(b"/f/a")).await.expect_err("a read after the failover succeeded");
    assert_rolled_back(&e, "the next read");
    let e = next(&mut events).await.expect_err("the watch went on after the failover");
    assert_rolled_back(&e, "the watch");
}
