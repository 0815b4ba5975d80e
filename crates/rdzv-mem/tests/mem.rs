//! MemKv specifics that the generic conformance suite cannot see: the paused clock, the
//! history bound, named instances and watcher cleanup.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use rdzv_core::kv::{DeleteMode, DeleteOutcome, EventKind, PutMode, PutOptions, PutOutcome, WatchScope};
use rdzv_core::{Kv, KvError};
use rdzv_mem::MemKv;

#[tokio::test(start_paused = true)]
async fn revisions_and_metadata() {
    let kv = MemKv::new();
    assert_eq!(kv.get(b"a").await.unwrap().revision, 0);
    let w = kv.put(b"a", b"1", PutOptions::OVERWRITE).await.unwrap();
    assert_eq!(w, PutOutcome::Written { revision: 1, create_revision: 1 });
    kv.put(b"a", b"2", PutOptions::OVERWRITE).await.unwrap();
    let got = kv.get(b"a").await.unwrap();
    let a = got.kv.unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (1, 2, 2));
    assert_eq!(got.revision, 2);
    let stale = kv.put(b"a", b"3", PutOptions::new(PutMode::Update(1))).await.unwrap();
    assert!(matches!(stale, PutOutcome::Conflict { current: Some(ref c) } if c.value == b"2"[..]));
    assert_eq!(
        kv.delete(b"a", DeleteMode::IfRevision(2)).await.unwrap(),
        DeleteOutcome::Deleted { revision: 3 }
    );
    assert_eq!(kv.revision(), 3);
}

#[tokio::test(start_paused = true)]
async fn lease_expires_on_the_paused_clock_without_calls() {
    let kv = Arc::new(MemKv::new());
    let lease = kv.lease_grant(Duration::from_secs(10)).await.unwrap();
    kv.put(b"k", b"v", PutOptions::OVERWRITE.with_lease(Some(lease))).await.unwrap();
    let mut events = kv.watch(b"k", WatchScope::Key, 2).await.unwrap();
    let start = tokio::time::Instant::now();
    let event = events.next().await.unwrap().unwrap();
    assert_eq!(event.kind, EventKind::Delete);
    assert_eq!(event.revision(), 2);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert!(matches!(kv.lease_keep_alive(lease).await, Err(KvError::LeaseNotFound(_))));
}

