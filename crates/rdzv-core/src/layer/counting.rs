//! [`CountingKv`]: a wrapper that counts the operations a caller makes, so that tests can
//! assert how many reads and writes a protocol step costs.

use std::ops::{Add, Sub};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::Layer;
use crate::kv::{
    CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, Kv, KvResult, LeaseId,
    PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};

/// Counts of the operations made through a [`CountingKv`], by kind. Every call counts,
/// whether it succeeded or not, except `increments`, which counts only the increments that
/// wrote (one that failed or was declined wrote nothing, and the caller's compare-and-swap
/// is counted as gets and puts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// [`Kv::get`] calls.
    pub gets: u64,
    /// [`Kv::range`] calls.
    pub ranges: u64,
    /// [`Kv::put`] calls.
    pub puts: u64,
    /// [`Kv::delete`] calls.
    pub deletes: u64,
    /// [`Kv::delete_prefix`] calls.
    pub delete_prefixes: u64,
    /// [`Kv::lease_grant`] calls.
    pub lease_grants: u64,
    /// [`Kv::lease_keep_alive`] calls.
    pub lease_keep_alives: u64,
    /// [`Kv::lease_revoke`] calls.
    pub lease_revokes: u64,
    /// [`Kv::watch`] calls (watches opened).
    pub watches: u64,
    /// [`Kv::compact`] calls.
    pub compactions: u64,
    /// Native [`Kv::increment`]s (calls that returned `Ok(Some(_))`).
    pub increments: u64,
    /// [`Kv::create_counted`] calls (where supported).
    pub counted_creates: u64,
    /// Keys the server had to visit to answer the reads: one per key a get found, the
    /// matches of a range (before its limit, as a count-only range visits them too), the
    /// keys a count at a past revision counted. The server's share of the work that grows
    /// with N, where the number of calls does not.
    pub keys_visited: u64,
}

impl OpCounts {
    /// Writes: puts, deletes, prefix deletes, lease grants and revokes, native increments,
    /// counted creates.
    pub fn writes(&self) -> u64 {
        self.puts
            + self.counted_creates
            + self.deletes
            + self.delete_prefixes
            + self.lease_grants
            + self.lease_revokes
            + self.increments
    }

    /// Reads: gets and ranges.
    pub fn reads(&self) -> u64 {
        self.gets + self.ranges
    }

    /// Every counted operation.
    pub fn total(&self) -> u64 {
        self.writes() + self.reads() + self.lease_keep_alives + self.watches + self.compactions
    }
}

impl Add for OpCounts {
    type Output = OpCounts;

    /// The operations of two counts together (of several clients, say).
    fn add(self, rhs: OpCounts) -> OpCounts {
        OpCounts {
            gets: self.gets + rhs.gets,
            ranges: self.ranges + rhs.ranges,
            puts: self.puts + rhs.puts,
            deletes: self.deletes + rhs.deletes,
            delete_prefixes: self.delete_prefixes + rhs.delete_prefixes,
            lease_grants: self.lease_grants + rhs.lease_grants,
            lease_keep_alives: self.lease_keep_alives + rhs.lease_keep_alives,
            lease_revokes: self.lease_revokes + rhs.lease_revokes,
            watches: self.watches + rhs.watches,
            compactions: self.compactions + rhs.compactions,
            increments: self.increments + rhs.increments,
            counted_creates: self.counted_creates + rhs.counted_creates,
            keys_visited: self.keys_visited + rhs.keys_visited,
        }
    }
}

impl Sub for OpCounts {
    type Output = OpCounts;

