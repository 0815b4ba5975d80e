//! FaultyKv: every fault, its determinism from the seed, and switching faults at run time.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rdzv_core::kv::{PutOptions, WatchScope};
use rdzv_core::layer::{FaultyKv, Latency};
use rdzv_core::{Kv, KvError};
use rdzv_mem::MemKv;
use tokio::time::Instant;

fn mem() -> Arc<dyn Kv> {
    Arc::new(MemKv::new())
}

fn is_unavailable(e: &KvError) -> bool {
    matches!(e, KvError::Unavailable { .. }) && e.is_retryable()
}

#[tokio::test]
async fn fails_exactly_the_nth_call_without_reaching_the_backend() {
    let inner = mem();
    let kv = FaultyKv::new(inner.clone(), 1);
    kv.fail_nth_call(3);
    kv.get(b"k").await.unwrap();
    kv.get(b"k").await.unwrap();
    let err = kv.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap_err();
    assert!(is_unavailable(&err), "{err:?}");
    assert!(err.to_string().contains("call #3"), "{err}");
    assert!(inner.get(b"k").await.unwrap().kv.is_none(), "a failed call must not reach the backend");
    for _ in 0..10 {
        kv.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap();
    }
    assert_eq!(kv.calls(), 13);
    kv.fail_nth_call(1);
    assert!(kv.lease_grant(Duration::from_secs(1)).await.is_err());
    kv.fail_nth_call(2);
    kv.fail_nth_call(0);
    for _ in 0..3 {
        kv.get(b"k").await.unwrap();
    }
}

async fn failure_pattern(seed: u64, p: f64) -> Vec<bool> {
    let kv = FaultyKv::new(mem(), seed);
    kv.set_failure_probability(p);
    let mut pattern = Vec::new();
    for _ in 0..200 {
        pattern.push(kv.get(b"k").await.is_err());
    }
    pattern
}

#[tokio::test]
async fn random_failures_follow_the_seed() {
    let a = failure_pattern(7, 0.3).await;
    assert_eq!(a, failure_pattern(7, 0.3).await, "same seed, same failures");
    assert_ne!(a, failure_pattern(8, 0.3).await, "another seed, other failures");
    let failures = a.iter().filter(|f| **f).count();
    assert!((30..=90).contains(&failures), "about 30% of 200 calls should fail, {failures} did");
    assert!(failure_pattern(1, 0.0).await.iter().all(|f| !f));
    assert!(failure_pattern(1, 1.0).await.iter().all(|f| *f));
    assert!(failure_pattern(1, f64::NAN).await.iter().all(|f| !f));
}

#[tokio::test(start_paused = true)]
async fn fixed_latency_delays_every_call() {
    let kv = FaultyKv::new(mem(), 1);
    kv.set_latency(Latency::Fixed(Duration::from_millis(250)));
    let start = Instant::now();
    kv.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap();
    kv.get(b"k").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    kv.clear();
    let start = Instant::now();
    kv.get(b"k").await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

async fn random_delays(seed: u64) -> Vec<Duration> {
    let kv = FaultyKv::new(mem(), seed);
    let (min, max) = (Duration::from_millis(10), Duration::from_millis(50));
    kv.set_latency(Latency::Uniform { min, max });
    let mut delays = Vec::new();
    for _ in 0..50 {
        let start = Instant::now();
        kv.get(b"k").await.unwrap();
        let delay = start.elapsed();
        assert!(delay >= min && delay <= max, "{delay:?} outside [{min:?}, {max:?}]");
        delays.push(delay);
    }
    delays
}

#[tokio::test(start_paused = true)]
async fn random_latency_follows_the_seed() {
    let a = random_delays(3).await;
    assert_eq!(a, random_delays(3).await);
    assert!(a.iter().any(|d| *d != a[0]), "delays should vary");
}

#[tokio::test]
async fn watch_drops_after_k_events() {
    let kv = FaultyKv::new(mem(), 1);
    for i in 0..5u8 {
        kv.put(b"k", &[i], PutOptions::OVERWRITE).await.unwrap();
    }
    kv.drop_watches_after(Some(2));
    let mut events = kv.watch(b"k", WatchScope::Key, 1).await.unwrap();
    assert_eq!(events.next().await.unwrap().unwrap().revision(), 1);
    assert_eq!(events.next().await.unwrap().unwrap().revision(), 2);
    assert!(is_unavailable(&events.next().await.unwrap().unwrap_err()));
    assert!(events.next().await.is_none(), "the stream ends after the drop");

    kv.drop_watches_after(Some(0));
    let mut events = kv.watch(b"k", WatchScope::Key, 1).await.unwrap();
    assert!(events.next().await.unwrap().is_err());
    assert!(events.next().await.is_none());

    kv.drop_watches_after(None);
    let mut events = kv.watch(b"k", WatchScope::Key, 1).await.unwrap();
    for rev in 1..=5 {
        assert_eq!(events.next().await.unwrap().unwrap().revision(), rev);
    }
}

#[tokio::test]
async fn open_watches_can_be_cut_on_demand() {
    let kv = FaultyKv::new(mem(), 1);
    let mut waiting = kv.watch(b"k", WatchScope::Key, 1).await.unwrap();
    let pending = tokio::spawn(async move {
        let first = waiting.next().await.unwrap();
        (first, waiting.next().await.is_none())
    });
    tokio::task::yield_now().await;
    kv.drop_open_watches();
    let (first, ended) = tokio::time::timeout(Duration::from_secs(5), pending).await.unwrap().unwrap();
    assert!(is_unavailable(&first.unwrap_err()));
    assert!(ended);

    // Watches opened after the cut are unaffected by it.
    let mut fresh = kv.watch(b"k", WatchScope::Key, 1).await.unwrap();
    kv.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap();
    assert_eq!(fresh.next().await.unwrap().unwrap().kv.value, &b"v"[..]);
}

#[tokio::test]
async fn watch_outlives_its_faulty_handle() {
    let inner = mem();
    let kv = FaultyKv::new(inner.clone(), 1);
    let mut events = kv.watch(b"k", WatchScope::Key, 1).await.unwrap();
    drop(kv);
    inner.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap();
    assert_eq!(event.unwrap().unwrap().kv.value, &b"v"[..]);
}

#[tokio::test]
async fn reports_the_wrapped_backend() {
    let kv = FaultyKv::new(mem(), 1);
    assert_eq!(kv.name(), "mem");
    assert_eq!(kv.capabilities(), kv.inner().capabilities());
    kv.fail_nth_call(1);
    let err = kv.get(b"k").await.unwrap_err();
    assert!(err.to_string().starts_with("mem at fault-injection is unavailable"), "{err}");
}

#[tokio::test]
async fn a_failure_after_applying_loses_only_the_answer() {
    let inner = mem();
    let kv = FaultyKv::new(inner.clone(), 1);
    kv.set_fail_after_applying(true);
    kv.fail_nth_call(1);
    let err = kv.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap_err();
    assert!(is_unavailable(&err));
    assert!(err.to_string().contains("after reaching the backend"), "{err}");
    assert_eq!(inner.get(b"k").await.unwrap().kv.unwrap().value, &b"v"[..], "the put took effect");
    kv.clear();
    kv.fail_nth_call(1);
    assert!(kv.delete(b"k", rdzv_core::kv::DeleteMode::Any).await.is_err());
    assert!(inner.get(b"k").await.unwrap().kv.is_some(), "clear() restores failing before applying");
}