#[tokio::test(start_paused = true)]
async fn keep_alive_moves_the_deadline() {
    let kv = Arc::new(MemKv::new());
    let lease = kv.lease_grant(Duration::from_secs(10)).await.unwrap();
    kv.put(b"k", b"v", PutOptions::OVERWRITE.with_lease(Some(lease))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(kv.lease_keep_alive(lease).await.unwrap(), Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(kv.get(b"k").await.unwrap().kv.is_some());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(kv.get(b"k").await.unwrap().kv.is_none());
}

#[tokio::test]
async fn history_limit_compacts_old_revisions() {
    let kv = MemKv::builder().history_limit(3).build();
    for i in 0..5u8 {
        kv.put(b"k", &[i], PutOptions::OVERWRITE).await.unwrap();
    }
    assert_eq!(kv.oldest_revision(), 3);
    let mut old = kv.watch(b"k", WatchScope::Key, 2).await.unwrap();
    assert!(matches!(old.next().await, Some(Err(KvError::Compacted { requested: 2, oldest: 3 }))));
    assert!(old.next().await.is_none());
    let mut ok = kv.watch(b"k", WatchScope::Key, 3).await.unwrap();
    for rev in 3..=5 {
        assert_eq!(ok.next().await.unwrap().unwrap().revision(), rev);
    }
    assert!(ok.next().now_or_never().is_none());
}

#[tokio::test]
async fn dropped_watch_is_unregistered() {
    let kv = MemKv::new();
    let w1 = kv.watch(b"a", WatchScope::Prefix, 1).await.unwrap();
    let _w2 = kv.watch(b"b", WatchScope::Key, 1).await.unwrap();
    assert_eq!(kv.watcher_count(), 2);
    drop(w1);
    assert_eq!(kv.watcher_count(), 1);
}

#[tokio::test]
async fn named_instances_are_shared() {
    let a = MemKv::named("tests-named-shared");
    let b = MemKv::named("tests-named-shared");
    assert!(Arc::ptr_eq(&a, &b));
    a.put(b"x", b"1", PutOptions::OVERWRITE).await.unwrap();
    assert!(b.get(b"x").await.unwrap().kv.is_some());
    assert!(!Arc::ptr_eq(&a, &MemKv::named("tests-named-other")));
    assert!(MemKv::forget("tests-named-shared"));
    assert!(MemKv::named("tests-named-shared").get(b"x").await.unwrap().kv.is_none());
}

#[tokio::test(start_paused = true)]
async fn reaper_ends_when_the_store_is_dropped() {
    let kv = Arc::new(MemKv::new());
    kv.lease_grant(Duration::from_secs(3600)).await.unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    assert_eq!(metrics.num_alive_tasks(), 1);
    drop(kv);
    tokio::time::timeout(Duration::from_secs(1), async {
        while metrics.num_alive_tasks() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the reaper ends");
}

// Paused: on a running clock, a busy machine can let the 1 ms lease expire between the calls.
#[tokio::test(start_paused = true)]
async fn absurd_lease_ttl_is_rejected() {
    let kv = MemKv::new();
    assert!(matches!(kv.lease_grant(Duration::MAX).await, Err(KvError::InvalidArgument(_))));
    let lease = kv.lease_grant(Duration::ZERO).await.unwrap();
    assert_eq!(kv.lease_keep_alive(lease).await.unwrap(), rdzv_mem::MIN_LEASE_TTL);
}

#[test]
fn leases_expire_after_the_granting_runtime_is_gone() {
    let kv = Arc::new(MemKv::new());
    let first = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let written = first.block_on(async {
        let lease = kv.lease_grant(Duration::from_millis(200)).await.unwrap();
        let options = PutOptions::OVERWRITE.with_lease(Some(lease));
        kv.put(b"k", b"v", options).await.unwrap();
        kv.revision()
    });
    drop(first); // its reaper goes with it
    let second = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    second.block_on(async {
        let mut events = kv.watch(b"k", WatchScope::Key, written + 1).await.unwrap();
        let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
        let event = event.expect("the expiry is delivered without any further call").unwrap().unwrap();
        assert_eq!(event.kind, EventKind::Delete);
    });
}

#[tokio::test]
async fn mem_urls_name_shared_stores() {
    use rdzv_core::{BackendFactory, RendezvousUrl};
    let factory = rdzv_mem::MemFactory;
    let url = RendezvousUrl::parse("mem://tests-factory/run1?min_workers=1").unwrap();
    let a = factory.connect(&url).await.unwrap();
    let b = factory.connect(&RendezvousUrl::parse("mem://tests-factory/run2").unwrap()).await.unwrap();
    a.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap();
    assert!(b.get(b"k").await.unwrap().kv.is_some(), "same name, same store");
    let other = factory.connect(&RendezvousUrl::parse("mem://tests-factory-2/run1").unwrap()).await.unwrap();
    assert!(other.get(b"k").await.unwrap().kv.is_none());
    for bad in ["mem://a,b/run", "mem://a:7/run"] {
        // Either the parser or the factory rejects it.
        if let Ok(url) = RendezvousUrl::parse(bad) {
            assert!(factory.connect(&url).await.is_err(), "{bad} must be rejected");
        }
    }
}

/// Keys and values over the limits are refused with `TooLarge`, naming the limit, and
/// nothing is stored (no revision, no event); at the limit they are stored.
#[tokio::test(start_paused = true)]
async fn oversized_keys_and_values_are_refused_before_storing() {
    use rdzv_mem::{DEFAULT_MAX_KEY_SIZE, DEFAULT_MAX_VALUE_SIZE};
    let kv = MemKv::new();
    let big_key = vec![b'k'; DEFAULT_MAX_KEY_SIZE + 1];
    let big_value = vec![0u8; DEFAULT_MAX_VALUE_SIZE + 1];
    match kv.put(&big_key, b"v", PutOptions::OVERWRITE).await {
        Err(e @ KvError::TooLarge { backend: "mem", what: "a key", size, limit, .. }) => {
            assert_eq!((size, limit), (DEFAULT_MAX_KEY_SIZE + 1, DEFAULT_MAX_KEY_SIZE));
            // The in-memory backend has no URL option for it: the message names the builder.
            assert!(!e.to_string().contains("option") && e.to_string().contains("max_key_size"), "{e}");
        }
        other => panic!("expected TooLarge for the key, got {other:?}"),
    }
    let e = kv.put(b"k", &big_value, PutOptions::OVERWRITE).await.unwrap_err();
    assert!(matches!(e, KvError::TooLarge { what: "a value", limit: DEFAULT_MAX_VALUE_SIZE, .. }), "{e:?}");
    assert!(e.to_string().contains(&DEFAULT_MAX_VALUE_SIZE.to_string()), "{e}");
    assert!(!e.is_retryable());
    assert!(matches!(kv.increment(&big_key, 1).await, Err(KvError::TooLarge { what: "a key", .. })));
    assert_eq!(kv.revision(), 0, "nothing was written");
    assert!(kv.get(b"k").await.unwrap().kv.is_none());

    kv.put(&big_key[1..], b"v", PutOptions::OVERWRITE).await.unwrap();
    kv.put(b"k", &big_value[1..], PutOptions::OVERWRITE).await.unwrap();
    assert_eq!(kv.get(b"k").await.unwrap().kv.unwrap().value.len(), DEFAULT_MAX_VALUE_SIZE);
}

#[tokio::test(start_paused = true)]
async fn limits_are_settable() {
    let kv = MemKv::builder().max_key_size(8).max_value_size(2).build();
    kv.put(b"12345678", b"ab", PutOptions::OVERWRITE).await.unwrap();
    assert!(matches!(
        kv.put(b"123456789", b"a", PutOptions::OVERWRITE).await,
        Err(KvError::TooLarge { what: "a key", size: 9, limit: 8, .. })
    ));
    assert!(matches!(
        kv.put(b"k", b"abc", PutOptions::OVERWRITE).await,
        Err(KvError::TooLarge { what: "a value", size: 3, limit: 2, .. })
    ));
    assert_eq!(kv.revision(), 1);
}
