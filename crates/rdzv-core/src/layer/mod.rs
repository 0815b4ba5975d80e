//! Layers: a [`Kv`] that wraps another — a [`Decorator`] — and passes every call through one
//! hook, [`Decorator::around`]: tower's `Service::call` idea, a decorator is its hook. (The
//! trait is not tower's `Layer`, which makes a service out of another.) Each call
//! reaches the hook as its [`Request`] (which [`Op`], how many it covers) and the wrapped
//! backend's call, not yet started; a method added to [`Kv`] is added to [`Decorator`] once, with
//! its default through the hook. A layer that changes what a watch delivers overrides
//! [`Decorator::events`] too; a test double that must change one call overrides that method.
//!
//! Three layers ship here, for production use as much as for tests: [`CountingKv`] counts the
//! operations a caller makes (`rdzv bench` reports them), [`MeteredKv`] counts and times them
//! into [`Metrics`](crate::metrics::Metrics) (`rdzv run --metrics-addr`), and [`FaultyKv`]
//! injects latency, failures and dropped watches (`rdzv demo --faults`, and the fault tests).
//!
//! ```
//! use std::future::Future;
//! use std::sync::Arc;
//! use rdzv_core::layer::{Answer, Decorator, Request};
//! use rdzv_core::{Kv, KvResult};
//! use rdzv_core::kv::{GetResponse, Op};
//!
//! /// Logs every read, and changes nothing.
//! #[derive(Debug)]
//! struct Spy {
//!     inner: Arc<dyn Kv>,
//! }
//!
//! impl Decorator for Spy {
//!     fn inner(&self) -> &dyn Kv {
//!         &*self.inner
//!     }
//!
//!     async fn around<T: Answer>(&self, request: Request, call: impl Future<Output = KvResult<T>> + Send) -> KvResult<T> {
//!         if request.op == Op::Get {
//!             println!("a get");
//!         }
//!         call.await
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

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use crate::kv::{
    Capabilities, CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, Kv, KvResult,
    LeaseId, Op, PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};

/// One call through a layer, as its hook sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Which call.
    pub op: Op,
    /// How many it covers: the leases of a batch of refreshes ([`Op::LeaseKeepAliveMany`]),
    /// else 1.
    pub count: u64,
}

impl Request {
    /// A call of `op` that covers one.
    pub fn one(op: Op) -> Request {
        Request { op, count: 1 }
    }
}

/// What a call answers, as a layer's hook may read it (everything here has a default: most
/// answers tell nothing more).
pub trait Answer: Send + 'static {
    /// The keys the server visited to answer a read: one for a key a get found, the matches
    /// of a range (before its limit), the keys a count at a past revision counted.
    fn keys_visited(&self) -> u64 {
        0
    }

    /// Whether the backend declined the call and did nothing (an increment it does not do
    /// natively).
    fn declined(&self) -> bool {
        false
    }

    /// Whether part of the call failed (a lease of a batch of refreshes).
    fn partly_failed(&self) -> bool {
        false
    }
}

impl Answer for GetResponse {
    fn keys_visited(&self) -> u64 {
        u64::from(self.kv.is_some())
    }
}

impl Answer for RangeResponse {
    fn keys_visited(&self) -> u64 {
        self.count
    }
}

/// The answer of a count at a past revision: the keys it counted.
impl Answer for u64 {
    fn keys_visited(&self) -> u64 {
        *self
    }
}

/// The answer of an increment: `None` when the backend has no native increment.
impl Answer for Option<i64> {
    fn declined(&self) -> bool {
        self.is_none()
    }
}

impl Answer for PutOutcome {}
impl Answer for DeleteOutcome {}
impl Answer for DeletePrefixResponse {}
impl Answer for LeaseId {}
impl Answer for Duration {}
impl Answer for () {}
impl Answer for WatchStream {}
impl Answer for CountedCreate {}
/// The answer of a batch of refreshes: one per lease.
impl Answer for Vec<KvResult<Duration>> {
    fn partly_failed(&self) -> bool {
        self.iter().any(Result::is_err)
    }
}

