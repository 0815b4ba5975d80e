//! Concurrency: compare-and-swap and native increments under contention, and distinct
//! revisions for concurrent writers.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{key, put, within};
use crate::ext::KvExt;
use crate::kv::{Kv, PutOptions};

fn parse(value: Option<&crate::kv::KeyValue>) -> Option<u64> {
    match value {
        None => Some(0),
        Some(kv) => std::str::from_utf8(&kv.value).ok()?.parse().ok(),
    }
}

/// 50 tasks each add 1 by compare-and-swap at once: the result is exactly 50.
pub async fn concurrent_cas_incrementers_lose_no_update(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    const TASKS: u64 = 50;
    let k = key(&ns, "counter");
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let kv = kv.clone();
            let k = k.clone();
            tokio::spawn(async move {
                within(
                    "incrementing by compare-and-swap",
                    kv.compare_and_swap(&k, PutOptions::OVERWRITE, |cur| {
                        Some((parse(cur).expect("the counter holds a number") + 1).to_string().into_bytes())
                    }),
                )
                .await
                .expect("cas")
                .expect("written")
            })
        })
        .collect();
    let mut written = BTreeSet::new();
    for task in tasks {
        let (value, _) = within("joining an incrementer", task).await.expect("incrementer task");
        assert!(written.insert(value), "two incrementers wrote the same value");
    }
    let got = within("get", kv.get(&k)).await.expect("get").kv;
    assert_eq!(parse(got.as_ref()), Some(TASKS), "lost updates");
}

/// 50 concurrent native increments (where the backend has them) lose no update.
pub async fn concurrent_native_increments_lose_no_update(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "counter");
    if !kv.capabilities().native_increment {
        return; // not native: covered by the compare-and-swap case
    }
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let kv = kv.clone();
            let k = k.clone();
            tokio::spawn(async move { within("increment", kv.increment(&k, 2)).await.expect("increment") })
        })
        .collect();
    let mut results = BTreeSet::new();
    for task in tasks {
        let n = within("joining", task).await.expect("task").expect("native");
        assert!(results.insert(n), "two increments returned the same value {n}");
    }
    assert_eq!(results, (1..=50).map(|i| i * 2).collect::<BTreeSet<i64>>());
}

/// Concurrent writers never share a revision.
pub async fn concurrent_writers_get_distinct_revisions(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let kv = kv.clone();
            let ns = ns.clone();
            tokio::spawn(async move {
                let mut revisions = Vec::new();
                for i in 0..10 {
                    revisions.push(put(&*kv, &key(&ns, &format!("{t}/{i}")), b"v").await);
                }
                revisions
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    for task in tasks {
        let revisions = within("joining a writer", task).await.expect("writer task");
        assert!(revisions.windows(2).all(|w| w[0] < w[1]), "one writer's revisions must increase");
        for r in revisions {
            assert!(all.insert(r), "revision {r} was given to two writes");
        }
    }
}
