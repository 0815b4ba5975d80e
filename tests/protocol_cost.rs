//! The cost guarantee of docs/PROTOCOL.md: backend writes and reads per worker per round are
//! bounded by a constant (≤ 4, lease refreshes aside) whatever N, the keys the server visits
//! to answer them per worker too (nobody counts the others' keys: a worker's position is the
//! tally of its own create), and the shared state value changes O(1) times per round — for a
//! first round and for a re-rendezvous of everyone.
#![allow(clippy::unwrap_used)]

use rdzv_core::testing::rendezvous as support;

use std::sync::Arc;

use futures::StreamExt;
use rdzv_core::kv::WatchScope;
use rdzv_core::layer::{CountingKv, OpCounts};
use rdzv_core::{Kv, RendezvousHandler};
use rdzv_mem::MemKv;

async fn state_changes_since(kv: &Arc<dyn Kv>, key: &[u8], from: i64, upto: i64) -> usize {
    let mut events = kv.watch(key, WatchScope::Key, from).await.unwrap();
    let mut n = 0;
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(std::time::Duration::from_millis(10), events.next()).await
    {
        if event.revision() > upto {
            break;
        }
        n += 1;
    }
    n
}

/// The keys the server visits per worker and round, at most: the one freeze's read of every
/// join key and the one last confirmer's count of the keep-alive keys are N each, shared by
/// N workers; each worker's own reads visit a key or two.
const KEYS_VISITED_PER_WORKER: f64 = 8.0;

/// The conditional writes of the state and the version counter in one round, whatever N:
/// `setup`, the counter, `joinable`, `frozen`, `final`, and the swap that ends the round before.
const MAX_PUTS_PER_ROUND: u64 = 8;

/// Measures two rounds of `n` workers; returns the keys visited per worker in each.
async fn measure(n: usize) -> Vec<f64> {
    let mem = Arc::new(MemKv::new());
    let counting = CountingKv::new(mem.clone() as Arc<dyn Kv>);
    let kv = counting.clone() as Arc<dyn Kv>;
    let params = support::params(&support::run_id("cost"), n, n);
    let mut handlers = Vec::new();
    for i in 0..n {
        let mut p = params.clone();
        p.node_id = Some(format!("n{i}"));
        handlers.push(RendezvousHandler::new(kv.clone(), p).await.unwrap());
    }
    let state_key = handlers[0].keys().state();
    let mut visited_per_round = Vec::new();
    for round in 1..=2 {
        let before: OpCounts = counting.snapshot();
        let from = mem.revision() + 1;
        let infos: Vec<_> =
            support::rendezvous_all(&handlers).await.into_iter().map(Result::unwrap).collect();
        support::assert_agreement(&infos, n, n);
        let used = counting.snapshot() - before;
        let writes = used.writes() as f64 / n as f64;
        let reads = used.reads() as f64 / n as f64;
        let visited = used.keys_visited as f64 / n as f64;
        let changes =
            state_changes_since(&(mem.clone() as Arc<dyn Kv>), &state_key, from, mem.revision()).await;
        println!(
            "N={n} round {round}: {writes:.2} writes/worker, {reads:.2} reads/worker, {visited:.2} keys visited/worker, {changes} state changes ({used:?})"
        );
        assert!(
            visited <= KEYS_VISITED_PER_WORKER,
            "N={n} round {round}: {visited:.2} keys visited per worker"
        );
        visited_per_round.push(visited);
        assert!(writes <= 4.0, "N={n} round {round}: {writes:.2} writes per worker");
        assert!(reads <= 4.0, "N={n} round {round}: {reads:.2} reads per worker");
        assert!(changes <= 4, "N={n} round {round}: the state changed {changes} times");
        if round == 2 {
            // Everyone re-enters at once: rank 0 ends the round, the others see it end during
            // their stagger and do not swap too (they used to: a write each, lost).
            assert!(
                used.puts <= MAX_PUTS_PER_ROUND,
                "N={n}: {} puts when everyone re-entered (a lost swap each?)",
                used.puts
            );
        }
    }
    visited_per_round
}

#[tokio::test(start_paused = true)]
async fn cost_is_flat_at_8() {
    measure(8).await;
}

#[tokio::test(start_paused = true)]
async fn cost_is_flat_at_64() {
    measure(64).await;
}

#[tokio::test(start_paused = true)]
async fn cost_is_flat_at_512() {
    measure(512).await;
}

/// Issue 25: the server's work per worker is flat from 64 to 8,192 workers — it used to be a
/// count of the join keys up to each worker's own (N/2 keys visited per worker on average).
#[tokio::test(start_paused = true)]
async fn server_work_per_worker_is_flat_from_64_to_8192() {
    let small = measure(64).await;
    let large = measure(8192).await;
    for (round, (s, l)) in small.iter().zip(&large).enumerate() {
        assert!(*l <= s + 1.0, "round {}: {l:.2} keys visited per worker at 8192, {s:.2} at 64", round + 1);
    }
}
