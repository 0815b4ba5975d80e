//! Watches: replay from a past revision, key and prefix scopes, event contents, many events
//! without gaps, and independence of watchers.

use std::sync::Arc;
use std::time::Duration;

use super::{
    expect_no_event, expect_watch_error, key, next_event, next_events, put, put_with, watch, within,
};
use crate::error::KvError;
use crate::kv::{DeleteMode, DeleteOutcome, EventKind, Kv, PutOptions, WatchScope};

/// How long a case waits to be sure that no further event comes.
const QUIET: Duration = Duration::from_millis(300);

/// A watch from a past revision replays exactly the events from that revision on (nothing
/// before, nothing twice), then continues live.
pub async fn watch_replays_exactly_from_past_revision(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let (a, b) = (key(&ns, "a"), key(&ns, "b"));
    put(&*kv, &a, b"a1").await;
    let from = put(&*kv, &b, b"b1").await;
    let DeleteOutcome::Deleted { revision: deleted } =
        within("delete", kv.delete(&a, DeleteMode::Any)).await.expect("delete")
    else {
        panic!("deleting an existing key")
    };
    let last = put(&*kv, &a, b"a2").await;

    if !kv.capabilities().watch_history {
        expect_watch_error(kv.watch(&ns, WatchScope::Prefix, from).await, "watch from the past", |e| {
            matches!(e, KvError::Unsupported { .. })
        })
        .await;
        return;
    }
    let mut events = watch(&*kv, &ns, WatchScope::Prefix, from).await;
    let replayed = next_events(&mut events, 3, "replaying history").await;
    let seen: Vec<_> =
        replayed.iter().map(|e| (e.kind, e.kv.key.clone(), e.kv.value.to_vec(), e.revision())).collect();
    assert_eq!(
        seen,
        vec![
            (EventKind::Put, b.clone(), b"b1".to_vec(), from),
            (EventKind::Delete, a.clone(), Vec::new(), deleted),
            (EventKind::Put, a.clone(), b"a2".to_vec(), last),
        ]
    );
    let live = put(&*kv, &b, b"b2").await;
    let event = next_event(&mut events, "waiting for a live event after the replay").await;
    assert_eq!(
        (&event.kv.key, event.revision()),
        (&b, live),
        "the first live event follows the replay directly"
    );
}

/// A key watch sees only that exact key, not keys it is a prefix of.
pub async fn watch_of_key_sees_only_that_key(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let start = put(&*kv, &key(&ns, "before"), b"").await + 1;
    let mut events = watch(&*kv, &k, WatchScope::Key, start).await;
    put(&*kv, &key(&ns, "k2"), b"no").await;
    put(&*kv, &key(&ns, "kk/k"), b"no").await;
    put(&*kv, &key(&ns, "j"), b"no").await;
    let r = put(&*kv, &k, b"yes").await;
    let event = next_event(&mut events, "waiting for the watched key").await;
    assert_eq!((&event.kv.key[..], &event.kv.value[..], event.revision()), (&k[..], &b"yes"[..], r));
    put(&*kv, &key(&ns, "k/"), b"no").await;
    expect_no_event(&mut events, QUIET, "a key watch saw another key").await;
}

/// A prefix watch sees exactly the keys under its prefix.
pub async fn prefix_watch_sees_only_its_prefix(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let start = put(&*kv, &key(&ns, "x"), b"").await + 1;
    let mut events = watch(&*kv, &key(&ns, "a/"), WatchScope::Prefix, start).await;
    put(&*kv, &key(&ns, "b/1"), b"no").await;
    put(&*kv, &key(&ns, "a"), b"no").await;
    put(&*kv, &key(&ns, "a2"), b"no").await;
    let r1 = put(&*kv, &key(&ns, "a/1"), b"yes").await;
    let r2 = put(&*kv, &key(&ns, "a/2/deep"), b"yes").await;
    let seen = next_events(&mut events, 2, "waiting for the prefix's events").await;
    assert_eq!(
        seen.iter().map(|e| (e.kv.key.clone(), e.revision())).collect::<Vec<_>>(),
        vec![(key(&ns, "a/1"), r1), (key(&ns, "a/2/deep"), r2)]
    );
    put(&*kv, &key(&ns, "b/2"), b"no").await;
    expect_no_event(&mut events, QUIET, "a prefix watch saw a key outside its prefix").await;
}