    /// The operations made between two snapshots (`later - earlier`; saturating at 0).
    fn sub(self, rhs: OpCounts) -> OpCounts {
        OpCounts {
            gets: self.gets.saturating_sub(rhs.gets),
            ranges: self.ranges.saturating_sub(rhs.ranges),
            puts: self.puts.saturating_sub(rhs.puts),
            deletes: self.deletes.saturating_sub(rhs.deletes),
            delete_prefixes: self.delete_prefixes.saturating_sub(rhs.delete_prefixes),
            lease_grants: self.lease_grants.saturating_sub(rhs.lease_grants),
            lease_keep_alives: self.lease_keep_alives.saturating_sub(rhs.lease_keep_alives),
            lease_revokes: self.lease_revokes.saturating_sub(rhs.lease_revokes),
            watches: self.watches.saturating_sub(rhs.watches),
            compactions: self.compactions.saturating_sub(rhs.compactions),
            increments: self.increments.saturating_sub(rhs.increments),
            counted_creates: self.counted_creates.saturating_sub(rhs.counted_creates),
            keys_visited: self.keys_visited.saturating_sub(rhs.keys_visited),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    gets: AtomicU64,
    ranges: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    delete_prefixes: AtomicU64,
    lease_grants: AtomicU64,
    lease_keep_alives: AtomicU64,
    lease_revokes: AtomicU64,
    watches: AtomicU64,
    compactions: AtomicU64,
    increments: AtomicU64,
    counted_creates: AtomicU64,
    keys_visited: AtomicU64,
}

/// Wraps any backend and counts every operation by kind; otherwise transparent.
///
/// ```
/// # use std::sync::Arc;
/// # use rdzv_core::Kv;
/// # use rdzv_core::layer::CountingKv;
/// # async fn demo(backend: Arc<dyn Kv>) -> Result<(), rdzv_core::KvError> {
/// let kv = CountingKv::new(backend);
/// let before = kv.snapshot();
/// kv.get(b"key").await?;
/// assert_eq!((kv.snapshot() - before).reads(), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct CountingKv {
    inner: Arc<dyn Kv>,
    counters: Counters,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl CountingKv {
    /// Wraps `inner` with all counts at zero.
    pub fn new(inner: Arc<dyn Kv>) -> Arc<CountingKv> {
        Arc::new(CountingKv { inner, counters: Counters::default() })
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Kv> {
        &self.inner
    }

    /// The counts so far. Each counter is read atomically, the set as a whole is not: take
    /// snapshots while no operation is in flight for exact differences.
    pub fn snapshot(&self) -> OpCounts {
        let c = &self.counters;
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OpCounts {
            gets: read(&c.gets),
            ranges: read(&c.ranges),
            puts: read(&c.puts),
            deletes: read(&c.deletes),
            delete_prefixes: read(&c.delete_prefixes),
            lease_grants: read(&c.lease_grants),
            lease_keep_alives: read(&c.lease_keep_alives),
            lease_revokes: read(&c.lease_revokes),
            watches: read(&c.watches),
            compactions: read(&c.compactions),
            increments: read(&c.increments),
            counted_creates: read(&c.counted_creates),
            keys_visited: read(&c.keys_visited),
        }
    }

    /// Sets every count back to zero.
    pub fn reset(&self) {
        let c = &self.counters;
        for counter in [
            &c.gets,
            &c.ranges,
            &c.puts,
            &c.deletes,
            &c.delete_prefixes,
            &c.lease_grants,
            &c.lease_keep_alives,
            &c.lease_revokes,
            &c.watches,
            &c.compactions,
            &c.increments,
            &c.counted_creates,
            &c.keys_visited,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl Layer for CountingKv {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        bump(&self.counters.gets);
        let result = self.inner.get(key).await;
        if let Ok(GetResponse { kv: Some(_), .. }) = &result {
            bump(&self.counters.keys_visited);
        }
        result
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        bump(&self.counters.ranges);
        let result = self.inner.range(prefix, options).await;
        if let Ok(response) = &result {
            self.counters.keys_visited.fetch_add(response.count, Ordering::Relaxed);
        }
        result
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        bump(&self.counters.puts);
        self.inner.put(key, value, options).await
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        bump(&self.counters.deletes);
        self.inner.delete(key, mode).await
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        bump(&self.counters.delete_prefixes);
        self.inner.delete_prefix(prefix).await
    }

    /// Counted as a prefix delete.
    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        bump(&self.counters.delete_prefixes);
        self.inner.delete_prefix_limited(prefix, limit).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        bump(&self.counters.lease_grants);
        self.inner.lease_grant(ttl).await
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        bump(&self.counters.lease_keep_alives);
        self.inner.lease_keep_alive(lease).await
    }

    /// Counted as one keep-alive per lease.
    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        self.counters.lease_keep_alives.fetch_add(leases.len() as u64, Ordering::Relaxed);
        self.inner.lease_keep_alive_many(leases).await
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        bump(&self.counters.lease_revokes);
        self.inner.lease_revoke(lease).await
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        bump(&self.counters.watches);
        self.inner.watch(key, scope, start_revision).await
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        bump(&self.counters.compactions);
        self.inner.compact(revision).await
    }

    /// Counted as a range read (when supported).
    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        let result = self.inner.count_at_revision(prefix, revision).await;
        if !matches!(result, Err(crate::KvError::Unsupported { .. })) {
            bump(&self.counters.ranges);
        }
        if let Ok(count) = &result {
            self.counters.keys_visited.fetch_add(*count, Ordering::Relaxed);
        }
        result
    }

    /// Counted when supported.
    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        let result = self.inner.create_counted(key, value, lease, tally, tally_lease).await;
        if !matches!(result, Err(crate::KvError::Unsupported { .. })) {
            bump(&self.counters.counted_creates);
        }
        result
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        let result = self.inner.increment(key, delta).await;
        if matches!(result, Ok(Some(_))) {
            bump(&self.counters.increments);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    // Not `super::*`: with `Layer` in scope too, calls on a `CountingKv` are ambiguous.
    use super::{Arc, CountingKv, Duration, OpCounts};
    use crate::kv::{DeleteMode, Kv, PutMode, PutOptions, RangeOptions, WatchScope};
    use crate::stub::Stub;
    use futures::StreamExt;

    #[tokio::test]
    async fn counts_each_kind_and_diffs() {
        let kv = CountingKv::new(Arc::new(Stub::default()));
        let start = kv.snapshot();
        assert_eq!(start, OpCounts::default());
        kv.get(b"a").await.unwrap();
        kv.range(b"a", RangeOptions::default()).await.unwrap();
        kv.range(b"a", RangeOptions::default()).await.unwrap();
        kv.put(b"a", b"1", PutOptions::new(PutMode::Create)).await.unwrap();
        kv.delete(b"a", DeleteMode::Any).await.unwrap();
        kv.delete_prefix(b"a").await.unwrap();
        let lease = kv.lease_grant(Duration::from_secs(1)).await.unwrap();
        kv.lease_keep_alive(lease).await.unwrap();
        kv.lease_revoke(lease).await.unwrap();
        let mut events = kv.watch(b"a", WatchScope::Key, 1).await.unwrap();
        assert!(events.next().await.is_some());
        assert!(kv.compact(1).await.is_err());
        assert!(kv.increment(b"n", 1).await.is_err(), "the stub has no native increment");

        let diff = kv.snapshot() - start;
        assert_eq!(
            diff,
            OpCounts {
                gets: 1,
                ranges: 2,
                puts: 1,
                deletes: 1,
                delete_prefixes: 1,
                lease_grants: 1,
                lease_keep_alives: 1,
                lease_revokes: 1,
                watches: 1,
                compactions: 1,
                increments: 0,
                counted_creates: 0,
                keys_visited: 0,
            }
        );
        assert_eq!(diff.reads(), 3);
        assert_eq!(diff.writes(), 5);
        assert_eq!(diff.total(), 11);

        let middle = kv.snapshot();
        kv.get(b"b").await.unwrap();
        assert_eq!((kv.snapshot() - middle).gets, 1);
        assert_eq!((middle - kv.snapshot()).gets, 0, "saturates instead of underflowing");

        kv.reset();
        assert_eq!(kv.snapshot(), OpCounts::default());
        assert_eq!(kv.name(), "stub");
    }
}
