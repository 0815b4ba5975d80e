//! Layers: a [`Kv`] that wraps another and passes every call through, except those it
//! changes. [`Layer`] is the one forwarding base, so a decorator overrides only what it
//! changes and can never drop a method (the batched
//! [`lease_keep_alive_many`](Kv::lease_keep_alive_many) included): a method added to [`Kv`]
//! is added to [`Layer`] once, with its forwarding default.
//!
//! Three layers ship here, for production use as much as for tests: [`CountingKv`] counts the
//! operations a caller makes (`rdzv bench` reports them), [`MeteredKv`] counts and times them
//! into [`Metrics`](crate::metrics::Metrics) (`rdzv run --metrics-addr`), and [`FaultyKv`]
//! injects latency, failures and dropped watches (`rdzv demo --faults`, and the fault tests).
//!
//! ```
//! use std::sync::Arc;
//! use rdzv_core::layer::Layer;
//! use rdzv_core::{Kv, KvResult};
//! use rdzv_core::kv::GetResponse;
//!
//! /// Logs every read of one key, and changes nothing else.
//! #[derive(Debug)]
//! struct Spy {
//!     inner: Arc<dyn Kv>,
//! }
//!
//! #[async_trait::async_trait]
//! impl Layer for Spy {
//!     fn inner(&self) -> &dyn Kv {
//!         &*self.inner
//!     }
//!
//!     async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
//!         println!("get {}", rdzv_core::kv::show_key(key));
//!         self.inner.get(key).await
//!     }
//! }
//!
//! let spy: Arc<dyn Kv> = Arc::new(Spy { inner: Arc::new(Nothing) });
//! # #[derive(Debug)] struct Nothing;
//! # #[async_trait::async_trait]
//! # impl Kv for Nothing {
//! #     fn name(&self) -> &'static str { "nothing" }
//! #     async fn get(&self, _: &[u8]) -> KvResult<GetResponse> { Ok(GetResponse { kv: None, revision: 0 }) }
//! #     async fn range(&self, _: &[u8], _: rdzv_core::kv::RangeOptions) -> KvResult<rdzv_core::kv::RangeResponse> { unimplemented!() }
//! #     async fn put(&self, _: &[u8], _: &[u8], _: rdzv_core::kv::PutOptions) -> KvResult<rdzv_core::kv::PutOutcome> { unimplemented!() }
//! #     async fn delete(&self, _: &[u8], _: rdzv_core::kv::DeleteMode) -> KvResult<rdzv_core::kv::DeleteOutcome> { unimplemented!() }
//! #     async fn delete_prefix(&self, _: &[u8]) -> KvResult<rdzv_core::kv::DeletePrefixResponse> { unimplemented!() }
//! #     async fn lease_grant(&self, _: std::time::Duration) -> KvResult<rdzv_core::kv::LeaseId> { unimplemented!() }
//! #     async fn lease_keep_alive(&self, _: rdzv_core::kv::LeaseId) -> KvResult<std::time::Duration> { unimplemented!() }
//! #     async fn lease_revoke(&self, _: rdzv_core::kv::LeaseId) -> KvResult<()> { unimplemented!() }
//! #     async fn watch(&self, _: &[u8], _: rdzv_core::kv::WatchScope, _: rdzv_core::kv::Revision) -> KvResult<rdzv_core::kv::WatchStream> { unimplemented!() }
//! # }
//! assert_eq!(spy.name(), "nothing", "what a layer does not override is the inner backend's");
//! ```

mod counting;
mod faulty;
mod metered;

pub use counting::{CountingKv, OpCounts};
pub use faulty::{FaultyKv, Latency};
pub use metered::MeteredKv;

use std::time::Duration;

use async_trait::async_trait;

use crate::kv::{
    Capabilities, CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, Kv, KvResult,
    LeaseId, PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};

