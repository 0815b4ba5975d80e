//! [`MeteredKv`]: a layer that counts each backend operation by kind and result and times it,
//! into a [`Metrics`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::Layer;
use crate::kv::{
    DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, Kv, KvResult, LeaseId, PutOptions,
    PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};
use crate::metrics::{Metrics, Op, OperationMetrics};

/// Wraps any backend and records each operation in `rdzv_backend_operations_total{op,
/// result}` and `rdzv_backend_operation_duration_seconds{op}`; otherwise transparent. A watch
/// is timed until it is open; a batch of lease refreshes is one `lease_keep_alive`, failed if
/// any of its leases failed. Made by [`Metrics::instrument`].
///
/// The metrics of each kind are looked up once, when the layer is made: an operation costs
/// two clock reads, a histogram observation and an atomic increment.
#[derive(Debug)]
pub struct MeteredKv {
    inner: Arc<dyn Kv>,
    ops: Vec<OperationMetrics>,
}

impl MeteredKv {
    /// `inner`, recording into `metrics`.
    pub fn new(inner: Arc<dyn Kv>, metrics: &Metrics) -> MeteredKv {
        let ops = Op::ALL.iter().map(|&op| metrics.operation(op)).collect();
        MeteredKv { inner, ops }
    }

    fn record(&self, op: Op, started: Instant, ok: bool) {
        let metrics = &self.ops[op as usize];
        metrics.duration.observe(started.elapsed().as_secs_f64());
        if ok {
            metrics.ok.inc();
        } else {
            metrics.error.inc();
        }
    }

    async fn timed<T>(&self, op: Op, call: impl Future<Output = KvResult<T>>) -> KvResult<T> {
        let started = Instant::now();
        let result = call.await;
        self.record(op, started, result.is_ok());
        result
    }
}

#[async_trait]
impl Layer for MeteredKv {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        self.timed(Op::Get, self.inner.get(key)).await
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        self.timed(Op::Range, self.inner.range(prefix, options)).await
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        self.timed(Op::Put, self.inner.put(key, value, options)).await
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        self.timed(Op::Delete, self.inner.delete(key, mode)).await
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        self.timed(Op::DeletePrefix, self.inner.delete_prefix(prefix)).await
    }

    /// Timed as a prefix delete.
    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        self.timed(Op::DeletePrefix, self.inner.delete_prefix_limited(prefix, limit)).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        self.timed(Op::LeaseGrant, self.inner.lease_grant(ttl)).await
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        self.timed(Op::LeaseKeepAlive, self.inner.lease_keep_alive(lease)).await
    }

    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        let started = Instant::now();
        let answers = self.inner.lease_keep_alive_many(leases).await;
        self.record(Op::LeaseKeepAlive, started, answers.iter().all(Result::is_ok));
        answers
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        self.timed(Op::LeaseRevoke, self.inner.lease_revoke(lease)).await
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        self.timed(Op::Watch, self.inner.watch(key, scope, start_revision)).await
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        self.timed(Op::Compact, self.inner.compact(revision)).await
    }

    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        self.timed(Op::CountAtRevision, self.inner.count_at_revision(prefix, revision)).await
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        self.timed(Op::Increment, self.inner.increment(key, delta)).await
    }
}
