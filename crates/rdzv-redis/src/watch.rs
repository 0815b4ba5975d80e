//! Watches: each one subscribes to its client's [feed](crate::feed), takes the history it
//! asked for (and anything the feed went past while it lagged) from the feed's recent
//! entries (a watch of one key: from its key's [kept](crate::kept) history too), or with
//! `XRANGE` on the shared connection when those no longer reach back that far, and filters
//! by key or prefix.
//!
//! Gaps are detected, never skipped: every revision has at least one log entry and a
//! revision's entries are appended by one script, so the entry after `<r>-<n>` must be
//! `<r>-<n+1>` or `<r+1>-0`. Anything else means history was compacted (the `compacted`
//! key says up to where) or lost.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, Stream, StreamExt};
use rdzv_core::kv::{Event, Revision, WatchScope, WatchStream};
use rdzv_core::retry::RetryPolicy;
use rdzv_core::{KvError, KvResult};
use redis::streams::StreamRangeReply;
use tokio::sync::broadcast::error::RecvError;

use crate::client::Shared;
use crate::error::NAME;
use crate::feed::{BATCH, EntryId, FeedItem, Joined, Log, Replay};

/// Events buffered between a watch's task and its consumer.
const BUFFER: usize = 256;

struct Watch {
    shared: Arc<Shared>,
    log: Arc<Log>,
    key: Vec<u8>,
    scope: WatchScope,
    /// The last entry read (delivered or filtered out).
    cursor: EntryId,
    tx: mpsc::Sender<KvResult<Event>>,
}

/// Starts a watch: joins the feed, checks the start revision against compaction, then
/// delivers in a task of its own until the consumer drops the stream or an error ends it.
pub(crate) async fn start(
    shared: &Arc<Shared>,
    key: Vec<u8>,
    scope: WatchScope,
    start_revision: Revision,
) -> KvResult<WatchStream> {
    let log = shared.log();
    // As etcd: 0 means "from the first revision", which may itself be compacted.
    let first = start_revision.max(1);
    let cursor = (first - 1, u64::MAX);
    // Join the feed before reading history, so no entry falls between the two.
    let keyed = (scope == WatchScope::Key).then_some(key.as_slice());
    let joined = crate::feed::subscribe(&shared.feed, &shared.feed_gate, &log, cursor, keyed).await?;
    let mut conn = shared.conn.clone();
    let oldest = bounded(&log, log.oldest(&mut conn)).await?;
    if first < oldest {
        return Err(KvError::Compacted { requested: first, oldest });
    }
    // `futures`' channel allocates per event; tokio's allocates 32 slots when it is made
    // (about 4 KiB here), for watches that mostly carry a few events. The consumer holds
    // `gone`'s receiver: dropping the stream ends the task even while it waits on the feed.
    let (tx, rx) = mpsc::channel(BUFFER);
    let (mut gone, consumer) = oneshot::channel::<Infallible>();
    let mut watch = Watch { shared: shared.clone(), log, key, scope, cursor, tx };
    tokio::spawn(async move {
        tokio::select! {
            _ = gone.cancellation() => {}
            result = watch.run(joined) => {
                if let Err(e) = result {
                    let _ = watch.tx.send(Err(e)).await;
                }
            }
        }
    });
    Ok(Box::pin(Events { events: rx, _alive: consumer }))
}

/// A watch's stream: the events its task sends, and what ends the task when it is dropped.
struct Events {
    events: mpsc::Receiver<KvResult<Event>>,
    _alive: oneshot::Receiver<Infallible>,
}

impl Stream for Events {
    type Item = KvResult<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_next_unpin(cx)
    }
}

async fn bounded<T>(log: &Log, f: impl std::future::Future<Output = KvResult<T>>) -> KvResult<T> {
    let after = log.config.request_timeout;
    tokio::time::timeout(after, f)
        .await
        .unwrap_or_else(|_| Err(crate::error::timeout("watch: reading the log", &log.endpoint, after)))
}

