//! Waiting for a key to exist by watching it from a known revision: one read, then a watch
//! of that exact key from the read's revision + 1, so that a write between the two is never
//! missed and nothing is re-read on a wake-up. Deadlines are applied by the caller (these
//! futures are cancelled by dropping them, which also cancels the watch).

use futures::StreamExt;
use rdzv_core::{EventKind, KeyValue, Kv, KvError, KvResult, WatchScope};

/// Returns `key` as soon as it exists. If the watch's start revision was compacted away in
/// the meantime, reads and watches again (the compaction cannot hide the key: a fresh read
/// sees it).
pub(crate) async fn key_exists(kv: &dyn Kv, key: &[u8]) -> KvResult<KeyValue> {
    loop {
        let read = kv.get(key).await?;
        if let Some(found) = read.kv {
            return Ok(found);
        }
        let mut events = kv.watch(key, WatchScope::Key, read.revision + 1).await?;
        loop {
            match events.next().await {
                Some(Ok(event)) if event.kind == EventKind::Put => return Ok(event.kv),
                Some(Ok(_)) => {}
                Some(Err(KvError::Compacted { requested, oldest })) => {
                    tracing::debug!(
                        requested,
                        oldest,
                        "waiting for `{}`: watch start compacted away; reading again",
                        rdzv_core::ext::show(key)
                    );
                    break;
                }
                Some(Err(e)) => return Err(e),
                None => return Err(watch_ended(kv, key)),
            }
        }
    }
}

/// The error for a watch stream that ended without an error, which the [`Kv`] contract
/// does not allow.
pub(crate) fn watch_ended(kv: &dyn Kv, key: &[u8]) -> KvError {
    KvError::backend(
        kv.name(),
        format!(
            "the watch of `{}` ended without an error; the backend may have lost its connection",
            rdzv_core::ext::show(key)
        ),
    )
}
