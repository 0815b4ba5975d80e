//! All watches of one client share one gRPC watch stream: thousands of watches opened and
//! dropped at once leave the connection usable (no HTTP/2 stream resets pile up), the
//! shared stream survives a server restart without losing or duplicating an event, and
//! many watches on one stream each get exactly their own events, in order; watches of one
//! key share one etcd watch.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use rdzv_core::kv::{Event, EventKind, PutOptions, PutOutcome};
use rdzv_core::kv::{WatchScope, WatchStream};
use rdzv_core::{Kv, KvError, RendezvousHandler, RendezvousParams};
use rdzv_etcd::testing::EtcdServer;
use rdzv_etcd::{EtcdKv, EtcdOptions};

const WAIT: Duration = Duration::from_secs(60);

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out {what}"))
}

async fn put(kv: &EtcdKv, key: &[u8], value: &[u8]) -> i64 {
    match within("put", kv.put(key, value, PutOptions::OVERWRITE)).await.unwrap() {
        PutOutcome::Written { revision, .. } => revision,
        other => panic!("not written: {other:?}"),
    }
}

async fn next_event(stream: &mut WatchStream) -> Event {
    within("a watch event", stream.next()).await.expect("the watch ended").expect("the watch failed")
}

/// Opens `count` watches on one client, of keys `w/<i>`.
async fn open_many(kv: &EtcdKv, count: usize, from: i64) -> Vec<WatchStream> {
    open_many_of(kv, count, from, |i| (format!("w/{i}"), WatchScope::Key)).await
}