impl Watch {
    /// Catches up, then follows the feed; returns only on an error (or a gone consumer). The
    /// rare paths (`catch_up`, `gap`: reads of the log, with retries) are boxed where they are
    /// called, so that their state is not part of every watch's task.
    async fn run(&mut self, joined: Joined) -> KvResult<()> {
        let mut feed = joined.rx;
        match joined.replay {
            // The feed still has everything after the cursor: no need to read the log.
            Replay::All(recent) => {
                for entry in recent {
                    if !follows(self.cursor, entry.id) {
                        return Err(Box::pin(self.gap(entry.id)).await);
                    }
                    self.deliver(entry.id, &entry.event).await?;
                }
            }
            // The feed checked that nothing is missing up to `through`; only this key's
            // entries are left to deliver.
            Replay::Key { entries, through } => {
                for entry in entries {
                    self.deliver(entry.id, &entry.event).await?;
                }
                self.cursor = self.cursor.max(through);
            }
            Replay::Missing => Box::pin(self.catch_up()).await?,
        }
        loop {
            match feed.recv().await {
                Ok(FeedItem::Entries(batch)) => {
                    let (first, last) = (batch.entries[0].id, batch.entries[batch.entries.len() - 1].id);
                    if last <= self.cursor {
                        continue;
                    }
                    // A key's watch is sent only the batches that hold its key, and every batch
                    // that may skip entries: when this one does not, what lies between the
                    // cursor and it is none of this key's.
                    if self.scope == WatchScope::Key
                        && batch.contiguous
                        && (follows(self.cursor, first) || (batch.follows_feed && first > self.cursor))
                    {
                        // Every entry of the batch is new, and only this key's matter.
                        for entry in batch.of_key(&self.key) {
                            self.deliver(entry.id, &entry.event).await?;
                        }
                        self.cursor = last;
                        continue;
                    }
                    for entry in batch.entries.iter() {
                        if entry.id <= self.cursor {
                            continue;
                        }
                        if follows(self.cursor, entry.id) {
                            self.deliver(entry.id, &entry.event).await?;
                        } else {
                            // The feed is ahead of us (we started late or it skipped a hole):
                            // the log itself says which.
                            Box::pin(self.catch_up()).await?;
                            if self.cursor < entry.id {
                                return Err(Box::pin(self.gap(entry.id)).await);
                            }
                        }
                    }
                }
                Ok(FeedItem::Failed(e)) => return Err(e.duplicate()),
                Err(RecvError::Lagged(_)) => Box::pin(self.catch_up()).await?,
                Err(RecvError::Closed) => {
                    tracing::debug!(namespace = %self.log.config.namespace, "redis watch feed ended; watch again");
                    return Err(self.ended());
                }
            }
        }
    }

    /// Delivers what the watch missed: from the feed's memory while it reaches back to the
    /// cursor (a watch of one key also from its key's kept history, see `kept.rs`), else
    /// from the log. A burst of more entries than the broadcast holds (one
    /// prefix delete of a round's keys, a thousand joins) leaves every busy watch of the
    /// client lagging at once; had each re-read the log, a thousand watches would send
    /// thousands of `XRANGE`s of the same entries (large round states among them) down the
    /// shared connection, and every request of the client, writes included, would queue
    /// behind them for seconds.
    async fn catch_up(&mut self) -> KvResult<()> {
        if self.scope == WatchScope::Key
            && let Replay::Key { entries, through } =
                crate::feed::key_after(&self.shared.feed, self.cursor, &self.key)
        {
            for entry in entries {
                self.deliver(entry.id, &entry.event).await?;
            }
            self.cursor = self.cursor.max(through);
            return Ok(());
        }
        loop {
            let Some(batch) = crate::feed::recent_after(&self.shared.feed, self.cursor, BATCH) else {
                return self.read_log().await;
            };
            let n = batch.len();
            for entry in batch {
                if !follows(self.cursor, entry.id) {
                    // Only the log can tell a compacted gap from lost history.
                    return self.read_log().await;
                }
                self.deliver(entry.id, &entry.event).await?;
            }
            if n < BATCH {
                return Ok(());
            }
        }
    }

