//! A write whose answer is lost (the backend applied it; the connection dropped before the
//! answer came): what each Store call then reports, and whether calling it again is safe
//! (docs/STORE.md, "Calling again"). `FaultyKv::set_fail_after_applying` makes exactly that
//! happen once.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rdzv_core::Kv;
use rdzv_core::kv::{LeaseId, Op};
use rdzv_core::layer::{FaultyKv, Latency};
use rdzv_mem::MemKv;
use rdzv_store::{CompareSet, Store, StoreError};

const T: Duration = Duration::from_secs(10);

/// A Store on memory through a `FaultyKv` whose next `operation` takes effect and then fails.
fn losing_next(operation: Op) -> (Store, Arc<FaultyKv>) {
    let faulty = FaultyKv::new(Arc::new(MemKv::new()), 7);
    faulty.set_fail_after_applying(true);
    faulty.fail_next(operation);
    (Store::new(faulty.clone() as Arc<dyn Kv>, "s/").with_timeout(T), faulty)
}

fn assert_unknown(result: Result<impl std::fmt::Debug, StoreError>, operation: &str) {
    match result {
        Err(e @ StoreError::OutcomeUnknown { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            let text = e.to_string();
            assert!(text.contains(operation) && text.contains("may apply it twice"), "{text}");
        }
        other => panic!("{operation}: expected OutcomeUnknown, got {other:?}"),
    }
}

async fn leased(kv: &Arc<FaultyKv>) -> LeaseId {
    kv.inner().lease_grant(Duration::from_secs(600)).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_a_count_append_or_push_is_never_retryable() {
    // Native increment (memory without a lease).
    let (store, _) = losing_next(Op::Increment);
    assert_unknown(store.add("n", 1).await, "add");
    assert_eq!(store.get("n").await.unwrap(), b"1", "it was counted once");
    // Compare-and-swap counter (a leased Store).
    let (store, faulty) = losing_next(Op::Put);
    let store = store.with_lease(Some(leased(&faulty).await));
    assert_unknown(store.add("n", 5).await, "add");
    assert_eq!(store.get("n").await.unwrap(), b"5");
    let (store, _) = losing_next(Op::Put);
    assert_unknown(store.append("log", "a").await, "append");
    assert_eq!(store.get("log").await.unwrap(), b"a");
    let (store, _) = losing_next(Op::Put);
    assert_unknown(store.queue_push("q", "x").await, "queue_push");
    assert_eq!(store.queue_len("q").await.unwrap(), 1, "the item is in the queue");
    // A pop whose delete took effect: the item is gone, and was not returned.
    let (store, faulty) = losing_next(Op::Delete);
    faulty.clear();
    store.queue_push("q", "x").await.unwrap();
    faulty.set_fail_after_applying(true);
    faulty.fail_next(Op::Delete);
    assert_unknown(store.queue_pop("q", false).await, "queue_pop");
    assert_eq!(store.queue_len("q").await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_a_set_or_compare_set_is_retryable_and_calling_again_is_safe() {
    let (store, _) = losing_next(Op::Put);
    let e = store.set("k", "v").await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    store.set("k", "v").await.unwrap();
    assert_eq!(store.get("k").await.unwrap(), b"v");

    let (store, _) = losing_next(Op::Put);
    let e = store.compare_set("c", "", "first").await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    // The first swap took effect: the second finds `desired` and writes nothing.
    assert_eq!(store.compare_set("c", "", "first").await.unwrap(), b"first");
    assert_eq!(store.get("c").await.unwrap(), b"first");
}

/// The rest of the first row: `multi_set`, `delete_key` and `compare_set_checked` whose
/// write took effect and lost its answer fail retryably, and calling them again is safe (the
/// same effect once more; a second `delete_key` finds the key gone and says `false`, a second
/// `compare_set_checked` says `swapped: false`).
#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_a_multi_set_delete_or_checked_swap_is_retryable_and_calling_again_is_safe() {
    let (store, _) = losing_next(Op::Put);
    let items = [("a", "1"), ("b", "2"), ("c", "3")];
    let e = store.multi_set(items).await.unwrap_err();
    assert!(e.is_retryable() && !e.is_timeout(), "{e}");
    store.multi_set(items).await.unwrap();
    assert_eq!(store.multi_get(["a", "b", "c"]).await.unwrap(), [b"1", b"2", b"3"]);
    assert_eq!(store.num_keys().await.unwrap(), 3);

    let (store, faulty) = losing_next(Op::Delete);
    faulty.clear();
    store.set("d", "v").await.unwrap();
    faulty.set_fail_after_applying(true);
    faulty.fail_next(Op::Delete);
    let e = store.delete_key("d").await.unwrap_err();
    assert!(e.is_retryable() && !e.is_timeout(), "{e}");
    assert!(!store.delete_key("d").await.unwrap(), "the first delete took effect: the second finds nothing");
    assert!(!store.check(["d"]).await.unwrap());

    let (store, _) = losing_next(Op::Put);
    let e = store.compare_set_checked("s", "", "first").await.unwrap_err();
    assert!(e.is_retryable() && !e.is_timeout(), "{e}");
    let again = store.compare_set_checked("s", "", "first").await.unwrap();
    assert_eq!(again, CompareSet { swapped: false, value: Some(b"first".to_vec()) });
}

/// The barrier row: a barrier whose count took effect and lost its answer reports
/// `OutcomeUnknown` (not retryable, not the Store's `Timeout`), at once; the count was made,
/// so the other rank's arrival completes the generation.
#[tokio::test(start_paused = true)]
async fn a_barrier_whose_count_lost_its_answer_is_an_unknown_outcome() {
    // Native increment (memory without a lease), then the compare-and-swap count (leased).
    for (operation, leased_store) in [(Op::Increment, false), (Op::Put, true)] {
        let (store, faulty) = losing_next(operation);
        let store = if leased_store { store.with_lease(Some(leased(&faulty).await)) } else { store };
        let started = tokio::time::Instant::now();
        let e = store.barrier("b", 2, T).await.unwrap_err();
        assert!(!e.is_timeout() && started.elapsed() < T, "{operation}: {e}");
        assert_unknown(Err::<(), _>(e), "barrier");
        // Counted once: the second rank is the generation's last, and passes at once.
        tokio::time::timeout(Duration::from_secs(1), store.barrier("b", 2, T))
            .await
            .unwrap_or_else(|_| panic!("{operation}: the lost count was not made"))
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_during_a_write_is_an_unknown_outcome_and_during_a_wait_a_timeout() {
    let faulty = FaultyKv::new(Arc::new(MemKv::new()), 3);
    let store = Store::new(faulty.clone() as Arc<dyn Kv>, "s/").with_timeout(Duration::from_secs(1));
    faulty.set_latency(Latency::Fixed(Duration::from_secs(5)));
    assert_unknown(store.add("n", 1).await, "add");
    faulty.clear();
    let e = store.get("missing").await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
}

/// The last rank's write of the done key fails once: it is written again, and every rank
/// passes (the last used to fail retryably — a retry would count it twice — and the others
/// to wait for a done key never written).
#[tokio::test(start_paused = true)]
async fn a_barrier_whose_done_key_write_fails_still_releases_every_rank() {
    let faulty = FaultyKv::new(Arc::new(MemKv::new()), 5);
    let store = Store::new(faulty.clone() as Arc<dyn Kv>, "s/").with_timeout(T);
    let first = store.clone();
    let waiting = tokio::spawn(async move { first.barrier("b", 2, T).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    faulty.fail_next(Op::Put);
    store.barrier("b", 2, T).await.unwrap();
    waiting.await.unwrap().unwrap();
}
