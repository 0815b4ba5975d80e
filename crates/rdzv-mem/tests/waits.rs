//! The one wait loop of `KvExt` (`rdzv_core::wait`) on a `MemKv` under a paused clock: what
//! it does when the history it would watch from is gone, and with a wrong start.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdzv_core::kv::{DeleteMode, DeleteOutcome, Event, PutOptions, Revision, WatchScope, WatchStream};
use rdzv_core::layer::Decorator;
use rdzv_core::wait::{Reading, Start, Wait};
use rdzv_core::{Kv, KvError, KvExt, KvResult};
use rdzv_mem::MemKv;
use tokio::time::Instant;

/// A backend whose first watch fails from the call itself with `Compacted`, as the `Kv`
/// contract allows (a watch from a compacted revision fails "from this call or as the
/// stream's first item"); `MemKv` says it as the stream's first item.
#[derive(Debug)]
struct CompactedOnce {
    inner: MemKv,
    failed: AtomicBool,
}

impl Decorator for CompactedOnce {
    fn inner(&self) -> &dyn Kv {
        &self.inner
    }

    async fn watch<'a>(&'a self, key: &'a [u8], scope: WatchScope, start: Revision) -> KvResult<WatchStream> {
        if !self.failed.swap(true, Ordering::SeqCst) {
            return Err(KvError::Compacted { requested: start, oldest: start + 1 });
        }
        self.inner.watch(key, scope, start).await
    }
}

/// Waiting for a key to go from a revision that was compacted away reads again and goes on
/// waiting, whether the compaction is told by the watch call (as `CompactedOnce` does: that
/// used to fail the wait with `Compacted`) or as the stream's first item (as `MemKv` does).
#[tokio::test(start_paused = true)]
async fn a_wait_for_delete_from_a_compacted_revision_reads_again() {
    for told_by_the_call in [true, false] {
        let kv = CompactedOnce { inner: MemKv::new(), failed: AtomicBool::new(!told_by_the_call) };
        Kv::put(&kv, b"k", b"v", PutOptions::OVERWRITE).await.unwrap();
        for _ in 0..3 {
            Kv::put(&kv, b"other", b"v", PutOptions::OVERWRITE).await.unwrap();
        }
        kv.inner.compact(kv.inner.revision()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let wait = kv.wait_for_delete(b"k", 1, deadline);
        let delete = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Kv::delete(&kv, b"k", DeleteMode::Any).await.unwrap()
        };
        let (gone, deleted) = tokio::join!(wait, delete);
        let DeleteOutcome::Deleted { revision } = deleted else { panic!("k was there: {deleted:?}") };
        assert_eq!(gone.unwrap(), revision, "told by the call: {told_by_the_call}");
    }
}

/// Never ends by itself: a wait whose only way out is an error.
struct Forever;

impl Wait for Forever {
    type Output = ();

    fn watched(&self) -> Vec<(Vec<u8>, WatchScope)> {
        vec![(b"a".to_vec(), WatchScope::Key), (b"b".to_vec(), WatchScope::Key)]
    }

    async fn read(&mut self) -> KvResult<Reading<()>> {
        Ok(Reading::Pending(0))
    }

    async fn event(&mut self, _: usize, _: Event) -> KvResult<Option<()>> {
        Ok(None)
    }
}

/// A start that does not give one revision per watched key is refused, not a panic.
#[tokio::test(start_paused = true)]
async fn a_start_without_a_revision_per_key_is_an_invalid_argument() {
    let kv = MemKv::new();
    let from: Vec<Revision> = vec![1];
    match kv.wait_until(Forever, Start::Watch(from)).await {
        Err(KvError::InvalidArgument(message)) => {
            assert!(message.contains("one per watched key"), "{message}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