    /// Reads the log from the cursor to its end with `XRANGE`, delivering as it goes.
    async fn read_log(&mut self) -> KvResult<()> {
        if let Some(compacted) = self.compacted_below(crate::feed::compacted(&self.shared.feed)) {
            return Err(compacted);
        }
        loop {
            let ids = self.range().await?;
            let n = ids.len();
            for id in ids {
                let entry = self.log.entry(id)?;
                if !follows(self.cursor, entry.id) {
                    return Err(self.gap(entry.id).await);
                }
                self.deliver(entry.id, &entry.event).await?;
            }
            if n < BATCH {
                return Ok(());
            }
        }
    }

    /// The next batch of entries after the cursor; connection failures are retried for a
    /// while (this read is idempotent).
    async fn range(&self) -> KvResult<Vec<redis::streams::StreamId>> {
        let window = self.log.config.request_timeout.max(Duration::from_secs(3));
        let deadline = tokio::time::Instant::now() + window;
        let (rev, n) = self.cursor;
        let read = || async move {
            let mut conn = self.shared.conn.clone();
            let read = async {
                redis::cmd("XRANGE")
                    .arg(&self.log.log_key)
                    .arg(format!("({rev}-{n}"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(BATCH)
                    .query_async::<StreamRangeReply>(&mut conn)
                    .await
                    .map_err(|e| self.log.err(e, "watch: reading the event log"))
            };
            bounded(&self.log, read).await
        };
        Ok(RetryPolicy::CLIENT.run(Some(deadline), KvError::is_retryable, read).await?.ids)
    }

    async fn deliver(&mut self, id: EntryId, event: &Event) -> KvResult<()> {
        self.cursor = id;
        let matches = match self.scope {
            WatchScope::Key => event.kv.key == self.key,
            WatchScope::Prefix => event.kv.key.starts_with(&self.key),
        };
        if matches && self.tx.send(Ok(event.clone())).await.is_err() {
            // The consumer is gone; the task's select ends us.
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    /// The error for a hole in the log between the cursor and entry `next`.
    async fn gap(&self, next: EntryId) -> KvError {
        let mut conn = self.shared.conn.clone();
        let oldest = bounded(&self.log, self.log.oldest(&mut conn)).await;
        match oldest.map(|oldest| self.compacted_below(oldest)) {
            Ok(Some(compacted)) => compacted,
            Ok(None) => {
                // Entries are missing below the kept history (a log the server was made to
                // trim or lose): a fresh read and a watch from there is all a caller needs.
                tracing::warn!(
                    namespace = %self.log.config.namespace,
                    endpoint = %self.log.endpoint,
                    from = self.cursor.0,
                    to = next.0,
                    "the redis event log jumps: history was lost; the watch ends (read again, watch again)"
                );
                self.ended()
            }
            Err(e) => e,
        }
    }

    /// The error for this watch when the log starts at `oldest`, after the revision the watch
    /// needs next (`None`: the log still holds it).
    fn compacted_below(&self, oldest: Revision) -> Option<KvError> {
        // The revision after the last one read (a revision's entries are read together in
        // all but the rarest case of a batch boundary inside it).
        let needed = self.cursor.0 + 1;
        (oldest > needed).then_some(KvError::Compacted { requested: needed, oldest })
    }

    /// The end of this watch, retryable like a dropped stream: read again, watch again.
    fn ended(&self) -> KvError {
        KvError::WatchEnded { backend: NAME, key: rdzv_core::kv::show_key(&self.key) }
    }
}

/// Whether entry `next` directly follows `cursor` (`n == u64::MAX`: the end of a revision).
pub(crate) fn follows(cursor: EntryId, next: EntryId) -> bool {
    let (rev, n) = cursor;
    (next.0 == rev + 1 && next.1 == 0) || (next.0 == rev && n != u64::MAX && next.1 == n + 1)
}
