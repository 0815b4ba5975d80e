//! The run lease (docs/PROTOCOL.md "Leases"): one lease per run, TTL `run_ttl`, shared by
//! every handler of the run and kept alive by each, so the run's persistent keys vanish
//! `run_ttl` after its last worker went away. Only a worker that writes a persistent key
//! finds or creates it; the others adopt it from the `final` value of their round, so a
//! crowd of workers starting together does not race to create it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::KvError;
use crate::ext::KvExt;
use crate::kv::{Kv, KvResult, LeaseId, PutMode, PutOptions, PutOutcome};
use crate::session::Session;

use super::keys::RunKeys;

/// Finds or creates the run lease and keeps it alive while this handler lives.
#[derive(Debug)]
pub(crate) struct RunLease {
    kv: Arc<dyn Kv>,
    key: Vec<u8>,
    ttl: Duration,
    current: Mutex<Option<Session>>,
}

impl RunLease {
    pub(crate) fn new(kv: Arc<dyn Kv>, keys: &RunKeys, ttl: Duration) -> Self {
        RunLease { kv, key: keys.run_lease(), ttl, current: Mutex::new(None) }
    }

    /// The lease id, finding or creating the lease on first use or after it was lost.
    pub(crate) async fn id(&self) -> KvResult<LeaseId> {
        if let Some(session) = self.lock().as_ref().filter(|s| !s.is_lost()) {
            return Ok(session.lease());
        }
        let lease = self.acquire().await?;
        let session = Session::attach(self.kv.clone(), lease, self.ttl);
        let mut current = self.lock();
        *current = Some(session);
        Ok(lease)
    }

    /// Helps keep `lease` alive: the run lease another worker created, learned from the
    /// `final` value bound to it. No I/O until the first refresh.
    pub(crate) fn adopt(&self, lease: LeaseId) {
        let mut current = self.lock();
        if current.as_ref().is_some_and(|s| s.lease() == lease && !s.is_lost()) {
            return;
        }
        *current = Some(Session::attach(self.kv.clone(), lease, self.ttl));
    }

    /// Stops helping to keep the lease alive (this worker left the run): once every worker
    /// has done so, the run's lasting keys go `run_ttl` later. Never revokes: other workers
    /// may still use the run.
    pub(crate) fn release(&self) {
        self.lock().take();
    }

    /// Forgets the lease (after the server said it does not exist), so the next
    /// [`RunLease::id`] finds or creates a new one.
    pub(crate) fn invalidate(&self, lease: LeaseId) {
        let mut current = self.lock();
        if current.as_ref().is_some_and(|s| s.lease() == lease) {
            *current = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Session>> {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn acquire(&self) -> KvResult<LeaseId> {
        let mut existing = self.kv.get(&self.key).await?.kv;
        loop {
            if let Some(kv) = &existing {
                let parsed = std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse::<LeaseId>().ok());
                if let Some(lease) = parsed {
                    match self.kv.lease_keep_alive(lease).await {
                        Ok(_) => return Ok(lease),
                        Err(KvError::LeaseNotFound(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            // No usable lease: make one and publish it, unless someone else was faster.
            let lease = self.kv.lease_grant(self.ttl).await?;
            let mode = match &existing {
                Some(kv) => PutMode::Update(kv.mod_revision),
                None => PutMode::Create,
            };
            let options = PutOptions { mode, lease: Some(lease) };
            match self.kv.put(&self.key, lease.to_string().as_bytes(), options).await? {
                PutOutcome::Written { .. } => return Ok(lease),
                PutOutcome::Conflict { current } => {
                    let _ = self.kv.lease_revoke(lease).await;
                    existing = current;
                }
            }
        }
    }
}

/// Writes with the run lease, renewing it once if the server lost it; returns the outcome
/// and the lease the write was bound to.
pub(crate) async fn put_with_run_lease(
    run_lease: &RunLease,
    kv: &dyn Kv,
    key: &[u8],
    value: &[u8],
    mode: PutMode,
) -> KvResult<(PutOutcome, Option<LeaseId>)> {
    let lease = run_lease.id().await?;
    match kv.put(key, value, PutOptions { mode, lease: Some(lease) }).await {
        Err(KvError::LeaseNotFound(_)) => {
            run_lease.invalidate(lease);
            let lease = run_lease.id().await?;
            Ok((kv.put(key, value, PutOptions { mode, lease: Some(lease) }).await?, Some(lease)))
        }
        other => Ok((other?, Some(lease))),
    }
}

/// Compare-and-swap with the run lease (see [`KvExt::compare_and_swap`]).
pub(crate) async fn cas_with_run_lease<F>(
    run_lease: &RunLease,
    kv: &dyn Kv,
    key: &[u8],
    mut update: F,
) -> KvResult<Option<(Vec<u8>, crate::kv::Revision)>>
where
    F: FnMut(Option<&crate::kv::KeyValue>) -> Option<Vec<u8>> + Send,
{
    let lease = run_lease.id().await?;
    match kv.compare_and_swap(key, PutOptions::OVERWRITE.with_lease(Some(lease)), &mut update).await {
        Err(KvError::LeaseNotFound(_)) => {
            run_lease.invalidate(lease);
            let lease = run_lease.id().await?;
            kv.compare_and_swap(key, PutOptions::OVERWRITE.with_lease(Some(lease)), update).await
        }
        other => other,
    }
}
