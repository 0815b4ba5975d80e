//! What the conformance suite cannot see of one Redis server: leases on the server's clock,
//! the native increment, foreign data under our keys, the connections a client holds.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use rdzv_core::KvError;
use rdzv_core::kv::{EventKind, PutOptions, RangeOptions, WatchScope};
use rdzv_redis::testing::{RedisServer, shared};

use support::{WAIT, connect, next, put, raw, within};

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
