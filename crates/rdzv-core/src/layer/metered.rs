//! [`MeteredKv`]: a layer that counts each backend operation by kind and result and times it,
//! into a [`Metrics`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::{Answer, Decorator, Request};
use crate::kv::{Kv, KvResult, Op};
use crate::metrics::{Metrics, OperationMetrics};

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
        // Indexed by `op as usize`: `Op::ALL` is in declaration order.
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
}

impl Decorator for MeteredKv {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn around<T: Answer>(
        &self,
        request: Request,
        call: impl Future<Output = KvResult<T>> + Send,
    ) -> KvResult<T> {
        let started = Instant::now();
        let result = call.await;
        let ok = result.as_ref().is_ok_and(|answer| !answer.partly_failed());
        self.record(request.op, started, ok);
        result
    }
}
