//! A [`MemKv`] wrapper with optional quirks, to drive the Store through code paths that a
//! plain `MemKv` never takes.

use std::sync::atomic::{AtomicU64, Ordering};

use rdzv_core::kv::{Capabilities, PutOptions, Revision, WatchScope, WatchStream};
use rdzv_core::layer::Decorator;
use rdzv_core::{Kv, KvError, KvExt, KvResult};
use rdzv_mem::MemKv;

/// [`MemKv`] with quirks.
#[derive(Debug, Default)]
pub struct QuirkyKv {
    inner: MemKv,
    watches: AtomicU64,
    compact_every_other_watch: bool,
    native_increment: bool,
}

impl QuirkyKv {
    /// With `compact_every_other_watch`, every other watch (the first included) fails at
    /// once with [`KvError::Compacted`]. With `native_increment`, `increment` is "native" (as
    /// on Redis) and rejects a non-integer value with [`KvError::InvalidArgument`].
    pub fn new(compact_every_other_watch: bool, native_increment: bool) -> QuirkyKv {
        QuirkyKv { compact_every_other_watch, native_increment, ..QuirkyKv::default() }
    }
}

impl Decorator for QuirkyKv {
    fn inner(&self) -> &dyn Kv {
        &self.inner
    }

    fn name(&self) -> &'static str {
        "quirky-mem"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { native_increment: self.native_increment, ..self.inner.capabilities() }
    }

    async fn watch<'a>(
        &'a self,
        key: &'a [u8],
        scope: WatchScope,
        start_revision: Revision,
    ) -> KvResult<WatchStream> {
        if self.compact_every_other_watch && self.watches.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            let compacted = KvError::Compacted { requested: start_revision, oldest: start_revision + 1 };
            return Ok(Box::pin(futures::stream::iter([Err(compacted)])));
        }
        self.inner.watch(key, scope, start_revision).await
    }

    async fn increment<'a>(&'a self, key: &'a [u8], delta: i64) -> KvResult<Option<i64>> {
        if !self.native_increment {
            return Err(KvError::Unsupported { backend: "quirky-mem", what: "native increments" });
        }
        let mut verdict = Ok(0);
        self.inner
            .compare_and_swap(key, PutOptions::OVERWRITE, |current| {
                let now = match current {
                    None => Some(0),
                    Some(kv) => std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse::<i64>().ok()),
                };
                verdict = match now.and_then(|n| n.checked_add(delta)) {
                    Some(next) => Ok(next),
                    None => Err(KvError::InvalidArgument("value is not an integer or out of range".into())),
                };
                verdict.as_ref().ok().map(|n| n.to_string().into_bytes())
            })
            .await?;
        verdict.map(Some)
    }
}
