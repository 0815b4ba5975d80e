//! Cases for the queues: order, blocking, waking exactly one popper, exactly-once delivery.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{SHORT, bytes, let_waiters_start, timed_out_keys};
use crate::{Store, StoreError};

/// Items come out in the order they were pushed, and `queue_len` follows.
pub async fn queue_is_fifo(store: Store) {
    assert_eq!(store.queue_len("q").await.expect("queue_len"), 0);
    for i in 0..20 {
        store.queue_push("q", format!("item-{i}")).await.expect("push");
    }
    assert_eq!(store.queue_len("q").await.expect("queue_len"), 20);
    for i in 0..20 {
        let item = store.queue_pop("q", false).await.expect("pop");
        assert_eq!(item, format!("item-{i}").as_bytes());
    }
    assert_eq!(store.queue_len("q").await.expect("queue_len"), 0);
}

/// A non-blocking pop on an empty queue is the distinct "queue empty" error.
pub async fn queue_pop_on_empty_without_block_is_queue_empty(store: Store) {
    match store.queue_pop("q", false).await {
        Err(StoreError::QueueEmpty { key }) => assert_eq!(key, b"q"),
        other => panic!("expected QueueEmpty, got {other:?}"),
    }
    store.queue_push("q", "x").await.expect("push");
    assert_eq!(store.queue_pop("q", false).await.expect("pop"), b"x");
    assert!(matches!(store.queue_pop("q", false).await, Err(StoreError::QueueEmpty { .. })));
}

/// A blocking pop on an empty queue waits for the next push.
pub async fn queue_pop_blocks_until_push(store: Store) {
    let popper = store.clone();
    let waiting = tokio::spawn(async move { popper.queue_pop("q", true).await });
    let_waiters_start().await;
    assert!(!waiting.is_finished(), "pop returned from an empty queue");
    store.queue_push("q", "hello").await.expect("push");
    assert_eq!(waiting.await.expect("the popper task").expect("pop"), b"hello");
}

/// A blocking pop on a queue nobody pushes to times out naming the queue.
pub async fn queue_pop_times_out(store: Store) {
    let result = store.with_timeout(SHORT).queue_pop("q", true).await;
    assert_eq!(timed_out_keys(result, "queue_pop"), bytes(["q"]));
}

/// One push completes exactly one of several blocked pops; the others keep waiting.
pub async fn queue_push_wakes_exactly_one_pop(store: Store) {
    let (done, mut popped) = mpsc::unbounded_channel();
    let poppers: Vec<_> = (0..3)
        .map(|_| {
            let (store, done) = (store.clone(), done.clone());
            tokio::spawn(async move {
                let item = store.queue_pop("q", true).await.expect("pop");
                done.send(item).expect("the case is listening");
            })
        })
        .collect();
    let_waiters_start().await;
    store.queue_push("q", "one").await.expect("push");
    let first = tokio::time::timeout(Duration::from_secs(10), popped.recv()).await;
    assert_eq!(first.expect("a pop returns").expect("an item"), b"one");
    let second = tokio::time::timeout(Duration::from_millis(300), popped.recv()).await;
    assert!(second.is_err(), "a second pop returned without a second push: {second:?}");
    store.queue_push("q", "two").await.expect("push");
    store.queue_push("q", "three").await.expect("push");
    let mut rest = BTreeSet::new();
    for _ in 0..2 {
        let item = tokio::time::timeout(Duration::from_secs(10), popped.recv()).await;
        rest.insert(item.expect("a pop returns").expect("an item"));
    }
    assert_eq!(rest.into_iter().collect::<Vec<_>>(), bytes(["three", "two"]));
    for popper in poppers {
        popper.await.expect("a popper task");
    }
    assert_eq!(store.queue_len("q").await.expect("queue_len"), 0);
}

/// 8 concurrent blocking poppers and 2 pushers: each of 64 items is popped exactly once.
pub async fn queue_items_popped_once_by_8_poppers(store: Store) {
    const ITEMS: usize = 64;
    let claimed = Arc::new(AtomicUsize::new(0));
    let poppers: Vec<_> = (0..8)
        .map(|_| {
            let (store, claimed) = (store.clone(), claimed.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                // Each claim is one pop that will be satisfied: ITEMS claims in all.
                while claimed.fetch_add(1, Ordering::SeqCst) < ITEMS {
                    got.push(store.queue_pop("work", true).await.expect("pop"));
                }
                got
            })
        })
        .collect();
    let pushers: Vec<_> = (0..2)
        .map(|p| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (p..ITEMS).step_by(2) {
                    store.queue_push("work", format!("item-{i}")).await.expect("push");
                }
            })
        })
        .collect();
    for pusher in pushers {
        pusher.await.expect("a pusher task");
    }
    let mut all = Vec::new();
    for popper in poppers {
        all.extend(popper.await.expect("a popper task"));
    }
    all.sort();
    let mut expected: Vec<Vec<u8>> = (0..ITEMS).map(|i| format!("item-{i}").into_bytes()).collect();
    expected.sort();
    assert_eq!(all, expected, "every item popped exactly once");
    assert_eq!(store.queue_len("work").await.expect("queue_len"), 0);
}

/// A queue is apart from the key of the same name, and queue `a` from queue `a/b`.
pub async fn queues_are_apart_from_keys_and_each_other(store: Store) {
    store.queue_push("a", "in a").await.expect("push to a");
    store.queue_push("a/b", "in a/b").await.expect("push to a/b");
    store.set("a", "plain").await.expect("set a");
    assert_eq!(store.queue_len("a").await.expect("len of a"), 1);
    assert_eq!(store.queue_len("a/b").await.expect("len of a/b"), 1);
    assert_eq!(store.get("a").await.expect("get a"), b"plain");
    assert_eq!(store.num_keys().await.expect("num_keys"), 1);
    assert_eq!(store.queue_pop("a", false).await.expect("pop a"), b"in a");
    assert!(matches!(store.queue_pop("a", false).await, Err(StoreError::QueueEmpty { .. })));
    assert_eq!(store.queue_pop("a/b", false).await.expect("pop a/b"), b"in a/b");
    assert!(!store.check(["a/b"]).await.expect("check"), "a queue is not a key");
}
