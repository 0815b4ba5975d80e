//! A server out of reach, connections reset, a restart that lost the data, a full server:
//! what each call answers meanwhile, and that the client recovers.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use rdzv_core::kv::{PutOptions, PutOutcome, RangeOptions, WatchScope};
use rdzv_core::url::Secret;
use rdzv_core::{Kv, KvError};
use rdzv_redis::testing::RedisServer;
use rdzv_redis::{RedisConfig, RedisKv};

use support::{WAIT, connect, next, put, raw, via_link, within};

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

/// A client of `server` (namespace `namespace`) whose connections go through a `Link`.
async fn through_link(server: &RedisServer, namespace: &str) -> (rdzv_netfault::Link, Arc<dyn Kv>) {
    let (link, config) = via_link(server, server.config(namespace));
    (link, connect(config).await)
}

/// Every connection of a client reset (a middlebox dropped them, the server was fine): the
/// first request after it must not fail — not a read, not a write, not a lease grant (what
/// `RendezvousHandler::new` starts with). They used to fail once with a broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_requests_after_every_connection_was_reset_succeed() {
    let server = RedisServer::start().expect("redis-server");
    let (link, kv) = through_link(&server, "reset").await;
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

/// Every connection of a client reset, and `RendezvousHandler::new` called at once, with no
/// pause for the resets to reach the client (issue 23, item 2): the first request may then
/// fail once with `Unavailable` while the client reconnects, and `new` must ask again on the
/// new connection rather than fail. It used to fail at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_is_made_right_after_every_connection_was_reset() {
    let server = RedisServer::start().expect("redis-server");
    let (link, kv) = through_link(&server, "reset-now").await;
    put(&*kv, b"/r/0", b"v", PutOptions::OVERWRITE).await;
    let mut handlers = Vec::new();
    for round in 0..10 {
        assert!(link.cut() > 0, "no connection to reset");
        let mut params = rdzv_core::RendezvousParams::new("reset-now", 1, 1).unwrap();
        params.node_id = Some(format!("n{round}"));
        let started = std::time::Instant::now();
        let handler = within("new", rdzv_core::RendezvousHandler::new(kv.clone(), params)).await;
        handlers.push(
            handler.unwrap_or_else(|e| panic!("RendezvousHandler::new right after reset {round}: {e}")),
        );
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}

/// Reads made without pause while the connection is reset again and again: each is answered (a
/// read that fails on the dead connection is asked again on the new one) long before its
/// timeout. With `redis` 1.8, a request handed to a connection whose reader was stopping at
/// that instant stayed in the connection's queue, which nothing read any more, until the
/// request timed out: tokio's bounded channel keeps a value sent with a permit taken before
/// its receiver was dropped (tokio issue 7714). `redis` 2 queues requests in a channel whose
/// receiver drops what it holds, late sends included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_made_while_connections_are_reset_are_answered_promptly() {
    let server = RedisServer::start().expect("redis-server");
    let mut config = server.config("reset-many");
    // A read lost in a dead connection would wait this long: far beyond the bound below.
    config.request_timeout = Duration::from_secs(60);
    let (link, config) = via_link(&server, config);
    let kv = connect(config).await;
    put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (kv, done) = (kv.clone(), done.clone());
            tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                while !done.load(Ordering::Relaxed) {
                    let started = tokio::time::Instant::now();
                    let answer = kv.get(b"k").await.unwrap_or_else(|e| panic!("a read: {e}"));
                    assert_eq!(answer.kv.as_ref().map(|kv| &kv.value[..]), Some(&b"v"[..]));
                    slowest = slowest.max(started.elapsed());
                }
                slowest
            })
        })
        .collect();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        link.cut();
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        let slowest = tokio::time::timeout(WAIT, reader)
            .await
            .unwrap_or_else(|_| panic!("a read went unanswered for {WAIT:?}: lost in a dead connection"))
            .unwrap();
        assert!(slowest < Duration::from_secs(5), "a read took {slowest:?}");
    }
}

/// A request retried while the server cannot be reached says so, and where, also when its
/// deadline cuts the last try short (a slow try, under load; here a link frozen meanwhile)
/// instead of a bare timeout that names no server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_last_try_the_deadline_cut_says_the_server_is_unreachable() {
    let mut server = RedisServer::start().expect("redis-server");
    let mut config = server.config("cut-short");
    config.request_timeout = Duration::from_secs(2);
    let (link, config) = via_link(&server, config);
    let proxy = link.endpoints()[0];
    let kv = connect(config).await;
    put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;

    server.stop();
    let freeze_later = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        link.freeze();
    };
    let (answer, ()) = tokio::join!(within("a get", kv.get(b"k")), freeze_later);
    let e = answer.unwrap_err();
    assert!(matches!(e, KvError::Unavailable { .. }), "{e}");
    assert!(e.to_string().contains(&proxy.to_string()), "{e}");
}

/// A server that does not answer in time (a partition: nothing refused, nothing answered)
/// is named in the timeout, as etcd's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_names_the_server() {
    let server = RedisServer::start().expect("redis-server");
    let mut config = server.config("timeout");
    config.request_timeout = Duration::from_secs(1);
    let (link, config) = via_link(&server, config);
    let proxy = link.endpoints()[0];
    let kv = connect(config).await;
    link.freeze();
    let e = within("a get", kv.get(b"k")).await.unwrap_err();
    assert!(matches!(e, KvError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains(&proxy.to_string()), "{e}");
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
    // Deletes and lease expiries write events too, so they wait for room as well. (The limit
    // goes down to one byte first: the refused put's buffers, counted while it was refused, can
    // be freed since, leaving the server under 4 MB again.)
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1").query_async(&mut conn).await.unwrap();
    let e = kv.delete_prefix(b"/full/").await.unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
    // With room again, writes go on at the next revision.
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0").query_async(&mut conn).await.unwrap();
    within("delete", kv.delete_prefix(b"/full/")).await.unwrap();
    assert_eq!(put(&*kv, b"/after", b"v", PutOptions::OVERWRITE).await, last + 2);
}
