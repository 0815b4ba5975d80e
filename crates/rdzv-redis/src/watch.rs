//! Watches: a blocking read of the namespace's event log (a stream whose entry ids are
//! `<revision>-<n>`) on a connection of the watch's own, filtered here by key or prefix.
//!
//! Gaps are detected, never skipped: every revision has at least one entry and a
//! revision's entries are appended by one script, so the entry after `<r>-<n>` must be
//! `<r>-<n+1>` or `<r+1>-0`. Anything else means history was compacted (the
//! `compacted` key says up to where) or lost.

use std::time::Duration;

use futures::StreamExt;
use rdzv_core::{Event, EventKind, KeyValue, KvError, KvResult, Revision, WatchScope, WatchStream};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamReadReply};
use redis::{Client, Value};

use crate::client::Shared;
use crate::config::RedisConfig;
use crate::error::{corrupt, from_redis, lost};

/// Longest blocking read; between two, the watch checks that the namespace is still ours.
const BLOCK: Duration = Duration::from_millis(1000);

/// Entries fetched per read.
const BATCH: usize = 128;

/// Events buffered between the reading task and the consumer.
const BUFFER: usize = 256;

/// What a watch task needs, independent of the [`RedisKv`](crate::RedisKv) (which may be
/// dropped while its watches go on).
struct Watcher {
    client: Client,
    config: RedisConfig,
    endpoint: String,
    epoch: String,
    epoch_key: String,
    compacted_key: String,
    log_key: String,
    key: Vec<u8>,
    scope: WatchScope,
    /// The last entry read (delivered or filtered out): `(revision, n)`.
    cursor: (Revision, u64),
}

/// Starts a watch: checks the start revision against compaction, then reads in a task.
pub(crate) async fn start(
    shared: &Shared,
    key: Vec<u8>,
    scope: WatchScope,
    start_revision: Revision,
) -> KvResult<WatchStream> {
    let mut w = Watcher {
        client: shared.client.clone(),
        config: shared.config.clone(),
        endpoint: shared.endpoint.clone(),
        epoch: shared.epoch.clone(),
        epoch_key: format!("{}epoch", shared.base),
        compacted_key: format!("{}compacted", shared.base),
        log_key: shared.log_key(),
        key,
        scope,
        cursor: (0, u64::MAX),
    };
    let mut conn = w.connect().await?;
    let oldest = w.oldest(&mut conn).await?;
    // As etcd: 0 means "from the first revision", which may itself be compacted.
    let first = start_revision.max(1);
    if first < oldest {
        return Err(KvError::Compacted { requested: first, oldest });
    }
    w.cursor = (first - 1, u64::MAX);
    let (tx, rx) = tokio::sync::mpsc::channel(BUFFER);
    tokio::spawn(async move {
        tokio::select! {
            _ = tx.closed() => {}
            () = w.run(conn, &tx) => {}
        }
    });
    Ok(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }).boxed())
}

impl Watcher {
    async fn connect(&self) -> KvResult<MultiplexedConnection> {
        let mut conn = crate::connect::dedicated(&self.client, &self.config, BLOCK).await?;
        self.check_epoch(&mut conn).await?;
        Ok(conn)
    }

    fn err(&self, e: redis::RedisError, what: &str) -> KvError {
        if e.code() == Some("WRONGTYPE") {
            return corrupt(self.log_key.as_bytes(), &e.to_string());
        }
        from_redis(e, &self.endpoint, what, self.config.request_timeout)
    }

