//! The Store test cases, one `pub async fn(Store)` each, in a module per topic. Every case
//! gets a Store on a fresh root with a [`STORE_TIMEOUT`](super::STORE_TIMEOUT) timeout.

pub mod barrier;
pub mod counter;
pub mod keys;
pub mod prefix;
pub mod queue;

use std::time::Duration;

use crate::StoreError;

/// The timeout of the cases that check that something times out.
const SHORT: Duration = Duration::from_millis(400);

/// How late a timeout may fire on a loaded machine talking to a real server.
const SLACK: Duration = Duration::from_millis(1500);

/// Gives spawned waiters a moment to start watching before the write they wait for, so
/// that the case exercises the watch rather than the first read. Correctness never depends
/// on it: a waiter that starts late finds the key by reading it.
async fn let_waiters_start() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

/// The keys of a [`StoreError::Timeout`] from `operation`; panics on anything else.
fn timed_out_keys(result: Result<impl std::fmt::Debug, StoreError>, operation: &str) -> Vec<Vec<u8>> {
    match result {
        Err(StoreError::Timeout { operation: op, keys, after }) => {
            assert_eq!(op, operation, "the timeout names the operation");
            assert!(after > Duration::ZERO, "the timeout says how long it waited");
            keys
        }
        other => panic!("expected `{operation}` to time out, got {other:?}"),
    }
}

/// `items` as owned byte strings, for comparisons.
fn bytes<const N: usize>(items: [&str; N]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}