/// Put events carry the key as written (value, create/mod revision, version, lease);
/// delete events have an empty value, version 0, create revision 0 and the delete's revision.
pub async fn watch_events_carry_metadata(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let start = put(&*kv, &key(&ns, "before"), b"").await + 1;
    let mut events = watch(&*kv, &k, WatchScope::Key, start).await;
    let lease = within("lease_grant", kv.lease_grant(super::lease_ttl(&*kv) * 60)).await.expect("grant");
    let r1 = put(&*kv, &k, b"v1").await;
    let r2 = put_with(&*kv, &k, b"v2", PutOptions::OVERWRITE.with_lease(Some(lease))).await;
    let DeleteOutcome::Deleted { revision: r3 } =
        within("delete", kv.delete(&k, DeleteMode::Any)).await.expect("delete")
    else {
        panic!("deleting an existing key")
    };
    let [e1, e2, e3] = &next_events(&mut events, 3, "waiting for put, put, delete").await[..] else {
        unreachable!()
    };
    assert_eq!(
        (e1.kind, &e1.kv.value[..], e1.kv.create_revision, e1.kv.mod_revision, e1.kv.version, e1.kv.lease),
        (EventKind::Put, &b"v1"[..], r1, r1, 1, None)
    );
    assert_eq!(
        (e2.kind, &e2.kv.value[..], e2.kv.create_revision, e2.kv.mod_revision, e2.kv.version, e2.kv.lease),
        (EventKind::Put, &b"v2"[..], r1, r2, 2, Some(lease))
    );
    assert_eq!(
        (e3.kind, &e3.kv.key, e3.kv.value.len(), e3.kv.create_revision, e3.kv.mod_revision, e3.kv.version),
        (EventKind::Delete, &k, 0, 0, r3, 0)
    );
    let _ = within("revoke", kv.lease_revoke(lease)).await;
}

/// Dropping one watch does not disturb another on the same keys.
pub async fn dropped_watch_leaves_others_running(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let start = put(&*kv, &key(&ns, "before"), b"").await + 1;
    let mut kept = watch(&*kv, &ns, WatchScope::Prefix, start).await;
    for _ in 0..5 {
        let dropped = watch(&*kv, &ns, WatchScope::Prefix, start).await;
        drop(dropped);
    }
    let r = put(&*kv, &key(&ns, "k"), b"v").await;
    assert_eq!(next_event(&mut kept, "after other watches were dropped").await.revision(), r);
}

/// A watch delivers 1,000 writes in order, without a gap or a duplicate, while a slow
/// reader falls behind.
pub async fn watch_survives_many_events_without_gaps(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    const N: usize = 1000;
    let start = put(&*kv, &key(&ns, "before"), b"").await + 1;
    let mut events = watch(&*kv, &key(&ns, "n/"), WatchScope::Prefix, start).await;
    let writer = {
        let kv = kv.clone();
        let ns = ns.clone();
        tokio::spawn(async move {
            let mut revisions = Vec::with_capacity(N);
            for i in 0..N {
                revisions.push(put(&*kv, &key(&ns, &format!("n/{}", i % 7)), i.to_string().as_bytes()).await);
            }
            revisions
        })
    };
    // Read slowly at first, so that events pile up behind the reader.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut last = 0;
    for i in 0..N {
        let event = next_event(&mut events, &format!("waiting for event {i} of {N}")).await;
        assert_eq!(event.kind, EventKind::Put);
        assert_eq!(event.kv.value, i.to_string().as_bytes(), "event {i} is missing or out of order");
        assert!(event.revision() > last, "revisions must increase along the stream");
        last = event.revision();
    }
    let revisions = within("joining the writer", writer).await.expect("writer task");
    assert_eq!(revisions.last().copied(), Some(last));
    expect_no_event(&mut events, QUIET, "an event after the last write").await;
}

/// The heap each of `watches` more open watches of `key` holds once it has handed out an
/// event, in bytes, as `held` counts it (the bytes the test binary has allocated and not
/// freed, e.g. from a counting global allocator; nothing else may allocate meanwhile). The
/// key is written and one watch of it opened first, so that what all its watches share (a
/// backend's one watch of the key on its server, its table of watchers) is not counted. A
/// round of 98,304 in-process workers holds one or two watches of one key each (backends'
/// `tests/footprint.rs`).
pub async fn heap_per_watch(kv: &dyn Kv, key: &[u8], watches: usize, held: impl Fn() -> usize) -> isize {
    let start = put(kv, key, b"v").await + 1;
    let first = watch(kv, key, WatchScope::Key, start).await;
    let mut open = Vec::with_capacity(watches);
    let before = held();
    for _ in 0..watches {
        open.push(watch(kv, key, WatchScope::Key, start).await);
    }
    put(kv, key, b"w").await;
    for events in &mut open {
        next_event(events, "the write after the watch opened").await;
    }
    let per_watch = (held() as isize - before as isize) / watches.max(1) as isize;
    drop((first, open));
    per_watch
}
