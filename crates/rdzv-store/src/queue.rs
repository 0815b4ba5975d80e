//! FIFO queues. Each item is its own backend key under the queue's prefix, created with a
//! fresh unique name, so the backend's create revisions give the order. A pop takes the
//! oldest item and deletes it on the condition that it is unchanged: of several concurrent
//! poppers exactly one wins each item, and the losers move on at once to the next item (no
//! re-read of the queue, no sleep).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rdzv_core::kv::{
    DeleteMode, DeleteOutcome, Event, EventKind, KeyValue, PutMode, PutOutcome, RangeOptions, RangeOrder,
    WatchScope,
};
use rdzv_core::wait::{Reading, Start, Wait};
use rdzv_core::{Kv, KvError, KvExt};

use crate::error::StoreError;
use crate::store::{Sent, Store};

impl Store {
    /// Appends `value` to the queue `key` (queues are apart from the other keys: `get`,
    /// `check` and `num_keys` do not see them). Wakes one blocked
    /// [`queue_pop`](Store::queue_pop). Not safe to repeat: if the answer to its write is
    /// lost, it fails with [`StoreError::OutcomeUnknown`] (the item may be in the queue).
    pub async fn queue_push(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let key = key.as_ref();
        let prefix = self.queue_prefix(key);
        self.bounded_write("queue_push", &[key], self.timeout(), |sent| async move {
            loop {
                let mut item = prefix.clone();
                item.extend_from_slice(&unique_name());
                let options = self.write(PutMode::Create);
                sent.mark();
                match self.kv().put(&item, value.as_ref(), options).await? {
                    PutOutcome::Written { .. } => return Ok(()),
                    // Another writer picked the same name (all but impossible): pick again.
                    PutOutcome::Conflict { .. } => continue,
                }
            }
        })
        .await
    }

    /// Removes and returns the oldest item of the queue `key`. If the queue is empty: with
    /// `block`, waits for a push (until the store timeout, then [`StoreError::Timeout`]);
    /// without, fails at once with [`StoreError::QueueEmpty`]. Every pushed item is returned
    /// by exactly one pop, however many pop concurrently. If the answer to the delete that
    /// takes an item is lost, it fails with [`StoreError::OutcomeUnknown`]: the item may
    /// have been removed, and is then lost.
    pub async fn queue_pop(&self, key: impl AsRef<[u8]>, block: bool) -> Result<Vec<u8>, StoreError> {
        let key = key.as_ref();
        let prefix = self.queue_prefix(key);
        let popped = self
            .bounded_write("queue_pop", &[key], self.timeout(), |sent| async move {
                Ok(pop(self.kv().as_ref(), &prefix, block, &sent).await?)
            })
            .await?;
        popped.ok_or_else(|| StoreError::QueueEmpty { key: key.to_vec() })
    }

    /// The number of items in the queue `key` (0 if it was never pushed to).
    pub async fn queue_len(&self, key: impl AsRef<[u8]>) -> Result<i64, StoreError> {
        let key = key.as_ref();
        let prefix = self.queue_prefix(key);
        self.bounded("queue_len", &[key], self.timeout(), async {
            let count = self.kv().count(&prefix, None).await?;
            Ok(i64::try_from(count).unwrap_or(i64::MAX))
        })
        .await
    }
}

/// Pops the oldest item under `prefix`; `None` if it is empty and `block` is false.
async fn pop(kv: &dyn Kv, prefix: &[u8], block: bool, sent: &Sent) -> Result<Option<Vec<u8>>, KvError> {
    kv.wait_until(Pop { kv, prefix, block, sent }, Start::Read).await
}

/// The wait of a pop: for an item this pop takes.
struct Pop<'a> {
    kv: &'a dyn Kv,
    prefix: &'a [u8],
    block: bool,
    sent: &'a Sent,
}

impl Wait for Pop<'_> {
    type Output = Option<Vec<u8>>;

    fn watched(&self) -> Vec<(Vec<u8>, WatchScope)> {
        vec![(self.prefix.to_vec(), WatchScope::Prefix)]
    }

    /// Takes the oldest item, or the next oldest if another popper took it; empty at the
    /// read's revision, every item pushed from then on shows up in the watch, oldest first.
    async fn read(&mut self) -> Result<Reading<Self::Output>, KvError> {
        let oldest =
            RangeOptions { limit: Some(1), order: RangeOrder::ByCreateRevision, ..RangeOptions::default() };
        loop {
            let read = self.kv.range(self.prefix, oldest).await?;
            let Some(item) = read.kvs.into_iter().next() else {
                return Ok(if self.block { Reading::Pending(read.revision) } else { Reading::Done(None) });
            };
            if let Some(value) = take(self.kv, item, self.sent).await? {
                return Ok(Reading::Done(Some(value)));
            }
            // Another popper took it; the next one is now the oldest.
        }
    }

    /// Tries each pushed item in turn until one is ours.
    async fn event(&mut self, _: usize, event: Event) -> Result<Option<Self::Output>, KvError> {
        if event.kind != EventKind::Put {
            return Ok(None);
        }
        Ok(take(self.kv, event.kv, self.sent).await?.map(Some))
    }
}

/// Deletes `item` if nobody else has; returns its value if this call deleted it. `sent` is
/// marked while the delete is in flight (its loss would lose the item).
async fn take(kv: &dyn Kv, item: KeyValue, sent: &Sent) -> Result<Option<Vec<u8>>, KvError> {
    let mode = DeleteMode::IfRevision(item.mod_revision);
    sent.mark();
    let outcome = kv.delete(&item.key, mode).await?;
    // Answered: nothing of this attempt is in doubt any more.
    sent.clear();
    match outcome {
        DeleteOutcome::Deleted { .. } => Ok(Some(item.value.into())),
        DeleteOutcome::Missing | DeleteOutcome::Conflict { .. } => Ok(None),
    }
}

/// A name no other push (of this or any other process) is using: a per-process random
/// seed and a counter. Pushes create with a precondition, so a collision is retried, not
/// lost.
fn unique_name() -> Vec<u8> {
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            hasher.write_u128(since.as_nanos());
        }
        hasher.finish()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{seed:016x}-{n:016x}").into_bytes()
}
