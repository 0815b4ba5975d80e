//! Testing aids (feature `testing`): the backend conformance suite of docs/KV.md, one set of
//! test cases written once against [`Kv`] that every backend must pass; and the rendezvous
//! scenarios ([`rendezvous`]), run on every backend the same way. With the Store's suite
//! (`rdzv_store::testing`), a backend runs all three from one test file. (The decorators
//! tests use, `CountingKv` and `FaultyKv`, are in [`layer`](crate::layer), for every build.)
//!
//! Each case is a plain `pub async fn case(kv: Arc<dyn Kv>, ns: Vec<u8>)` in the module of
//! its topic (e.g. [`reads::range_counts_all_and_limits`]) that panics on a violation. It touches only keys under its namespace `ns`, so cases can share one store
//! (one etcd or Redis server) and run in parallel. Every wait is bounded, so a broken
//! backend fails a case instead of hanging it. Lease cases run on real time with short TTLs
//! (the backend's [`min_lease_ttl`](crate::kv::Capabilities::min_lease_ttl), at least two
//! seconds), so the suite takes several seconds.
//!
//! A backend that lacks a feature declares it in [`Kv::capabilities`]; the cases check that
//! it then fails cleanly with [`KvError::Unsupported`].
//!
//! # Running it for a backend
//!
//! Add `rdzv-core = { workspace = true, features = ["testing"] }` and tokio (with `macros`
//! and `rt-multi-thread`) to the backend crate's dev-dependencies, then in a test file:
//!
//! ```text
//! rdzv_core::conformance_suite!(async {
//!     std::sync::Arc::new(rdzv_mem::MemKv::new()) as std::sync::Arc<dyn rdzv_core::Kv>
//! });
//! ```
//!
//! (The workspace's backend matrix, `tests/backends/`, runs it so for each backend.) The argument is an expression
//! evaluating to a future of `Arc<dyn Kv>`. It is evaluated once per case, inside that case's tokio runtime (multi-threaded, two workers), so it may
//! start a server or connect to one shared by all cases (e.g. through a `OnceLock` holding
//! the server process; make a fresh client per case since each case has its own runtime).
//! The macro expands to one `#[tokio::test]` per case, named after it, in the module where
//! it is invoked. Through [`run_case`], compaction cases run alone and every other case
//! concurrently, so that compacting a shared server cannot break another case's watch from
//! a recent revision within the same test binary (call the cases through [`run_case`] too
//! if you instantiate them by hand on a shared server).
//!
//! # What it covers
//!
//! Reads ([`reads`]): metadata, revisions, prefix ranges with count, limit, ordering,
//! creation-revision filter and keys-only. Preconditions ([`preconditions`]): create-if-absent
//! (and its race), swap on a stale revision, conditional deletes, the counted create. Writes ([`writes`]): prefix
//! delete as one write, re-creation, 1 MiB and binary data, the native increment. Leases
//! ([`leases`]): expiry with delete events, keep-alive (of one lease, and batched with each
//! lease answered alone), revoke, dead leases, unbinding.
//! Watches ([`watch`](mod@watch)): exact replay from a past revision, key and prefix scopes, event
//! contents, 1,000 events without gaps. Compaction ([`compaction`]). Contention ([`stress`]):
//! 50 compare-and-swap incrementers, native increments, concurrent writers.

pub mod compaction;
pub mod leases;
pub mod logs;
pub mod ports;
pub mod preconditions;
pub mod reads;
pub mod rendezvous;
pub mod stress;
pub mod watch;
pub mod writes;

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;

use crate::error::KvError;
use crate::kv::{Event, Kv, KvResult, PutOptions, PutOutcome, Revision, WatchScope, WatchStream};

/// The longest any single wait of a case may take before the case fails.
pub const WAIT: Duration = Duration::from_secs(15);

/// The longest a whole case may take (the macro enforces it).
pub const CASE_DEADLINE: Duration = Duration::from_secs(120);