/// A decorator of a [`Kv`]: its hook [`around`](Decorator::around) sees every call, and
/// everything else is the wrapped backend's ([`inner`](Decorator::inner)). Every `Decorator` is a
/// [`Kv`] (a blanket implementation calls these methods). Each method defaults to the wrapped
/// backend's call passed through the hook: a decorator implements the hook and nothing else;
/// a test double that must change one call (its arguments, what it does first) overrides that
/// method. A layer that changes what the backend can do (a native increment it adds,
/// compaction it refuses) overrides [`capabilities`](Decorator::capabilities). Import this trait
/// only where a layer is implemented: where both it and [`Kv`] are in scope, a method called
/// on a concrete layer is ambiguous (call it through `Kv::get(&layer, …)` or a `dyn Kv`).
pub trait Decorator: Send + Sync + std::fmt::Debug + 'static {
    /// The wrapped backend.
    fn inner(&self) -> &dyn Kv;

    /// The hook around every call: `call` is the wrapped backend's call of `request.op`, with
    /// the caller's arguments, not yet started; the hook runs it (or not) and returns what the
    /// caller gets. A batch of refreshes the hook fails gets the error in every lease's slot.
    /// The default runs it.
    fn around<T: Answer>(
        &self,
        request: Request,
        call: impl Future<Output = KvResult<T>> + Send,
    ) -> impl Future<Output = KvResult<T>> + Send {
        let _ = request;
        call
    }

    /// A watch's events, once it is open ([`around`](Decorator::around) saw it open). The default
    /// passes them on.
    fn events(&self, stream: WatchStream) -> WatchStream {
        stream
    }

    /// [`Kv::name`].
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    /// [`Kv::capabilities`].
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`Kv::get`].
    fn get<'a>(&'a self, key: &'a [u8]) -> impl Future<Output = KvResult<GetResponse>> + Send + 'a {
        self.around(Request::one(Op::Get), self.inner().get(key))
    }

    /// [`Kv::range`].
    fn range<'a>(
        &'a self,
        prefix: &'a [u8],
        options: RangeOptions,
    ) -> impl Future<Output = KvResult<RangeResponse>> + Send + 'a {
        self.around(Request::one(Op::Range), self.inner().range(prefix, options))
    }

    /// [`Kv::put`].
    fn put<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
        options: PutOptions,
    ) -> impl Future<Output = KvResult<PutOutcome>> + Send + 'a {
        self.around(Request::one(Op::Put), self.inner().put(key, value, options))
    }

    /// [`Kv::delete`].
    fn delete<'a>(
        &'a self,
        key: &'a [u8],
        mode: DeleteMode,
    ) -> impl Future<Output = KvResult<DeleteOutcome>> + Send + 'a {
        self.around(Request::one(Op::Delete), self.inner().delete(key, mode))
    }

    /// [`Kv::delete_prefix`].
    fn delete_prefix<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Future<Output = KvResult<DeletePrefixResponse>> + Send + 'a {
        self.around(Request::one(Op::DeletePrefix), self.inner().delete_prefix(prefix))
    }

    /// [`Kv::delete_prefix_limited`].
    fn delete_prefix_limited<'a>(
        &'a self,
        prefix: &'a [u8],
        limit: usize,
    ) -> impl Future<Output = KvResult<DeletePrefixResponse>> + Send + 'a {
        self.around(Request::one(Op::DeletePrefixLimited), self.inner().delete_prefix_limited(prefix, limit))
    }

    /// [`Kv::lease_grant`].
    fn lease_grant(&self, ttl: Duration) -> impl Future<Output = KvResult<LeaseId>> + Send {
        self.around(Request::one(Op::LeaseGrant), self.inner().lease_grant(ttl))
    }

    /// [`Kv::lease_keep_alive`].
    fn lease_keep_alive(&self, lease: LeaseId) -> impl Future<Output = KvResult<Duration>> + Send {
        self.around(Request::one(Op::LeaseKeepAlive), self.inner().lease_keep_alive(lease))
    }

    /// [`Kv::lease_keep_alive_many`]: the inner backend's batch, as one call of the hook.
    fn lease_keep_alive_many<'a>(
        &'a self,
        leases: &'a [LeaseId],
    ) -> impl Future<Output = Vec<KvResult<Duration>>> + Send + 'a {
        let request = Request { op: Op::LeaseKeepAliveMany, count: leases.len() as u64 };
        let batch = async move { Ok(self.inner().lease_keep_alive_many(leases).await) };
        async move {
            match self.around(request, batch).await {
                Ok(answers) => answers,
                Err(e) => leases.iter().map(|_| Err(e.duplicate())).collect(),
            }
        }
    }

    /// [`Kv::lease_revoke`].
    fn lease_revoke(&self, lease: LeaseId) -> impl Future<Output = KvResult<()>> + Send {
        self.around(Request::one(Op::LeaseRevoke), self.inner().lease_revoke(lease))
    }

    /// [`Kv::watch`]: opened through the hook, its events through [`events`](Decorator::events).
    fn watch<'a>(
        &'a self,
        key: &'a [u8],
        scope: WatchScope,
        start_revision: Revision,
    ) -> impl Future<Output = KvResult<WatchStream>> + Send + 'a {
        let open = self.around(Request::one(Op::Watch), self.inner().watch(key, scope, start_revision));
        async move { Ok(self.events(open.await?)) }
    }

    /// [`Kv::compact`].
    fn compact(&self, revision: Revision) -> impl Future<Output = KvResult<()>> + Send {
        self.around(Request::one(Op::Compact), self.inner().compact(revision))
    }

    /// [`Kv::count_at_revision`].
    fn count_at_revision<'a>(
        &'a self,
        prefix: &'a [u8],
        revision: Revision,
    ) -> impl Future<Output = KvResult<u64>> + Send + 'a {
        self.around(Request::one(Op::CountAtRevision), self.inner().count_at_revision(prefix, revision))
    }

    /// [`Kv::create_counted`].
    fn create_counted<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
        lease: Option<LeaseId>,
        tally: &'a [u8],
        tally_lease: Option<LeaseId>,
    ) -> impl Future<Output = KvResult<CountedCreate>> + Send + 'a {
        let call = self.inner().create_counted(key, value, lease, tally, tally_lease);
        self.around(Request::one(Op::CreateCounted), call)
    }

    /// [`Kv::increment`].
    fn increment<'a>(
        &'a self,
        key: &'a [u8],
        delta: i64,
    ) -> impl Future<Output = KvResult<Option<i64>>> + Send + 'a {
        self.around(Request::one(Op::Increment), self.inner().increment(key, delta))
    }
}

