//! The event log and the feed every watch of a client reads it through: history trimmed to
//! its bounds (revisions and bytes) and detected exactly, watches across lost or trimmed
//! history, lagging watches served from the feed's memory, many workers on one feed.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures::StreamExt;
use rdzv_core::KvError;
use rdzv_core::kv::{PutOptions, PutOutcome, RangeOptions, WatchScope};
use rdzv_redis::testing::{RedisServer, shared};

use support::{WAIT, connect, next, put, raw, via_link, within};

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

/// A log at its bound is trimmed a sixteenth of it at a time, not a revision per write: it
/// grows to `history` + `history`/16 revisions, then goes back to `history` at once; what
/// it holds is still told exactly (a watch from below it is `Compacted` naming its oldest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_trimmed_a_sixteenth_at_a_time() {
    let server = shared();
    let mut config = server.config(&RedisServer::fresh_namespace());
    config.history = 64;
    let kv = connect(config.clone()).await;
    let mut conn = raw(server).await;
    let log_key = format!("{}log", config.key_base());
    let mut lengths = Vec::new();
    for i in 0..100 {
        put(&*kv, b"k", format!("{i}").as_bytes(), PutOptions::OVERWRITE).await;
        let len: u64 = redis::cmd("XLEN").arg(&log_key).query_async(&mut conn).await.unwrap();
        lengths.push(len);
    }
    assert_eq!(lengths[63], 64, "nothing is trimmed below the bound: {lengths:?}");
    assert!(
        lengths[64..].iter().all(|&len| (64..=68).contains(&len)),
        "the bound and its slack: {lengths:?}"
    );
    assert!(lengths.iter().any(|&len| len > 64), "not trimmed by every write: {lengths:?}");
    for pair in lengths.windows(2) {
        assert!(
            pair[1] == pair[0] + 1 || pair[1] == 64,
            "grows by one, or goes back to the bound: {lengths:?}"
        );
    }
    let len = i64::try_from(lengths[99]).unwrap();
    let oldest = 100 - len + 1;
    match kv.watch(b"k", WatchScope::Key, oldest - 1).await {
        Err(KvError::Compacted { requested, oldest: o }) => assert_eq!((requested, o), (oldest - 1, oldest)),
        Err(e) => panic!("expected Compacted, got {e}"),
        Ok(_) => panic!("expected Compacted, got a watch"),
    }
    let mut events = within("watch", kv.watch(b"k", WatchScope::Key, oldest)).await.unwrap();
    for rev in oldest..=100 {
        assert_eq!(next(&mut events).await.unwrap().revision(), rev);
    }
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
    let (log_reads, stats) = log_reads(&mut conn).await;
    assert_eq!(log_reads, 0, "lagging watches re-read the log:\n{stats}");
}

/// A watch of one key from before the feed's memory, while another watch of the key keeps
/// the feed's history of it: a worker that read the round's state, joined, then watched the
/// state while the others' joins (400,000 entries a round at 98,304 workers) pushed the
/// memory past its start. It is handed the key's events from that history, not the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_watch_from_before_the_feeds_memory_replays_the_keys_history() {
    // A server of its own: the test counts the commands it served.
    let server = RedisServer::start().expect("redis-server");
    let kv = connect(server.config("kept")).await;
    let read = put(&*kv, b"/state", b"0", PutOptions::OVERWRITE).await;
    let mut early = within("watch", kv.watch(b"/state", WatchScope::Key, read + 1)).await.unwrap();
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await.unwrap();
    // More entries than the feed's memory holds (32,768); the state changes among them.
    let writes: Vec<i64> = futures::stream::iter(1..=40_000)
        .map(|i| {
            let kv = kv.clone();
            async move {
                let key = if i % 10_000 == 0 { "/state".to_string() } else { format!("/joins/{i}") };
                (key == "/state", put(&*kv, key.as_bytes(), b"v", PutOptions::OVERWRITE).await)
            }
        })
        .buffered(64)
        .filter_map(|(state, revision)| async move { state.then_some(revision) })
        .collect()
        .await;
    assert_eq!(writes.len(), 4);
    for revision in &writes {
        assert_eq!(next(&mut early).await.unwrap().revision(), *revision);
    }
    let mut late = within("watch", kv.watch(b"/state", WatchScope::Key, read + 1)).await.unwrap();
    for revision in &writes {
        assert_eq!(next(&mut late).await.unwrap().revision(), *revision, "every change, in order");
    }
    let (log_reads, stats) = log_reads(&mut conn).await;
    assert_eq!(log_reads, 0, "the late watch read the log:\n{stats}");
}

