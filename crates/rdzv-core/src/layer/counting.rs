//! [`CountingKv`]: a wrapper that counts the operations a caller makes, so that tests can
//! assert how many reads and writes a protocol step costs.

use std::ops::{Add, Sub};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::future::Future;

use super::{Answer, Decorator, Request};
use crate::error::KvError;
use crate::kv::{Kv, KvResult, Op};

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

impl Counters {
    /// The counter of `op`'s calls (both kinds of prefix delete are prefix deletes, a count at
    /// a past revision is a range read).
    fn of(&self, op: Op) -> &AtomicU64 {
        match op {
            Op::Get => &self.gets,
            Op::Range | Op::CountAtRevision => &self.ranges,
            Op::Put => &self.puts,
            Op::Delete => &self.deletes,
            Op::DeletePrefix | Op::DeletePrefixLimited => &self.delete_prefixes,
            Op::LeaseGrant => &self.lease_grants,
            Op::LeaseKeepAlive | Op::LeaseKeepAliveMany => &self.lease_keep_alives,
            Op::LeaseRevoke => &self.lease_revokes,
            Op::Watch => &self.watches,
            Op::Compact => &self.compactions,
            Op::CreateCounted => &self.counted_creates,
            Op::Increment => &self.increments,
        }
    }

    /// Counts a call and what it answered: `request.count` calls (one per lease of a batch of
    /// refreshes) — none for a call the backend does not support ([`KvError::Unsupported`],
    /// or an increment it declined) — and the keys its answer visited.
    fn record<T: Answer>(&self, request: Request, result: &KvResult<T>) {
        let unsupported = match result {
            // Only an increment that wrote counts: the caller's compare-and-swap otherwise.
            Err(_) if request.op == Op::Increment => true,
            Err(KvError::Unsupported { .. }) => matches!(request.op, Op::CountAtRevision | Op::CreateCounted),
            Err(_) => false,
            Ok(answer) => answer.declined(),
        };
        if !unsupported {
            self.of(request.op).fetch_add(request.count, Ordering::Relaxed);
        }
        if let Ok(answer) = result {
            self.keys_visited.fetch_add(answer.keys_visited(), Ordering::Relaxed);
        }
    }
}

impl Decorator for CountingKv {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn around<T: Answer>(
        &self,
        request: Request,
        call: impl Future<Output = KvResult<T>> + Send,
    ) -> KvResult<T> {
        let result = call.await;
        self.counters.record(request, &result);
        result
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    // Not `super::*`: with `Decorator` in scope too, calls on a `CountingKv` are ambiguous.
    use std::time::Duration;

    use super::{Arc, CountingKv, OpCounts};
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