    async fn check_epoch(&self, conn: &mut MultiplexedConnection) -> KvResult<()> {
        let found: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&self.epoch_key)
            .query_async(conn)
            .await
            .map_err(|e| self.err(e, "watch: reading the epoch"))?;
        let found = found.unwrap_or_default();
        if found != self.epoch.as_bytes() {
            return Err(lost(&self.endpoint, &self.config.namespace, &found));
        }
        Ok(())
    }

    /// The oldest revision still in the log.
    async fn oldest(&self, conn: &mut MultiplexedConnection) -> KvResult<Revision> {
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&self.compacted_key)
            .query_async(conn)
            .await
            .map_err(|e| self.err(e, "watch: reading the compacted revision"))?;
        match v {
            None => Ok(1),
            Some(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse::<Revision>().ok())
                .map(|r| r.max(1))
                .ok_or_else(|| corrupt(self.compacted_key.as_bytes(), "expected a revision number")),
        }
    }

    /// Reads until the consumer goes away or an error ends the watch (sent as the last item).
    async fn run(
        &mut self,
        mut conn: MultiplexedConnection,
        tx: &tokio::sync::mpsc::Sender<KvResult<Event>>,
    ) {
        loop {
            let batch = self.read(&mut conn).await;
            let result = match batch {
                Ok(entries) => self.deliver(entries, &mut conn, tx).await,
                Err(e) if e.is_retryable() => match self.reconnect().await {
                    Ok(c) => {
                        conn = c;
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }

    async fn read(&self, conn: &mut MultiplexedConnection) -> KvResult<Vec<StreamId>> {
        let (rev, n) = self.cursor;
        let reply: Option<StreamReadReply> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.log_key)
            .arg(format!("{rev}-{n}"))
            .query_async(conn)
            .await
            .map_err(|e| self.err(e, "watch: reading the event log"))?;
        match reply {
            Some(r) => Ok(r.keys.into_iter().flat_map(|k| k.ids).collect()),
            None => {
                // Quiet: make sure the namespace is still the one we watch (a server that
                // lost its data would otherwise look quiet forever).
                self.check_epoch(conn).await?;
                Ok(Vec::new())
            }
        }
    }

    async fn deliver(
        &mut self,
        entries: Vec<StreamId>,
        conn: &mut MultiplexedConnection,
        tx: &tokio::sync::mpsc::Sender<KvResult<Event>>,
    ) -> KvResult<()> {
        for entry in entries {
            let id = parse_id(&entry.id).ok_or_else(|| corrupt(self.log_key.as_bytes(), "bad entry id"))?;
            if !follows(self.cursor, id) {
                return Err(self.gap(conn, id).await);
            }
            self.cursor = id;
            let event = self.event(id.0, entry)?;
            if self.matches(&event.kv.key) && tx.send(Ok(event)).await.is_err() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The error for a hole in the log between the cursor and entry `next`.
    async fn gap(&self, conn: &mut MultiplexedConnection, next: (Revision, u64)) -> KvError {
        // The revision after the last one read (a revision's entries are read together in
        // all but the rarest case of a batch boundary inside it).
        let needed = self.cursor.0 + 1;
        match self.oldest(conn).await {
            Ok(oldest) if oldest > needed => KvError::Compacted { requested: needed, oldest },
            Ok(_) => KvError::backend(
                crate::error::NAME,
                format!(
                    "the event log of namespace `{}` at {} jumps from revision {} to {}: history \
                     was lost; re-read and watch again",
                    self.config.namespace, self.endpoint, self.cursor.0, next.0
                ),
            ),
            Err(e) => e,
        }
    }

    fn matches(&self, key: &[u8]) -> bool {
        match self.scope {
            WatchScope::Key => key == self.key.as_slice(),
            WatchScope::Prefix => key.starts_with(&self.key),
        }
    }

    fn event(&self, revision: Revision, entry: StreamId) -> KvResult<Event> {
        let mut map = entry.map;
        let log = self.log_key.as_bytes();
        let mut bytes = |field: &str| -> KvResult<Vec<u8>> {
            match map.remove(field) {
                Some(Value::BulkString(b)) => Ok(b),
                _ => Err(corrupt(log, &format!("event {} has no field `{field}`", entry.id))),
            }
        };
        let kind = bytes("t")?;
        let key = bytes("k")?;
        if kind == b"d" {
            return Ok(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key,
                    value: Vec::new(),
                    create_revision: 0,
                    mod_revision: revision,
                    version: 0,
                    lease: None,
                },
            });
        }
        if kind != b"p" {
            return Err(corrupt(log, &format!("event {} has an unknown kind", entry.id)));
        }
        let value = bytes("v")?;
        let mut int = |field: &str| -> KvResult<i64> {
            let b = bytes(field)?;
            std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| corrupt(log, &format!("event {} has a bad `{field}`", entry.id)))
        };
        let create_revision = int("c")?;
        let mod_revision = int("m")?;
        let version = int("n")?;
        let lease = int("l")?;
        Ok(Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key,
                value,
                create_revision,
                mod_revision,
                version,
                lease: (lease != 0).then_some(lease),
            },
        })
    }

    /// Reconnects after a broken connection, for up to the request timeout (at least a few
    /// seconds); the caller resumes from the cursor.
    async fn reconnect(&self) -> KvResult<MultiplexedConnection> {
        let window = self.config.request_timeout.max(Duration::from_secs(3));
        let deadline = tokio::time::Instant::now() + window;
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.connect().await {
                Ok(c) => return Ok(c),
                Err(e) if e.is_retryable() && tokio::time::Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, "watch: reconnecting to redis");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn parse_id(id: &str) -> Option<(Revision, u64)> {
    let (rev, n) = id.split_once('-')?;
    Some((rev.parse().ok()?, n.parse().ok()?))
}

/// Whether entry `next` directly follows `cursor` (`n == u64::MAX`: the end of a revision).
fn follows(cursor: (Revision, u64), next: (Revision, u64)) -> bool {
    let (rev, n) = cursor;
    (next.0 == rev + 1 && next.1 == 0) || (next.0 == rev && n != u64::MAX && next.1 == n + 1)
}