/// A fresh namespace for one case: `rdzv-conformance/<case>/<counter>-<random>/`.
pub fn namespace(case: &str) -> Vec<u8> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(n);
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("rdzv-conformance/{case}/{n}-{:016x}/", hasher.finish()).into_bytes()
}

/// The cases that compact the store, which must not run while another case watches.
pub const EXCLUSIVE_CASES: &[&str] =
    &["watch_from_compacted_revision_fails", "compaction_keeps_current_state"];

/// Runs one case: builds the backend, picks a fresh namespace, and runs the case under the
/// suite's lock (exclusive for [`EXCLUSIVE_CASES`], shared otherwise), all within
/// [`CASE_DEADLINE`]. Panics if the case fails or overruns.
pub async fn run_case<B, C, F>(name: &'static str, backend: B, case: C)
where
    B: Future<Output = Arc<dyn Kv>>,
    C: FnOnce(Arc<dyn Kv>, Vec<u8>) -> F,
    F: Future<Output = ()>,
{
    static LOCK: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
    let run = async {
        let kv = backend.await;
        let ns = namespace(name);
        if EXCLUSIVE_CASES.contains(&name) {
            let _alone = LOCK.write().await;
            case(kv, ns).await;
        } else {
            let _shared = LOCK.read().await;
            case(kv, ns).await;
        }
    };
    if tokio::time::timeout(CASE_DEADLINE, run).await.is_err() {
        panic!("conformance case `{name}` did not finish within {CASE_DEADLINE:?}");
    }
}

/// `ns` followed by `suffix`.
pub(crate) fn key(ns: &[u8], suffix: &str) -> Vec<u8> {
    let mut key = ns.to_vec();
    key.extend_from_slice(suffix.as_bytes());
    key
}

/// The TTL lease cases use: the backend's minimum, but at least two seconds so that
/// scheduling noise on a loaded machine cannot decide a case.
pub(crate) fn lease_ttl(kv: &dyn Kv) -> Duration {
    kv.capabilities().min_lease_ttl.max(Duration::from_secs(2))
}

/// Awaits `future` for at most [`WAIT`], failing the case with `what` otherwise.
pub(crate) async fn within<F: Future>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(WAIT, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {WAIT:?} {what}"),
    }
}

/// An unconditional put that must succeed; returns its revision.
pub(crate) async fn put(kv: &dyn Kv, key: &[u8], value: &[u8]) -> Revision {
    put_with(kv, key, value, PutOptions::OVERWRITE).await
}

/// A put that must be written; returns its revision.
pub(crate) async fn put_with(kv: &dyn Kv, key: &[u8], value: &[u8], options: PutOptions) -> Revision {
    match within("putting a key", kv.put(key, value, options)).await {
        Ok(PutOutcome::Written { revision, .. }) => revision,
        other => panic!("put of `{}` with {options:?} was not written: {other:?}", show_key(key)),
    }
}

/// Opens a watch that must succeed.
pub(crate) async fn watch(kv: &dyn Kv, key: &[u8], scope: WatchScope, start: Revision) -> WatchStream {
    within("opening a watch", kv.watch(key, scope, start))
        .await
        .unwrap_or_else(|e| panic!("watch of `{}` from {start} failed: {e}", show_key(key)))
}

/// The next event of a watch, which must arrive within [`WAIT`].
pub(crate) async fn next_event(events: &mut WatchStream, what: &str) -> Event {
    next_event_within(events, WAIT, what).await
}

/// The next event of a watch, which must arrive within `limit`.
pub(crate) async fn next_event_within(events: &mut WatchStream, limit: Duration, what: &str) -> Event {
    match tokio::time::timeout(limit, events.next()).await {
        Err(_) => panic!("timed out after {limit:?} {what}"),
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("watch failed {what}: {e}"),
        Ok(None) => panic!("watch ended {what}"),
    }
}

