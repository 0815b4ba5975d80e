//! Watch streams: an unbounded channel per watcher, filled under the store's lock (history
//! first, then live events), so a slow reader never loses events and never sees a gap or a
//! duplicate. Dropping the stream unregisters the watcher. The channel is `futures`', which
//! allocates per event: tokio's allocates 32 slots (about 3.5 KiB here) when it is made, for
//! watches that mostly carry a few events (98,304 in-process workers hold one or two each).

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use futures::channel::mpsc::{UnboundedReceiver, unbounded};
use futures::{Stream, StreamExt};
use rdzv_core::KvResult;
use rdzv_core::kv::{Event, Revision, WatchScope, WatchStream};

use crate::shared::Shared;
use crate::state::{Filter, State};

/// Opens a watch; `state` is the locked state of `shared`.
pub(crate) fn open(
    state: &mut State,
    shared: &Arc<Shared>,
    key: &[u8],
    scope: WatchScope,
    start: Revision,
) -> KvResult<WatchStream> {
    let (tx, rx) = unbounded();
    match state.watch(key, scope, start, tx) {
        Ok((filter, id)) => Ok(Box::pin(Events { rx, filter, id, shared: Arc::downgrade(shared) })),
        // The compacted error is delivered as the stream's only item, as the contract says.
        Err(e) => Ok(Box::pin(futures::stream::iter([Err(e)]))),
    }
}

/// The stream of one watcher.
struct Events {
    rx: UnboundedReceiver<KvResult<Event>>,
    filter: Filter,
    id: u64,
    shared: Weak<Shared>,
}

impl Stream for Events {
    type Item = KvResult<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_next_unpin(cx)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lock().unwatch(&self.filter, self.id);
        }
    }
}
