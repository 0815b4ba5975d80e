//! Cases for the barrier.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{SHORT, bytes, timed_out_keys};
use crate::{Store, StoreError};

/// How long the barrier cases let their tasks wait.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(30);

/// 64 tasks: none leaves the barrier before all have arrived.
pub async fn barrier_of_64_tasks(store: Store) {
    run_rounds(store, 64, 1).await;
}

/// The same barrier key works for several rounds in a row.
pub async fn barrier_can_be_reused(store: Store) {
    run_rounds(store, 8, 4).await;
}

/// `tasks` tasks pass the barrier `rounds` times; after round r each has seen at least
/// r × tasks arrivals.
async fn run_rounds(store: Store, tasks: usize, rounds: usize) {
    let arrived = Arc::new(AtomicUsize::new(0));
    let ranks: Vec<_> = (0..tasks)
        .map(|_| {
            let (store, arrived) = (store.clone(), arrived.clone());
            tokio::spawn(async move {
                for round in 1..=rounds {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    store.barrier("sync", tasks, BARRIER_TIMEOUT).await.expect("barrier");
                    let seen = arrived.load(Ordering::SeqCst);
                    assert!(seen >= round * tasks, "left round {round} after only {seen} arrivals");
                }
            })
        })
        .collect();
    for rank in ranks {
        rank.await.expect("a rank task");
    }
}

/// A barrier that not everyone reaches times out naming its key.
pub async fn barrier_times_out_naming_the_key(store: Store) {
    let result = store.barrier("lonely", 2, SHORT).await;
    assert_eq!(timed_out_keys(result, "barrier"), bytes(["lonely"]));
}

/// A barrier of zero ranks is an invalid argument, not a hang.
pub async fn barrier_rejects_a_zero_world_size(store: Store) {
    let result = store.barrier("b", 0, SHORT).await;
    assert!(matches!(result, Err(StoreError::InvalidArgument(_))), "got {result:?}");
}