/// `n` events of a watch.
pub(crate) async fn next_events(events: &mut WatchStream, n: usize, what: &str) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        out.push(next_event(events, &format!("{what} (event {} of {n})", out.len() + 1)).await);
    }
    out
}

/// Asserts that the first thing a watch yields (or its opening) is an error matching `check`,
/// and that the stream then ends.
pub(crate) async fn expect_watch_error(
    opened: KvResult<WatchStream>,
    what: &str,
    check: impl Fn(&KvError) -> bool,
) {
    let mut events = match opened {
        Err(e) => {
            assert!(check(&e), "{what}: unexpected error {e:?}");
            return;
        }
        Ok(events) => events,
    };
    match within(what, events.next()).await {
        Some(Err(e)) => assert!(check(&e), "{what}: unexpected error {e:?}"),
        other => panic!("{what}: expected an error, got {other:?}"),
    }
    match within(&format!("{what}: waiting for the stream to end"), events.next()).await {
        None => {}
        Some(item) => panic!("{what}: the stream went on after its error with {item:?}"),
    }
}

/// Asserts that no event arrives within `quiet`.
pub(crate) async fn expect_no_event(events: &mut WatchStream, quiet: Duration, what: &str) {
    if let Ok(item) = tokio::time::timeout(quiet, events.next()).await {
        panic!("{what}: unexpected watch item {item:?}");
    }
}

pub(crate) use crate::ext::show_key;

/// Expands to one `#[tokio::test]` per conformance case, each on a fresh namespace, with
/// the backend built by `$builder` (an expression evaluating to a future of
/// `Arc<dyn Kv>`). See [`testing`](crate::testing).
#[macro_export]
macro_rules! conformance_suite {
    ($builder:expr) => {
        $crate::conformance_suite!(@cases $builder;
            reads: get_missing_key_returns_store_revision,
                put_then_get_round_trips_metadata,
                revisions_strictly_increase,
                reads_return_the_store_revision,
                range_matches_only_the_prefix,
                range_counts_all_and_limits,
                range_orders_by_key_or_create_revision,
                range_filters_by_max_create_revision,
                count_at_revision_reads_the_past,
                range_keys_only_drops_values;
            preconditions: create_if_absent_conflict_returns_current,
                create_if_absent_race_has_one_winner,
                create_counted_tallies_each_creation,
                swap_on_stale_revision_returns_winner,
                update_of_missing_key_conflicts_with_none,
                delete_of_missing_key_is_missing,
                delete_on_stale_revision_returns_current,
                delete_on_current_revision_deletes,
                delete_on_revision_of_missing_key_conflicts_with_none;
            writes: delete_prefix_is_one_write,
                delete_prefix_rejects_empty_prefix,
                delete_prefix_limited_deletes_the_first_keys,
                recreated_key_starts_a_new_incarnation,
                large_values_round_trip,
                binary_keys_and_values_round_trip,
                increment_matches_compare_and_swap;
            leases: lease_expiry_deletes_keys_with_events,
                keep_alive_prolongs_lease,
                keep_alive_many_answers_each_lease_alone,
                revoke_deletes_at_once,
                put_with_dead_lease_fails,
                keep_alive_of_dead_lease_fails,
                overwrite_without_lease_detaches_key;
            watch: watch_replays_exactly_from_past_revision,
                watch_of_key_sees_only_that_key,
                prefix_watch_sees_only_its_prefix,
                watch_events_carry_metadata,
                dropped_watch_leaves_others_running,
                watch_survives_many_events_without_gaps;
            compaction: watch_from_compacted_revision_fails,
                compaction_keeps_current_state;
            stress: concurrent_cas_incrementers_lose_no_update,
                concurrent_native_increments_lose_no_update,
                concurrent_writers_get_distinct_revisions;
        );
    };
    (@cases $builder:expr; $($module:ident: $($case:ident),+;)*) => {
        $($(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testing::run_case(stringify!($case), $builder, $crate::testing::$module::$case).await;
            }
        )+)*
    };
}