#[async_trait]
impl<L: Decorator> Kv for L {
    fn name(&self) -> &'static str {
        Decorator::name(self)
    }

    fn capabilities(&self) -> Capabilities {
        Decorator::capabilities(self)
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        Decorator::get(self, key).await
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        Decorator::range(self, prefix, options).await
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        Decorator::put(self, key, value, options).await
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        Decorator::delete(self, key, mode).await
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        Decorator::delete_prefix(self, prefix).await
    }

    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        Decorator::delete_prefix_limited(self, prefix, limit).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        Decorator::lease_grant(self, ttl).await
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        Decorator::lease_keep_alive(self, lease).await
    }

    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        Decorator::lease_keep_alive_many(self, leases).await
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        Decorator::lease_revoke(self, lease).await
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        Decorator::watch(self, key, scope, start_revision).await
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        Decorator::compact(self, revision).await
    }

    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        Decorator::count_at_revision(self, prefix, revision).await
    }

    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        Decorator::create_counted(self, key, value, lease, tally, tally_lease).await
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        Decorator::increment(self, key, delta).await
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
        faulty.fail_next(crate::kv::Op::LeaseKeepAliveMany);
        let answers = counting.lease_keep_alive_many(&[1, 2]).await;
        assert!(answers.len() == 2 && answers.iter().all(|a| a.as_ref().is_err_and(|e| e.is_retryable())));
        assert_eq!(stub.refreshes().len(), 1, "{:?}", stub.refreshes());
    }
}
