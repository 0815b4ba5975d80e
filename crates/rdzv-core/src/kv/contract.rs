//! The [`Kv`] trait itself (re-exported at the crate root as `rdzv_core::Kv`), with its
//! result and watch-stream types; the values it takes and returns are in `types.rs`.

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;

use crate::error::KvError;

use super::types::{
    Capabilities, CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, Event, GetResponse,
    LeaseId, PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope,
};

/// Result of a backend operation.
pub type KvResult<T> = Result<T, KvError>;

/// A stream of watch events, in revision order, with no gap and no duplicate. It ends with
/// `Err(KvError::Compacted { .. })` if the start revision is no longer available, and with
/// another error if the backend can neither deliver nor resume; dropping it cancels the
/// watch.
pub type WatchStream = Pin<Box<dyn Stream<Item = KvResult<Event>> + Send + 'static>>;

/// A compare-and-swap / watch / lease key-value store with etcd v3 semantics (see docs/KV.md).
///
/// Contract shared by every method:
/// - Every write (put, delete, a lease's expiry or revoke deleting its keys) gets a new
///   store-wide [`Revision`], strictly greater than every earlier one. Several keys deleted by
///   one lease ending may share one revision.
/// - A failed precondition is an *outcome* ([`PutOutcome::Conflict`],
///   [`DeleteOutcome::Conflict`]) carrying the current key, never an error.
/// - Errors are [`KvError`]s; [`KvError::is_retryable`] says which may be retried.
/// - Keys and values are arbitrary bytes.
#[async_trait]
pub trait Kv: Send + Sync + std::fmt::Debug + 'static {
    /// Short name of the backend (`"etcd"`, `"redis"`, `"mem"`), for errors and logs.
    fn name(&self) -> &'static str;

    /// What this backend can and cannot do.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Reads one key, and the store revision the read saw.
    async fn get(&self, key: &[u8]) -> KvResult<GetResponse>;

    /// Reads the keys that start with `prefix` (an empty prefix means every key), filtered,
    /// ordered and limited by `options`; `count` is the number of matches before `limit`.
    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse>;

    /// Writes `value` under `key` if `options.mode` holds, bound to `options.lease`.
    /// Writing with a lease that does not exist (expired, revoked) is
    /// [`KvError::LeaseNotFound`].
    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome>;

    /// Deletes `key` if `mode` holds.
    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome>;

    /// Deletes every key that starts with `prefix` (must not be empty), as one write.
    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse>;

    /// Deletes one piece of what starts with `prefix` (must not be empty), as one write: the
    /// first `limit` keys in key order (all of them if fewer), so that a prefix of thousands
    /// of keys can be deleted a bounded write at a time (on etcd, one delete of thousands of
    /// keys stalls every request behind it for seconds). Keys written under the prefix while
    /// the piece is deleted may be deleted with it if they sort before its last key.
    /// `deleted` says how many went; 0 means none was left. A piece may delete fewer than
    /// `limit` while keys remain (on etcd the piece is listed first, then deleted up to its
    /// last listed key: a listed key that expired meanwhile is not counted), so a caller that
    /// must empty the prefix repeats until a piece deletes nothing. A `limit` of 0 is
    /// [`KvError::InvalidArgument`].
    ///
    /// The default deletes the whole prefix ([`Kv::delete_prefix`]): for a backend that has
    /// no cheaper way, and for which one large write costs no more than many small ones.
    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        super::check_delete_piece(prefix, limit)?;
        self.delete_prefix(prefix).await
    }

    /// Grants a lease of `ttl` (rounded up to the backend's granularity). Unless kept alive,
    /// it expires `ttl` after the grant by the *server's* clock, deleting its keys.
    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId>;

    /// Refreshes the lease to its full TTL and returns that TTL.
    /// [`KvError::LeaseNotFound`] if it already expired or was revoked.
    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration>;

    /// Refreshes each of `leases` as [`Kv::lease_keep_alive`] does, in as few round trips
    /// as the backend allows: one result per lease, in the order given. A lease that is gone
    /// is [`KvError::LeaseNotFound`] in its own slot; an error that stopped the whole batch
    /// (the server out of reach) is repeated in every slot. [`Session`](crate::Session)s
    /// refresh through this, all the leases of one client that are due together in one call.
    ///
    /// The default refreshes them concurrently, one [`Kv::lease_keep_alive`] each, with at
    /// most 64 in flight.
    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        use futures::StreamExt;
        let mut refreshes = Vec::with_capacity(leases.len());
        for &lease in leases {
            refreshes.push(self.lease_keep_alive(lease));
        }
        futures::stream::iter(refreshes).buffered(64).collect().await
    }

    /// Ends the lease now: its keys are deleted at once, with delete events.
    /// Revoking a lease that no longer exists is [`KvError::LeaseNotFound`].
    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()>;

    /// Streams the events of `key` (or of every key under it, with
    /// [`WatchScope::Prefix`]) from `start_revision` inclusive (0 counts as 1: from the
    /// beginning). If that revision was compacted away, the watch fails (from this call or
    /// as the stream's first item) with [`KvError::Compacted`]. Events of one write arrive
    /// together; a broken connection is resumed from the last delivered revision + 1, or
    /// ends the stream with an error.
    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream>;

    /// Discards history before `revision`, so that a watch from an older revision fails
    /// with [`KvError::Compacted`]. A test and maintenance hook;
    /// [`KvError::Unsupported`] where the backend cannot.
    async fn compact(&self, revision: Revision) -> KvResult<()> {
        let _ = revision;
        Err(KvError::Unsupported { backend: self.name(), what: "compaction" })
    }

    /// Counts the keys under `prefix` as they were at `revision` (a read of the past), for a
    /// backend that keeps versioned data and can count it without reading the keys: the
    /// ones whose [`Capabilities::count_at_revision`] is set. [`KvError::Compacted`] if that
    /// revision is gone; [`KvError::Unsupported`] (the default) where the backend cannot,
    /// and callers count with [`Kv::range`]'s creation-revision filter instead.
    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        let _ = (prefix, revision);
        Err(KvError::Unsupported { backend: self.name(), what: "counting at a past revision" })
    }

    /// Creates `key` with `value` bound to `lease` if it is absent (as a put with
    /// [`PutMode::Create`](crate::kv::PutMode::Create)) and, in the same atomic step, counts that creation in the tally
    /// kept under `tally` (a key of its own, bound to `tally_lease`, whose value is the
    /// backend's business): the answer's `tally` is the number of creations counted there so
    /// far, this one included, so that in a burst of creations each gets a distinct number, in
    /// the order of their revisions. A key already there is `Conflict` with that key, and the
    /// tally is not touched. The tally counts creations, not live keys: keys that were deleted
    /// still count. A lease that does not exist is [`KvError::LeaseNotFound`] naming that lease
    /// (`lease` or `tally_lease`), and nothing is written. For a backend whose
    /// [`Capabilities::counted_create`] is set; [`KvError::Unsupported`] (the default) on any
    /// other.
    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        let _ = (key, value, lease, tally, tally_lease);
        Err(KvError::Unsupported { backend: self.name(), what: "counted creates" })
    }

    /// Atomically adds `delta` to the decimal integer stored at `key` (missing = 0) and
    /// returns the sum, on a backend whose [`Capabilities::native_increment`] says it can;
    /// [`KvError::Unsupported`] on any other. `Ok(None)`: declined for this call, nothing was
    /// written (the numbers are beyond what the backend computes exactly): increment with a
    /// compare-and-swap instead. A stored value that is not a decimal integer, or a sum that
    /// overflows, is [`KvError::InvalidArgument`].
    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        let _ = (key, delta);
        Err(KvError::Unsupported { backend: self.name(), what: "native increments" })
    }
}
