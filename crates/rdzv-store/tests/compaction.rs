//! The Store test suite on a backend whose every other watch starts from a compacted
//! revision, so that each blocking call goes through its re-read-and-re-watch path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rdzv_core::{
    Capabilities, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, Kv, KvError, KvResult,
    LeaseId, PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};
use rdzv_mem::MemKv;

/// [`MemKv`], except that odd-numbered watches fail at once with [`KvError::Compacted`].
#[derive(Debug, Default)]
struct CompactingKv {
    inner: MemKv,
    watches: AtomicU64,
}

#[async_trait]
impl Kv for CompactingKv {
    fn name(&self) -> &'static str {
        "compacting-mem"
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
        if self.watches.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            let compacted = KvError::Compacted { requested: start_revision, oldest: start_revision + 1 };
            return Ok(Box::pin(futures::stream::iter([Err(compacted)])));
        }
        self.inner.watch(key, scope, start_revision).await
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        self.inner.compact(revision).await
    }
}

rdzv_store::store_suite!(async { Arc::new(CompactingKv::default()) as Arc<dyn Kv> });
