//! A server that comes back with less than it had (an older snapshot, counters that went
//! back, a promoted replica that missed writes) is a rollback, told clearly and never
//! retryable; a restart that kept every write is not.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures::StreamExt;
use rdzv_core::KvError;
use rdzv_core::kv::{PutOptions, PutOutcome, WatchScope};
use rdzv_redis::testing::{RedisServer, shared};

use support::{WAIT, connect, next, once_back, put, raw, within};

/// The error of a client that found its server rolled back: clear, and never retryable.
fn assert_rolled_back(e: &KvError, what: &str) {
    assert!(matches!(e, KvError::Backend { .. }) && !e.is_retryable(), "{what}: {e:?}");
    assert!(e.to_string().contains("rolled back"), "{what}: {e}");
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
    let e = once_back(|| kv.put(b"/p/a", b"mine", PutOptions::new(rdzv_core::kv::PutMode::Update(lost))))
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
