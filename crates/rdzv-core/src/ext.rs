//! Conveniences written once against [`Kv`]: the one watch-from-a-revision recipe
//! ([`KvExt::watch_from`]), the one wait loop on top of it ([`KvExt::wait_until`]) and two
//! waits written with it (a key to appear, a key to go: by watching, never polling), counting
//! keys, and a compare-and-swap loop that learns the winner's value from each lost swap.

use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::Instant;

use crate::error::KvError;
use crate::kv::{
    Event, EventKind, KeyValue, Kv, KvResult, PutMode, PutOptions, PutOutcome, RangeOptions, Revision,
    WatchScope, WatchStream,
};
use crate::wait::{Reading, Start, Wait};

/// Conveniences for every [`Kv`] (blanket-implemented, also for `dyn Kv`).
#[async_trait]
pub trait KvExt: Kv {
    /// Watches `key` (or the keys under it, with [`WatchScope::Prefix`]) from revision `from`
    /// (at least 1): pass the revision of the read or write the caller's decision was based
    /// on, plus one, so that no change is missed. The [`Watch`] turns the stream's end into
    /// [`KvError::WatchEnded`]; a start revision compacted away arrives as
    /// [`KvError::Compacted`]. Both are retryable the same way: read again, watch again from
    /// the read's revision + 1.
    async fn watch_from(&self, key: &[u8], scope: WatchScope, from: Revision) -> KvResult<Watch> {
        let events = self.watch(key, scope, from.max(1)).await?;
        Ok(Watch { events, backend: self.name(), key: key.to_vec() })
    }

    /// The one wait loop, for every wait on the store (see [`wait`](crate::wait)): from
    /// `start`, read with [`Wait::read`]; unless that ends the wait, watch the
    /// [`Wait::watched`] keys from the read's revision + 1, handing each event to
    /// [`Wait::event`]; after a failure that [`Wait::failed`] accepts (by default a compacted
    /// start or an ended watch), read again. Unbounded: the caller applies its deadline by
    /// dropping it.
    async fn wait_until<W: Wait>(&self, wait: W, start: Start) -> KvResult<W::Output> {
        crate::wait::wait_until(self, wait, start).await
    }

    /// Returns `key` as soon as it exists: reads it, and if absent watches it from the read's
    /// revision + 1 ([`KvExt::wait_until`]). Unbounded: the caller applies its deadline by
    /// dropping it.
    async fn key_exists(&self, key: &[u8]) -> KvResult<KeyValue> {
        self.wait_until(KeyAppears { kv: self, key }, Start::Read).await
    }

    /// [`key_exists`](KvExt::key_exists) within `deadline` ([`KvError::Timeout`] after it).
    async fn wait_for_key(&self, key: &[u8], deadline: Instant) -> KvResult<KeyValue> {
        let started = Instant::now();
        match tokio::time::timeout_at(deadline, self.key_exists(key)).await {
            Ok(found) => found,
            Err(_) => {
                Err(timeout(self.name(), format!("waiting for key `{}`", show_key(key)), started, deadline))
            }
        }
    }

    /// Returns once `key` does not exist, watching from `after` + 1 (pass the revision at
    /// which it was last seen; [`KvExt::wait_until`]). Returns the revision of the delete (or
    /// of the read that found it absent). Fails with [`KvError::Timeout`] at `deadline`.
    async fn wait_for_delete(&self, key: &[u8], after: Revision, deadline: Instant) -> KvResult<Revision> {
        let started = Instant::now();
        let wait = self.wait_until(KeyGone { kv: self, key }, Start::Watch(vec![after + 1]));
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(result) => result,
            Err(_) => Err(timeout(
                self.name(),
                format!("waiting for `{}` to be deleted", show_key(key)),
                started,
                deadline,
            )),
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

/// The wait of [`KvExt::key_exists`].
struct KeyAppears<'a, K: ?Sized> {
    kv: &'a K,
    key: &'a [u8],
}

impl<K: Kv + ?Sized> Wait for KeyAppears<'_, K> {
    type Output = KeyValue;

    fn watched(&self) -> Vec<(Vec<u8>, WatchScope)> {
        vec![(self.key.to_vec(), WatchScope::Key)]
    }

    async fn read(&mut self) -> KvResult<Reading<KeyValue>> {
        let read = self.kv.get(self.key).await?;
        Ok(match read.kv {
            Some(kv) => Reading::Done(kv),
            None => Reading::Pending(read.revision),
        })
    }

    async fn event(&mut self, _: usize, event: Event) -> KvResult<Option<KeyValue>> {
        Ok((event.kind == EventKind::Put).then_some(event.kv))
    }
}

/// The wait of [`KvExt::wait_for_delete`].
struct KeyGone<'a, K: ?Sized> {
    kv: &'a K,
    key: &'a [u8],
}

impl<K: Kv + ?Sized> Wait for KeyGone<'_, K> {
    type Output = Revision;

    fn watched(&self) -> Vec<(Vec<u8>, WatchScope)> {
        vec![(self.key.to_vec(), WatchScope::Key)]
    }

    async fn read(&mut self) -> KvResult<Reading<Revision>> {
        let read = self.kv.get(self.key).await?;
        Ok(match read.kv {
            Some(_) => Reading::Pending(read.revision),
            None => Reading::Done(read.revision),
        })
    }

    async fn event(&mut self, _: usize, event: Event) -> KvResult<Option<Revision>> {
        Ok((event.kind == EventKind::Delete).then(|| event.revision()))
    }
}

/// A watch opened by [`KvExt::watch_from`]: the events of one key or prefix, in revision
/// order. Dropping it cancels the watch.
pub struct Watch {
    events: WatchStream,
    backend: &'static str,
    key: Vec<u8>,
}

impl Watch {
    /// The next event. A stream that ends is [`KvError::WatchEnded`]; like
    /// [`KvError::Compacted`] it means "read again, then watch again"
    /// ([`KvError::needs_reread`]). Cancel-safe: dropping the future loses no event.
    pub async fn next(&mut self) -> KvResult<Event> {
        match self.events.next().await {
            Some(event) => event,
            None => Err(KvError::WatchEnded { backend: self.backend, key: show_key(&self.key) }),
        }
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("backend", &self.backend).field("key", &show_key(&self.key)).finish()
    }
}

fn timeout(backend: &'static str, operation: String, started: Instant, deadline: Instant) -> KvError {
    KvError::Timeout { backend, operation, after: deadline.saturating_duration_since(started) }
}

/// A key as text for messages: UTF-8 where it is, escaped bytes elsewhere.
pub fn show_key(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}