/// Opens `count` watches on one client, of `what(i)`.
async fn open_many_of(
    kv: &EtcdKv,
    count: usize,
    from: i64,
    what: impl Fn(usize) -> (String, WatchScope),
) -> Vec<WatchStream> {
    let opened = futures::stream::iter(0..count)
        .map(|i| {
            let kv = kv.clone();
            let (key, scope) = what(i);
            async move { kv.watch(key.as_bytes(), scope, from).await }
        })
        .buffered(256)
        .collect::<Vec<_>>()
        .await;
    opened.into_iter().map(|w| w.unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_watches_dropped_at_once_leave_the_client_working() {
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let from = put(&kv, b"start", b"x").await;
    let lease = kv.lease_grant(Duration::from_secs(30)).await.unwrap();

    // Requests in flight all along: an HTTP/2 connection error would fail them.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..16)
        .map(|n| {
            let (kv, stop) = (kv.clone(), stop.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("load/{n}");
                    if let Err(e) = kv.put(key.as_bytes(), b"v", PutOptions::OVERWRITE).await {
                        failures.push(e.to_string());
                    }
                    if let Err(e) = kv.get(key.as_bytes()).await {
                        failures.push(e.to_string());
                    }
                    done += 1;
                }
                (done, failures)
            })
        })
        .collect();
    // Four rounds of 4096: each dropped watch must not cost the connection anything.
    for round in 0..4 {
        // All on one busy prefix: events are in flight to every watch when it is dropped
        // (what a thousand handlers leaving at once look like).
        let watches = within(
            "opening the watches",
            open_many_of(&kv, 4096, from, |_| ("busy/".to_string(), WatchScope::Prefix)),
        )
        .await;
        for _ in 0..4 {
            put(&kv, b"busy/k", b"v").await;
        }
        drop(watches);
        // Requests right after the drop, while the cancellations are under way.
        let written = put(&kv, format!("after/{round}").as_bytes(), b"v").await;
        assert!(written > from);
        let read = within("get", kv.get(format!("after/{round}").as_bytes())).await.unwrap();
        assert_eq!(read.kv.unwrap().value, &b"v"[..]);
        kv.lease_keep_alive(lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let (done, failures) = within("the load to stop", task).await.unwrap();
        assert!(done > 0, "the load made no progress");
        assert!(failures.is_empty(), "{} requests failed, e.g. {}", failures.len(), failures[0]);
    }
    within("lease_revoke", kv.lease_revoke(lease)).await.unwrap();

    // And the watches still work after all this.
    let mut watch = kv.watch(b"late", WatchScope::Key, from).await.unwrap();
    let rev = put(&kv, b"late", b"1").await;
    let event = next_event(&mut watch).await;
    assert_eq!((event.kind, event.kv.mod_revision), (EventKind::Put, rev));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_handlers_leaving_at_once_fail_no_request() {
    const WORKERS: usize = 1100;
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let shared: Arc<dyn Kv> = Arc::new(kv.clone());
    let params = RendezvousParams::new("leave-at-once", 1, WORKERS).unwrap();
    let handlers = within(
        "starting the handlers",
        futures::stream::iter(0..WORKERS)
            .map(|_| RendezvousHandler::new(shared.clone(), params.clone()))
            .buffer_unordered(64)
            .collect::<Vec<_>>(),
    )
    .await;
    let handlers: Vec<RendezvousHandler> = handlers.into_iter().map(|h| h.unwrap()).collect();
    // Every handler holds a watch on the shared stream while it waits for a round.
    let waiting: Vec<_> = handlers
        .iter()
        .map(|h| {
            let h = h.clone();
            tokio::spawn(async move { h.next_rendezvous().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let results =
        within("the handlers to leave", futures::future::join_all(handlers.iter().map(|h| h.shutdown())))
            .await;
    let failed: Vec<String> = results.into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect();
    assert!(failed.is_empty(), "{} of {WORKERS} shutdowns failed, e.g. {:?}", failed.len(), failed.first());
    for task in waiting {
        let _ = within("a waiting call to end", task).await.unwrap();
    }
    put(&kv, b"after", b"v").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_stream_survives_a_restart_without_gap_or_duplicate() {
    const WATCHES: usize = 64;
    let mut server = EtcdServer::start().await.unwrap();
    let options: EtcdOptions = server
        .options()
        .with_request_timeout(Duration::from_secs(3))
        .with_connect_timeout(Duration::from_secs(3));
    let kv = EtcdKv::connect(options).await.unwrap();
    let from = put(&kv, b"base", b"x").await;
    let mut watches = open_many(&kv, WATCHES, from).await;
    let mut expected: Vec<Vec<i64>> = vec![Vec::new(); WATCHES];
    for (i, want) in expected.iter_mut().enumerate() {
        want.push(put(&kv, format!("w/{i}").as_bytes(), b"before").await);
    }
    // Read part of the events, so some are delivered before the restart and some after.
    let mut seen: Vec<Vec<i64>> = vec![Vec::new(); WATCHES];
    for (i, watch) in watches.iter_mut().enumerate().take(WATCHES / 2) {
        seen[i].push(next_event(watch).await.kv.mod_revision);
    }
    server.stop().await.unwrap();
    server.restart().await.unwrap();
    for (i, want) in expected.iter_mut().enumerate() {
        let key = format!("w/{i}");
        let rev = within("the server to answer again", async {
            loop {
                match kv.put(key.as_bytes(), b"after", PutOptions::OVERWRITE).await {
                    Ok(PutOutcome::Written { revision, .. }) => return revision,
                    Ok(other) => panic!("not written: {other:?}"),
                    Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                    Err(e) => panic!("non-retryable error after a restart: {e}"),
                }
            }
        })
        .await;
        want.push(rev);
    }
    for (i, watch) in watches.iter_mut().enumerate() {
        while seen[i].len() < 2 {
            seen[i].push(next_event(watch).await.kv.mod_revision);
        }
    }
    assert_eq!(seen, expected, "each watch sees each of its events once, in order");
    // Nothing more: no duplicate arrives late.
    let marker = put(&kv, b"w/0", b"marker").await;
    assert_eq!(next_event(&mut watches[0]).await.kv.mod_revision, marker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watches_each_get_exactly_their_own_events_in_order() {
    const WATCHES: usize = 200;
    const ROUNDS: usize = 5;
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let from = put(&kv, b"base", b"x").await;
    // Key watches, plus prefix watches on every tenth key's own prefix.
    let mut watches = open_many(&kv, WATCHES, from).await;
    let mut prefixes = Vec::new();
    for i in (0..WATCHES).step_by(10) {
        prefixes.push((i, kv.watch(format!("w/{i}/").as_bytes(), WatchScope::Prefix, from).await.unwrap()));
    }
    let mut expected: Vec<Vec<(EventKind, i64, String)>> = vec![Vec::new(); WATCHES];
    let mut expected_prefix: Vec<Vec<(EventKind, i64, String)>> = vec![Vec::new(); prefixes.len()];
    let writers = futures::future::join_all((0..WATCHES).map(|i| {
        let kv = kv.clone();
        async move {
            let mut mine = Vec::new();
            let mut below = Vec::new();
            for round in 0..ROUNDS {
                let value = format!("{i}-{round}");
                mine.push((
                    EventKind::Put,
                    put(&kv, format!("w/{i}").as_bytes(), value.as_bytes()).await,
                    value,
                ));
                let child = format!("w/{i}/c{round}");
                below.push((EventKind::Put, put(&kv, child.as_bytes(), b"c").await, child));
            }
            let deleted = match kv.delete(format!("w/{i}").as_bytes(), rdzv_core::kv::DeleteMode::Any).await {
                Ok(rdzv_core::kv::DeleteOutcome::Deleted { revision }) => revision,
                other => panic!("not deleted: {other:?}"),
            };
            mine.push((EventKind::Delete, deleted, String::new()));
            (mine, below)
        }
    }))
    .await;
    for (i, (mine, below)) in writers.into_iter().enumerate() {
        expected[i] = mine;
        if i % 10 == 0 {
            expected_prefix[i / 10] = below;
        }
    }
    for (i, watch) in watches.iter_mut().enumerate() {
        let mut got = Vec::new();
        while got.len() < expected[i].len() {
            let event = next_event(watch).await;
            assert_eq!(event.kv.key, format!("w/{i}").as_bytes(), "watch {i} got another key's event");
            got.push((
                event.kind,
                event.kv.mod_revision,
                String::from_utf8(event.kv.value.to_vec()).unwrap(),
            ));
        }
        assert_eq!(got, expected[i], "watch {i}");
    }
    for (n, (i, watch)) in prefixes.iter_mut().enumerate() {
        let mut got = Vec::new();
        while got.len() < expected_prefix[n].len() {
            let event = next_event(watch).await;
            got.push((event.kind, event.kv.mod_revision, String::from_utf8(event.kv.key).unwrap()));
        }
        assert_eq!(got, expected_prefix[n], "prefix watch of w/{i}/");
    }
    // No stray event is left in any stream: the next one is the marker.
    let marker = put(&kv, b"w/1", b"m").await;
    assert_eq!(next_event(&mut watches[1]).await.kv.mod_revision, marker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_resume_or_start_fails_only_that_watch() {
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let first = put(&kv, b"a", b"1").await;
    let mut live = kv.watch(b"a", WatchScope::Key, first).await.unwrap();
    assert_eq!(next_event(&mut live).await.kv.mod_revision, first);
    let second = put(&kv, b"a", b"2").await;
    assert_eq!(next_event(&mut live).await.kv.mod_revision, second);
    kv.compact(second).await.unwrap();
    // Before what any watch of this client received: etcd's answer, Compacted.
    let mut old = kv.watch(b"a", WatchScope::Key, first - 1).await.unwrap();
    match within("the compaction error", old.next()).await {
        Some(Err(KvError::Compacted { requested, oldest })) => {
            assert_eq!((requested, oldest), (first - 1, second));
        }
        other => panic!("expected Compacted, got {other:?}"),
    }
    // Within what the live watch received: handed the kept events, though etcd compacted them.
    let mut kept = kv.watch(b"a", WatchScope::Key, first).await.unwrap();
    assert_eq!(next_event(&mut kept).await.kv.mod_revision, first);
    assert_eq!(next_event(&mut kept).await.kv.mod_revision, second);
    // The other watches on the same stream are unaffected.
    let third = put(&kv, b"a", b"3").await;
    assert_eq!(next_event(&mut live).await.kv.mod_revision, third);
    assert_eq!(next_event(&mut kept).await.kv.mod_revision, third);
}

/// The etcd server's count of its watchers.
async fn watchers(server: &EtcdServer) -> f64 {
    let metrics = server.metrics().await.unwrap();
    rdzv_etcd::testing::metric_value(&metrics, "etcd_debugging_mvcc_watcher_total")
        .expect("etcd counts its watchers")
}

/// Watches of one key on one client share one etcd watch (the server counts one watcher),
/// whatever revision each starts from within what it received, and each gets exactly its
/// own events, once, with the value buffer shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_of_one_key_share_one_etcd_watch() {
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let first = put(&kv, b"s", b"1").await;
    let before = watchers(&server).await;
    let mut all = open_many_of(&kv, 200, first, |_| ("s".to_string(), WatchScope::Key)).await;
    let second = put(&kv, b"s", b"2").await;
    let mut late = kv.watch(b"s", WatchScope::Key, second).await.unwrap();
    let third = put(&kv, b"s", &vec![7u8; 100_000]).await;
    let mut values = Vec::new();
    for watch in &mut all {
        for expected in [first, second, third] {
            let event = next_event(watch).await;
            assert_eq!(event.kv.mod_revision, expected);
            if expected == third {
                values.push(event.kv.value);
            }
        }
    }
    assert_eq!(next_event(&mut late).await.kv.mod_revision, second);
    assert_eq!(next_event(&mut late).await.kv.mod_revision, third);
    assert!(values.windows(2).all(|w| w[0].as_ptr() == w[1].as_ptr()), "one buffer for every watcher");
    assert_eq!(watchers(&server).await - before, 1.0, "201 local watches, one etcd watcher");
    drop(all);
    // The last one keeps the group; dropping it too cancels the etcd watch.
    let fourth = put(&kv, b"s", b"4").await;
    assert_eq!(next_event(&mut late).await.kv.mod_revision, fourth);
    drop(late);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while watchers(&server).await != before {
        assert!(tokio::time::Instant::now() < deadline, "the etcd watch was not cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_watch_works_after_the_shared_streams_token_expired() {
    let server = EtcdServer::builder().auth("pw-Mux-1").arg("--auth-token-ttl=1").start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let first = put(&kv, b"k", b"1").await;
    // Opens the shared stream with the client's current token.
    let mut old = kv.watch(b"k", WatchScope::Key, first).await.unwrap();
    assert_eq!(next_event(&mut old).await.kv.mod_revision, first);
    // etcd drops idle simple tokens after their TTL (checked every few seconds); the next
    // request re-authenticates, but the open stream still carries the old token.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let second = put(&kv, b"k", b"2").await;
    let mut new =
        within("a watch after the token expired", kv.watch(b"k", WatchScope::Key, first)).await.unwrap();
    assert_eq!(next_event(&mut new).await.kv.mod_revision, first);
    assert_eq!(next_event(&mut new).await.kv.mod_revision, second);
    // The watch opened before is still served, without a duplicate.
    assert_eq!(next_event(&mut old).await.kv.mod_revision, second);
}
