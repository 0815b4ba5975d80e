//! A [`MemKv`] wrapper with optional quirks, to drive the Store through code paths that a
//! plain `MemKv` never takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rdzv_core::KvExt;
use rdzv_core::{
    Capabilities, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, Kv, KvError, KvResult,
    LeaseId, PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};
use rdzv_mem::MemKv;

/// [`MemKv`] with quirks.
#[derive(Debug, Default)]
pub struct QuirkyKv {
    inner: MemKv,
    watches: AtomicU64,
    compact_every_other_watch: bool,
    native_increment: bool,
}

impl QuirkyKv {
    /// With `compact_every_other_watch`, every other watch (the first included) fails at
    /// once with [`KvError::Compacted`]. With `native_increment`, `increment` is "native" (as
    /// on Redis) and rejects a non-integer value with [`KvError::InvalidArgument`].
    pub fn new(compact_every_other_watch: bool, native_increment: bool) -> QuirkyKv {
        QuirkyKv { compact_every_other_watch, native_increment, ..QuirkyKv::default() }
    }
}

#[async_trait]
impl Kv for QuirkyKv {
    fn name(&self) -> &'static str {
        "quirky-mem"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        self.inner.get(key).await
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        self.inner.range(prefix, options).await
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        self.inner.put(key, value, options).await
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        self.inner.delete(key, mode).await
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        self.inner.delete_prefix(prefix).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        self.inner.lease_grant(ttl).await
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        self.inner.lease_keep_alive(lease).await
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        self.inner.lease_revoke(lease).await
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        if self.compact_every_other_watch && self.watches.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            let compacted = KvError::Compacted { requested: start_revision, oldest: start_revision + 1 };
            return Ok(Box::pin(futures::stream::iter([Err(compacted)])));
        }
        self.inner.watch(key, scope, start_revision).await
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        self.inner.compact(revision).await
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        if !self.native_increment {
            return Ok(None);
        }
        let mut verdict = Ok(0);
        self.inner
            .compare_and_swap(key, PutOptions::OVERWRITE, |current| {
                let now = match current {
                    None => Some(0),
                    Some(kv) => std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse::<i64>().ok()),
                };
                verdict = match now.and_then(|n| n.checked_add(delta)) {
                    Some(next) => Ok(next),
                    None => Err(KvError::InvalidArgument("value is not an integer or out of range".into())),
                };
                verdict.as_ref().ok().map(|n| n.to_string().into_bytes())
            })
            .await?;
        verdict.map(Some)
    }
}
