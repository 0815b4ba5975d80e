//! [`HighWater`]: what one client has seen of its namespace, kept by the connection state
//! (`client.rs`), checked in every script reply (`reply.rs`) and advanced by the watch feed
//! (`feed.rs`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use rdzv_core::KvError;
use rdzv_core::kv::{LeaseId, Revision};

use crate::error::NAME;

/// What this client has seen of its namespace: the highest revision and lease id that any
/// reply or log entry showed. The server's counters only grow, so finding them lower later
/// means the server went back in time (restored from an older snapshot, or a lagging
/// replica promoted). Once that is found, every later call fails with the same error.
#[derive(Debug, Default)]
pub(crate) struct HighWater {
    revision: AtomicI64,
    lease: AtomicI64,
    failure: OnceLock<String>,
    /// Whether the other clients were told (see
    /// [`Shared::announce_rollback`](crate::client::Shared::announce_rollback)).
    announced: AtomicBool,
}

impl HighWater {
    /// Records a revision the server reported.
    pub fn saw_revision(&self, revision: Revision) {
        self.revision.fetch_max(revision, Ordering::Relaxed);
    }

    /// Records a lease id the server handed out.
    pub fn saw_lease(&self, lease: LeaseId) {
        self.lease.fetch_max(lease, Ordering::Relaxed);
    }

    /// The highest revision seen.
    pub fn revision(&self) -> Revision {
        self.revision.load(Ordering::Relaxed)
    }

    /// The highest lease id seen.
    pub fn lease(&self) -> LeaseId {
        self.lease.load(Ordering::Relaxed)
    }

    /// Records that the server rolled back (the first message wins) and returns the error.
    pub fn fail(&self, message: String) -> KvError {
        KvError::backend(NAME, self.failure.get_or_init(|| message).clone())
    }

    /// Whether a rollback was found and the namespace not yet marked (true once).
    pub fn should_announce(&self) -> bool {
        self.failure.get().is_some() && !self.announced.swap(true, Ordering::Relaxed)
    }

    /// The rollback error, once one was found.
    pub fn failed(&self) -> Option<KvError> {
        self.failure.get().map(|m| KvError::backend(NAME, m.clone()))
    }
}
