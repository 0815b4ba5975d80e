//! Cases for the read-modify-write operations: `add`, `append`, `compare_set`.

use std::collections::BTreeSet;

use crate::{CompareSet, Store, StoreError};

/// `add` on a missing key starts from 0 and stores decimal text.
pub async fn add_counts_from_zero_in_decimal_text(store: Store) {
    assert_eq!(store.add("n", 1).await.expect("add 1"), 1);
    assert_eq!(store.add("n", 41).await.expect("add 41"), 42);
    assert_eq!(store.get("n").await.expect("get"), b"42");
    assert_eq!(store.add("n", -50).await.expect("add -50"), -8);
    assert_eq!(store.get("n").await.expect("get"), b"-8");
    assert_eq!(store.add("m", 0).await.expect("add 0"), 0);
    assert!(store.check(["m"]).await.expect("check"), "add 0 creates the counter");
}

/// `add` continues from a number written by `set`.
pub async fn add_on_a_set_number(store: Store) {
    store.set("n", "7").await.expect("set");
    assert_eq!(store.add("n", 3).await.expect("add"), 10);
}

/// `add` on a value that is not a decimal integer fails and leaves it alone.
pub async fn add_on_a_non_number_fails(store: Store) {
    store.set("s", "abc").await.expect("set");
    match store.add("s", 1).await {
        Err(StoreError::NotANumber { key, value }) => {
            assert_eq!(key, b"s");
            assert_eq!(value, b"abc");
        }
        other => panic!("expected NotANumber, got {other:?}"),
    }
    assert_eq!(store.get("s").await.expect("get"), b"abc");
}

/// `add` past `i64::MAX` fails and leaves the counter alone.
pub async fn add_overflow_fails(store: Store) {
    store.set("big", i64::MAX.to_string()).await.expect("set");
    match store.add("big", 1).await {
        Err(StoreError::Overflow { key, .. }) => assert_eq!(key, b"big"),
        other => panic!("expected Overflow, got {other:?}"),
    }
    assert_eq!(store.get("big").await.expect("get"), i64::MAX.to_string().as_bytes());
}

/// 32 tasks adding concurrently lose no update, and each sees a distinct new value.
pub async fn concurrent_adds_lose_nothing(store: Store) {
    const TASKS: i64 = 32;
    const EACH: i64 = 4;
    let adders: Vec<_> = (0..TASKS)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..EACH {
                    seen.push(store.add("counter", 1).await.expect("add"));
                }
                seen
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    for adder in adders {
        for value in adder.await.expect("an adder task") {
            assert!(seen.insert(value), "two adds returned {value}");
        }
    }
    assert_eq!(seen, (1..=TASKS * EACH).collect::<BTreeSet<_>>());
    assert_eq!(store.get("counter").await.expect("get"), (TASKS * EACH).to_string().as_bytes());
}

/// `append` creates a missing key and extends an existing one.
pub async fn append_creates_then_extends(store: Store) {
    store.append("log", "ab").await.expect("append to a missing key");
    store.append("log", [0u8, 255]).await.expect("append");
    assert_eq!(store.get("log").await.expect("get"), b"ab\x00\xff");
}

/// Concurrent appends each land exactly once.
pub async fn concurrent_appends_lose_nothing(store: Store) {
    let appenders: Vec<_> = (0u8..16)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.append("log", [b'a' + i]).await })
        })
        .collect();
    for appender in appenders {
        appender.await.expect("an appender task").expect("append");
    }
    let mut log = store.get("log").await.expect("get");
    log.sort_unstable();
    assert_eq!(log, (0u8..16).map(|i| b'a' + i).collect::<Vec<_>>());
}

/// c10d's rules: swap when the value matches, or when the key is missing and `expected` is
/// empty; a missing key with a non-empty `expected` returns `expected` and is not created.
pub async fn compare_set_follows_c10d_rules(store: Store) {
    assert_eq!(store.compare_set("k", "", "first").await.expect("create"), b"first");
    assert_eq!(store.get("k").await.expect("get"), b"first");

    assert_eq!(store.compare_set("k", "first", "second").await.expect("swap"), b"second");
    assert_eq!(store.compare_set("k", "first", "third").await.expect("no swap"), b"second");
    assert_eq!(store.compare_set("k", "", "third").await.expect("no swap on empty"), b"second");
    assert_eq!(store.get("k").await.expect("get"), b"second");

    assert_eq!(store.compare_set("missing", "old", "new").await.expect("quirk"), b"old");
    assert!(!store.check(["missing"]).await.expect("check"), "the quirk must not create the key");

    store.set("empty", "").await.expect("set an empty value");
    assert_eq!(store.compare_set("empty", "", "filled").await.expect("swap an empty value"), b"filled");
}

/// `compare_set_checked` says whether it swapped and what is stored.
pub async fn compare_set_checked_reports_success(store: Store) {
    let created = store.compare_set_checked("k", "", "v1").await.expect("create");
    assert_eq!(created, CompareSet { swapped: true, value: Some(b"v1".to_vec()) });
    let lost = store.compare_set_checked("k", "other", "v2").await.expect("mismatch");
    assert_eq!(lost, CompareSet { swapped: false, value: Some(b"v1".to_vec()) });
    let missing = store.compare_set_checked("none", "x", "y").await.expect("missing");
    assert_eq!(missing, CompareSet { swapped: false, value: None });
    let swapped = store.compare_set_checked("k", "v1", "v2").await.expect("swap");
    assert_eq!(swapped, CompareSet { swapped: true, value: Some(b"v2".to_vec()) });
}

/// Of 16 concurrent creators, exactly one wins and everyone learns its value.
pub async fn concurrent_compare_set_has_one_winner(store: Store) {
    let racers: Vec<_> = (0..16)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.compare_set_checked("leader", "", format!("rank-{i}")).await })
        })
        .collect();
    let mut winners = Vec::new();
    let mut values = BTreeSet::new();
    for racer in racers {
        let outcome = racer.await.expect("a racer task").expect("compare_set_checked");
        let value = outcome.value.expect("the key exists after the race");
        if outcome.swapped {
            winners.push(value.clone());
        }
        values.insert(value);
    }
    assert_eq!(winners.len(), 1, "exactly one racer swaps");
    assert_eq!(values.into_iter().collect::<Vec<_>>(), winners, "everyone sees the winner's value");
    assert_eq!(vec![store.get("leader").await.expect("get")], winners);
}
