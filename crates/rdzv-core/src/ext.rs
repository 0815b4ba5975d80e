//! Conveniences written once against [`Kv`]: waiting for a key to appear or vanish by
//! watching from a known revision (never polling), counting keys, and a compare-and-swap
//! loop that learns the winner's value from each lost swap.

use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::Instant;

use crate::error::KvError;
use crate::kv::{
    EventKind, KeyValue, Kv, KvResult, PutMode, PutOptions, PutOutcome, RangeOptions, Revision, WatchScope,
};

/// Conveniences for every [`Kv`] (blanket-implemented, also for `dyn Kv`).
#[async_trait]
pub trait KvExt: Kv {
    /// Returns the key as soon as it exists: reads it, and if absent watches it from the
    /// read's revision + 1. Fails with [`KvError::Timeout`] at `deadline`.
    async fn wait_for_key(&self, key: &[u8], deadline: Instant) -> KvResult<KeyValue> {
        let started = Instant::now();
        let read = self.get(key).await?;
        if let Some(kv) = read.kv {
            return Ok(kv);
        }
        let mut events = self.watch(key, WatchScope::Key, read.revision + 1).await?;
        loop {
            match tokio::time::timeout_at(deadline, events.next()).await {
                Err(_) => {
                    return Err(timeout(
                        self.name(),
                        format!("waiting for key `{}`", show(key)),
                        started,
                        deadline,
                    ));
                }
                Ok(None) => return Err(KvError::backend(self.name(), "watch ended unexpectedly")),
                Ok(Some(event)) => {
                    let event = event?;
                    if event.kind == EventKind::Put {
                        return Ok(event.kv);
                    }
                }
            }
        }
    }

    /// Returns once `key` does not exist, watching from `after` + 1 (pass the revision at
    /// which it was last seen). Returns the revision of the delete (or of the read that found
    /// it absent). Fails with [`KvError::Timeout`] at `deadline`.
    async fn wait_for_delete(&self, key: &[u8], after: Revision, deadline: Instant) -> KvResult<Revision> {
        let started = Instant::now();
        let mut events = self.watch(key, WatchScope::Key, after + 1).await?;
        // The key may already be gone and its delete compacted away; a read settles that.
        let read = self.get(key).await?;
        if read.kv.is_none() {
            return Ok(read.revision);
        }
        loop {
            match tokio::time::timeout_at(deadline, events.next()).await {
                Err(_) => {
                    return Err(timeout(
                        self.name(),
                        format!("waiting for `{}` to be deleted", show(key)),
                        started,
                        deadline,
                    ));
                }
                Ok(None) => return Err(KvError::backend(self.name(), "watch ended unexpectedly")),
                Ok(Some(event)) => {
                    let event = event?;
                    if event.kind == EventKind::Delete {
                        return Ok(event.revision());
                    }
                }
            }
        }
    }

    /// Counts the keys under `prefix` created at or before `max_create_revision` (all, with
    /// `None`), without reading them.
    async fn count(&self, prefix: &[u8], max_create_revision: Option<Revision>) -> KvResult<u64> {
        let options = RangeOptions { count_only: true, max_create_revision, ..RangeOptions::default() };
        Ok(self.range(prefix, options).await?.count)
    }

    /// Compare-and-swap loop: calls `update` with the current key (or `None`); if it returns
    /// a value, writes it on the condition that the key did not change meanwhile. A lost swap
    /// hands the winner's key straight back to `update` (no re-read, no sleep). Returns the
    /// written value and its revision, or `None` if `update` declined to write.
    async fn compare_and_swap<F>(
        &self,
        key: &[u8],
        options: PutOptions,
        mut update: F,
    ) -> KvResult<Option<(Vec<u8>, Revision)>>
    where
        F: FnMut(Option<&KeyValue>) -> Option<Vec<u8>> + Send,
    {
        let mut current = self.get(key).await?.kv;
        loop {
            let Some(value) = update(current.as_ref()) else {
                return Ok(None);
            };
            let mode = match &current {
                Some(kv) => PutMode::Update(kv.mod_revision),
                None => PutMode::Create,
            };
            match self.put(key, &value, PutOptions { mode, ..options }).await? {
                PutOutcome::Written { revision, .. } => return Ok(Some((value, revision))),
                PutOutcome::Conflict { current: now } => current = now,
            }
        }
    }
}

impl<T: Kv + ?Sized> KvExt for T {}

fn timeout(backend: &'static str, operation: String, started: Instant, deadline: Instant) -> KvError {
    KvError::Timeout { backend, operation, after: deadline.saturating_duration_since(started) }
}

/// A key as text for messages: UTF-8 where it is, escaped bytes elsewhere.
pub fn show(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}
