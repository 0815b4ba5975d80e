//! [`Stub`]: the backend of this crate's unit tests. It answers every call at once and
//! trivially — a read finds nothing, a write is written, a watch yields one put of its key —
//! and records the lease refreshes it is asked for, so that a test can see how callers (and
//! layers) refresh.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::error::KvError;
use crate::kv::{
    DeleteMode, DeleteOutcome, DeletePrefixResponse, Event, EventKind, GetResponse, KeyValue, Kv, KvResult,
    LeaseId, PutOptions, PutOutcome, RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};

/// The TTL every refresh of a [`Stub`] answers with.
pub(crate) const STUB_TTL: Duration = Duration::from_secs(9);

/// One refresh call a [`Stub`] was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// A [`Kv::lease_keep_alive`] of this lease.
    One(LeaseId),
    /// A [`Kv::lease_keep_alive_many`] of these leases.
    Many(Vec<LeaseId>),
}

impl Refresh {
    /// The leases it named.
    pub(crate) fn leases(&self) -> Vec<LeaseId> {
        match self {
            Refresh::One(lease) => vec![*lease],
            Refresh::Many(leases) => leases.clone(),
        }
    }
}

/// A backend that answers at once; see the module.
#[derive(Debug, Default)]
pub(crate) struct Stub {
    last_lease: Mutex<LeaseId>,
    refreshes: Mutex<Vec<Refresh>>,
    gone: Mutex<HashSet<LeaseId>>,
    failing: AtomicBool,
}

impl Stub {
    /// Every refresh call so far, in order.
    pub(crate) fn refreshes(&self) -> Vec<Refresh> {
        lock(&self.refreshes).clone()
    }

    /// Makes refreshes of these leases fail with [`KvError::LeaseNotFound`].
    pub(crate) fn forget(&self, leases: impl IntoIterator<Item = LeaseId>) {
        lock(&self.gone).extend(leases);
    }

    /// While `failing`, every refresh fails as if the server were out of reach.
    pub(crate) fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    fn refresh(&self, lease: LeaseId) -> KvResult<Duration> {
        if self.failing.load(Ordering::SeqCst) {
            Err(KvError::Unavailable {
                backend: "stub",
                endpoint: "nowhere".into(),
                message: "out of reach".into(),
                source: None,
            })
        } else if lock(&self.gone).contains(&lease) {
            Err(KvError::LeaseNotFound(lease))
        } else {
            Ok(STUB_TTL)
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[async_trait]
impl Kv for Stub {
    fn name(&self) -> &'static str {
        "stub"
    }

    async fn get(&self, _: &[u8]) -> KvResult<GetResponse> {
        Ok(GetResponse { kv: None, revision: 0 })
    }

    async fn range(&self, _: &[u8], _: RangeOptions) -> KvResult<RangeResponse> {
        Ok(RangeResponse::default())
    }

    async fn put(&self, _: &[u8], _: &[u8], _: PutOptions) -> KvResult<PutOutcome> {
        Ok(PutOutcome::Written { revision: 1, create_revision: 1 })
    }

    async fn delete(&self, _: &[u8], _: DeleteMode) -> KvResult<DeleteOutcome> {
        Ok(DeleteOutcome::Missing)
    }

    async fn delete_prefix(&self, _: &[u8]) -> KvResult<DeletePrefixResponse> {
        Ok(DeletePrefixResponse { deleted: 0, revision: 0 })
    }

    async fn lease_grant(&self, _: Duration) -> KvResult<LeaseId> {
        let mut last = lock(&self.last_lease);
        *last += 1;
        Ok(*last)
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        lock(&self.refreshes).push(Refresh::One(lease));
        self.refresh(lease)
    }

    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        lock(&self.refreshes).push(Refresh::Many(leases.to_vec()));
        leases.iter().map(|&lease| self.refresh(lease)).collect()
    }

    async fn lease_revoke(&self, _: LeaseId) -> KvResult<()> {
        Ok(())
    }

    async fn watch(&self, key: &[u8], _: WatchScope, _: Revision) -> KvResult<WatchStream> {
        let kv = KeyValue {
            key: key.to_vec(),
            value: Default::default(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: None,
        };
        Ok(Box::pin(futures::stream::iter([Ok(Event { kind: EventKind::Put, kv })])))
    }
}