/// A decorator of a [`Kv`]: every method defaults to calling the same method of
/// [`inner`](Layer::inner) with the same arguments; override the ones the layer changes.
/// Every `Layer` is a [`Kv`] (a blanket implementation calls these methods).
///
/// A layer that changes what the backend can do (a native increment it adds, compaction it
/// refuses) overrides [`capabilities`](Layer::capabilities) to say so. Import this trait only
/// where a layer is implemented: where both it and [`Kv`] are in scope, a method called on
/// a concrete layer is ambiguous (call it through `Kv::get(&layer, …)` or a `dyn Kv`).
#[async_trait]
pub trait Layer: Send + Sync + std::fmt::Debug + 'static {
    /// The wrapped backend.
    fn inner(&self) -> &dyn Kv;

    /// [`Kv::name`].
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    /// [`Kv::capabilities`].
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`Kv::get`].
    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        self.inner().get(key).await
    }

    /// [`Kv::range`].
    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        self.inner().range(prefix, options).await
    }

    /// [`Kv::put`].
    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        self.inner().put(key, value, options).await
    }

    /// [`Kv::delete`].
    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        self.inner().delete(key, mode).await
    }

    /// [`Kv::delete_prefix`].
    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        self.inner().delete_prefix(prefix).await
    }

    /// [`Kv::delete_prefix_limited`].
    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        self.inner().delete_prefix_limited(prefix, limit).await
    }

    /// [`Kv::lease_grant`].
    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        self.inner().lease_grant(ttl).await
    }

    /// [`Kv::lease_keep_alive`].
    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        self.inner().lease_keep_alive(lease).await
    }

    /// [`Kv::lease_keep_alive_many`]: the inner backend's batch, not one refresh per lease.
    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        self.inner().lease_keep_alive_many(leases).await
    }

    /// [`Kv::lease_revoke`].
    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        self.inner().lease_revoke(lease).await
    }

    /// [`Kv::watch`].
    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        self.inner().watch(key, scope, start_revision).await
    }

    /// [`Kv::compact`].
    async fn compact(&self, revision: Revision) -> KvResult<()> {
        self.inner().compact(revision).await
    }

    /// [`Kv::count_at_revision`].
    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        self.inner().count_at_revision(prefix, revision).await
    }

    /// [`Kv::create_counted`].
    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        self.inner().create_counted(key, value, lease, tally, tally_lease).await
    }

    /// [`Kv::increment`].
    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        self.inner().increment(key, delta).await
    }
}

#[async_trait]
impl<L: Layer> Kv for L {
    fn name(&self) -> &'static str {
        Layer::name(self)
    }

    fn capabilities(&self) -> Capabilities {
        Layer::capabilities(self)
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        Layer::get(self, key).await
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        Layer::range(self, prefix, options).await
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        Layer::put(self, key, value, options).await
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        Layer::delete(self, key, mode).await
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        Layer::delete_prefix(self, prefix).await
    }

    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        Layer::delete_prefix_limited(self, prefix, limit).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        Layer::lease_grant(self, ttl).await
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        Layer::lease_keep_alive(self, lease).await
    }

    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        Layer::lease_keep_alive_many(self, leases).await
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        Layer::lease_revoke(self, lease).await
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        Layer::watch(self, key, scope, start_revision).await
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        Layer::compact(self, revision).await
    }

    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        Layer::count_at_revision(self, prefix, revision).await
    }

    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        Layer::create_counted(self, key, value, lease, tally, tally_lease).await
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        Layer::increment(self, key, delta).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{CountingKv, FaultyKv};
    use crate::kv::Kv;
    use crate::stub::{Refresh, STUB_TTL, Stub};

    /// Sessions refresh through `lease_keep_alive_many`; a layer in between must hand the
    /// batch to the backend as one call, not split it into one refresh per lease.
    #[tokio::test]
    async fn layers_pass_a_batch_of_refreshes_through_as_one_call() {
        let stub = Arc::new(Stub::default());
        let faulty = FaultyKv::new(stub.clone(), 1);
        let counting = CountingKv::new(faulty.clone());
        let answers = counting.lease_keep_alive_many(&[1, 2, 3]).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(ttl) if *ttl == STUB_TTL)), "{answers:?}");
        assert_eq!(stub.refreshes(), [Refresh::Many(vec![1, 2, 3])]);
        assert_eq!(counting.snapshot().lease_keep_alives, 3, "counted per lease");
        assert_eq!(faulty.calls(), 1, "one call for the batch");

        // An injected failure fails the whole batch, before it reaches the backend.
        faulty.fail_next("lease_keep_alive_many");
        let answers = counting.lease_keep_alive_many(&[1, 2]).await;
        assert!(answers.len() == 2 && answers.iter().all(|a| a.as_ref().is_err_and(|e| e.is_retryable())));
        assert_eq!(stub.refreshes().len(), 1, "{:?}", stub.refreshes());
    }
}