/// The feed itself fell behind the log's history (its process was too busy to read while
/// the others wrote): its next read skips what was trimmed. The client's watches that need a
/// trimmed revision end "compacted" without each reading the log to find that out: after
/// such a skip at 65,536 workers, 65,536 `XRANGE`s of 128 entries (2 GB of replies) cost the
/// client every session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_behind_a_gap_the_feed_skipped_end_compacted_without_reading_the_log() {
    // A server of its own: the test counts the commands it served.
    let server = RedisServer::start().expect("redis-server");
    let mut config = server.config("skip");
    config.history = 10;
    let writer = connect(config.clone()).await;
    let (link, config) = via_link(&server, config);
    let watcher = connect(config).await;
    let read = put(&*writer, b"/state", b"0", PutOptions::OVERWRITE).await;
    let mut watches = Vec::new();
    for _ in 0..32 {
        watches.push(within("watch", watcher.watch(b"/state", WatchScope::Key, read + 1)).await.unwrap());
    }
    let seen = put(&*writer, b"/state", b"1", PutOptions::OVERWRITE).await;
    for events in watches.iter_mut() {
        assert_eq!(next(events).await.unwrap().revision(), seen);
    }
    // The watcher's feed cannot read while the log moves on 100 revisions and is trimmed to 10.
    link.freeze();
    for i in 0..100 {
        let key = if i == 50 { "/state".to_string() } else { format!("/joins/{i}") };
        put(&*writer, key.as_bytes(), b"v", PutOptions::OVERWRITE).await;
    }
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await.unwrap();
    link.heal();
    for events in watches.iter_mut() {
        match next(events).await {
            Err(KvError::Compacted { requested, oldest }) => {
                assert!(requested > seen && oldest > requested, "{requested}, {oldest} after {seen}")
            }
            other => panic!("expected Compacted, got {other:?}"),
        }
    }
    let (log_reads, stats) = log_reads(&mut conn).await;
    assert_eq!(log_reads, 0, "the watches read the log to find the feed's gap:\n{stats}");
}

/// The `XRANGE`s the server served since its statistics were reset, and those statistics.
async fn log_reads(conn: &mut redis::aio::MultiplexedConnection) -> (u64, String) {
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    let calls = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_xrange:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse::<u64>().unwrap());
    (calls, stats)
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
    // Within the bound (trimming waits until the log is over it by a sixteenth) plus the
    // newest revision, and not emptier than it needs to be.
    assert!(bytes <= 100_000 + 100_000 / 16 + 10_069, "the log holds {bytes} bytes of events");
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
            let options = PutOptions::new(rdzv_core::kv::PutMode::Create).with_lease(Some(lease));
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

/// A watch of one key is sent only the reads of the log that hold its key (the feed does not
/// wake it for the others'): among thousands of other keys' writes, each watch still gets
/// every event of its key, in order, once — including watches nobody reads for a while,
/// which fall behind their key's channel and catch up from the feed's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_watches_get_every_event_of_their_key_among_other_keys_writes() {
    let server = shared();
    let kv = connect(server.config(&RedisServer::fresh_namespace())).await;
    let start = put(&*kv, b"/k/other", b"0", PutOptions::OVERWRITE).await + 1;
    let keys = ["/k/a", "/k/b"];
    let mut watches = Vec::new();
    for i in 0..32 {
        let key = keys[i % keys.len()];
        watches.push((key, within("watch", kv.watch(key.as_bytes(), WatchScope::Key, start)).await.unwrap()));
    }
    // Every fifth write is of a watched key: 600 events of each, more than a watch buffers
    // while unread (256) plus what its key's channel holds (16).
    let mut expected: std::collections::HashMap<&str, Vec<i64>> = Default::default();
    for i in 0..6000 {
        let key = if i % 5 == 0 { keys[(i / 5) % keys.len()].to_string() } else { format!("/k/other/{i}") };
        let revision = put(&*kv, key.as_bytes(), format!("{i}").as_bytes(), PutOptions::OVERWRITE).await;
        if let Some(&watched) = keys.iter().find(|&&k| k == key) {
            expected.entry(watched).or_default().push(revision);
        }
    }
    for (key, events) in watches.iter_mut() {
        let revisions = &expected[key];
        assert_eq!(revisions.len(), 600);
        for &revision in revisions {
            let event = next(events).await.unwrap();
            assert_eq!(
                (event.kv.key.as_slice(), event.revision()),
                (key.as_bytes(), revision),
                "in order, once"
            );
        }
    }
    let last = put(&*kv, keys[0].as_bytes(), b"last", PutOptions::OVERWRITE).await;
    for (key, events) in watches.iter_mut().filter(|(key, _)| *key == keys[0]) {
        assert_eq!(next(events).await.unwrap().revision(), last, "{key}: still following the feed");
    }
}
