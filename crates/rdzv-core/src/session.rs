//! A session: one lease kept alive by a background task, with a signal when it is lost
//! (like etcd's Go `concurrency.Session`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::KvError;
use crate::kv::{Kv, KvResult, LeaseId};

/// One lease, refreshed every TTL/3 by a background task until [`Session::close`] or drop.
///
/// If the lease cannot be refreshed before its TTL runs out (the server says it is gone, or
/// every refresh failed for a whole TTL), the session is *lost*: [`Session::lost`] fires and
/// the keys bound to it must be presumed deleted.
#[derive(Debug)]
pub struct Session {
    kv: Arc<dyn Kv>,
    lease: LeaseId,
    ttl: Duration,
    lost: CancellationToken,
    stop: CancellationToken,
    revoke_on_drop: bool,
}

impl Session {
    /// Grants a lease of `ttl` and starts keeping it alive. Must be called within a tokio
    /// runtime.
    pub async fn start(kv: Arc<dyn Kv>, ttl: Duration) -> KvResult<Session> {
        // The server's TTL may start as soon as the request leaves: count from the send, so
        // that our idea of the expiry is never later than the server's.
        let sent = Instant::now();
        let lease = kv.lease_grant(ttl).await?;
        Ok(Session::spawn(kv, lease, ttl, sent, true))
    }

    /// Keeps an existing lease alive (e.g. one shared by several processes) without owning
    /// it: dropping or closing this session only stops the refreshing, it never revokes.
    pub fn attach(kv: Arc<dyn Kv>, lease: LeaseId, ttl: Duration) -> Session {
        Session::spawn(kv, lease, ttl, Instant::now(), false)
    }

    fn spawn(
        kv: Arc<dyn Kv>,
        lease: LeaseId,
        ttl: Duration,
        granted: Instant,
        revoke_on_drop: bool,
    ) -> Session {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        tokio::spawn(keep_alive(kv.clone(), lease, ttl, granted, lost.clone(), stop.clone()));
        Session { kv, lease, ttl, lost, stop, revoke_on_drop }
    }

    /// The lease id, to bind keys to this session.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// The lease's TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A token cancelled when the lease is lost (never cancelled by a clean close).
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Stops refreshing and revokes the lease, deleting its keys at once (only stops
    /// refreshing for a session made by [`Session::attach`]).
    pub async fn close(self) -> KvResult<()> {
        self.stop.cancel();
        if !self.revoke_on_drop {
            return Ok(());
        }
        match self.kv.lease_revoke(self.lease).await {
            Ok(()) | Err(KvError::LeaseNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Session {
    /// Stops refreshing and revokes the lease in the background (best effort: if it fails,
    /// the lease expires after its TTL anyway).
    fn drop(&mut self) {
        if self.stop.is_cancelled() {
            return;
        }
        self.stop.cancel();
        if !self.revoke_on_drop {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (kv, lease) = (self.kv.clone(), self.lease);
            runtime.spawn(async move {
                let _ = kv.lease_revoke(lease).await;
            });
        }
    }
}

async fn keep_alive(
    kv: Arc<dyn Kv>,
    lease: LeaseId,
    ttl: Duration,
    granted: Instant,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let period = ttl / 3;
    // The server's deadline can only be later than ours: the grant reached it after we sent it
    // (`granted` is when the request was sent).
    let mut expires = granted + ttl;
    let mut next = granted + period;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        if sent >= expires {
            tracing::warn!(lease, "session lease expired before it could be refreshed");
            lost.cancel();
            return;
        }
        let refresh = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout_at(expires, kv.lease_keep_alive(lease)) => r,
        };
        match refresh {
            Ok(Ok(granted_ttl)) => {
                expires = sent + granted_ttl.min(ttl).max(period);
                next = sent + period;
            }
            Ok(Err(KvError::LeaseNotFound(_))) => {
                tracing::warn!(lease, "session lease not found on the server: lost");
                lost.cancel();
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(lease, error = %e, "lease refresh failed; retrying");
                next = Instant::now() + (period / 4).max(Duration::from_millis(50));
            }
            Err(_) => {
                tracing::warn!(lease, "no lease refresh succeeded within the TTL: lost");
                lost.cancel();
                return;
            }
        }
    }
}
