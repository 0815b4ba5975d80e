//! The feed: one task per client tails the namespace's event log (a stream whose entry ids
//! are `<revision>-<n>`) with a blocking `XREAD` on a connection of its own, and broadcasts
//! every entry to that client's watches. However many watches a client has, Redis serves
//! one blocked reader and one shared connection for it; each watch filters in memory. The
//! entries of one read go out together, as one [`Batch`] indexed by key: a watch task is
//! woken once per read, not once per entry, and a watch of one key looks its key up instead
//! of visiting every entry (8,192 watches woken for, and comparing, each of a round's
//! ~30,000 entries kept a process of 8,192 workers busy for a minute per round).
//!
//! A watch of one key is woken only by the reads that hold its key: the feed sends each
//! batch to the watches of a prefix and to the watches of the keys in it, each key's watches
//! on a channel of their own. What lets a key's watch skip the reads it was not sent is that
//! the feed tells it of every read that may have skipped entries: a batch that does not
//! directly follow the one before it goes to every watch. (Woken by every read, the 8,192
//! watches of the state key made one process's CPU time grow with N² on Redis: 15 times the
//! CPU for 8 times the workers, a quarter of it in the broadcast's wake-ups.)
//!
//! The task starts with the first watch and ends when the last one is gone. It checks the
//! namespace's epoch and revision whenever the log is quiet and after every reconnect, so a
//! server that lost its data, or went back to an older snapshot (its revision is below one
//! this client has seen), ends every watch with that error instead of looking quiet forever
//! or skipping the revisions it hands out again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdzv_core::kv::{Event, EventKind, KeyValue, Revision};
use rdzv_core::retry::RetryPolicy;
use rdzv_core::{KvError, KvResult};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamRangeReply, StreamReadReply};
use redis::{Client, Value};

use crate::config::RedisConfig;
use crate::error::{corrupt, from_redis, lost, rolled_back};
use crate::kept::{KEPT_ENTRIES, Kept};
use crate::shared::HighWater;

/// Longest blocking read; between two, the feed checks that the namespace is still ours.
const BLOCK: Duration = Duration::from_millis(1000);

/// Entries fetched per read.
pub(crate) const BATCH: usize = 128;

/// Reads (of up to [`BATCH`] entries each) a watch may lag behind the feed before it catches
/// up from the recent entries (or the log) itself. Bounds what the broadcast holds on to for
/// a slow watch: at most this many reads' entries.
const CAPACITY: usize = 128;

/// The same for the channel of one key's watches, which carries only the reads that hold
/// the key (and the rare read after a hole): small, as there is one such channel per key
/// watched, thousands of them in a large process.
const KEY_CAPACITY: usize = 16;

/// Reads between two sweeps of the channels of keys nobody watches any more.
const SWEEP_EVERY: u64 = 256;

/// The position of an entry in the log: `(revision, n)`; `n == u64::MAX` stands for "after
/// every entry of that revision".
pub(crate) type EntryId = (Revision, u64);

/// One log entry, parsed once for every watch.
#[derive(Debug)]
pub(crate) struct Entry {
    pub id: EntryId,
    pub event: Event,
}

/// What the feed broadcasts.
#[derive(Clone, Debug)]
pub(crate) enum FeedItem {
    /// The entries of one read of the log.
    Entries(Arc<Batch>),
    /// The feed ended with this error; every watch ends with it.
    Failed(Arc<KvError>),
}

/// The entries of one read of the log (never empty), in order, indexed by key.
#[derive(Debug)]
pub(crate) struct Batch {
    pub entries: Vec<Arc<Entry>>,
    /// Whether each entry directly follows the one before it (no hole inside the batch).
    pub contiguous: bool,
    /// Whether the batch's first entry directly follows the last one the feed sent before
    /// it. With `contiguous`, a key's watch that was sent every batch that is not both may
    /// take the entries between its cursor and this batch as none of its key's.
    pub follows_feed: bool,
    /// Where each key's entries are in `entries`, in order.
    by_key: HashMap<Vec<u8>, Vec<usize>>,
}

impl Batch {
    fn new(entries: Vec<Arc<Entry>>, after: EntryId) -> Batch {
        let contiguous = entries.windows(2).all(|pair| crate::watch::follows(pair[0].id, pair[1].id));
        let follows_feed = entries.first().is_some_and(|first| crate::watch::follows(after, first.id));
        let mut by_key: HashMap<Vec<u8>, Vec<usize>> = Default::default();
        for (i, entry) in entries.iter().enumerate() {
            by_key.entry(entry.event.kv.key.clone()).or_default().push(i);
        }
        Batch { entries, contiguous, follows_feed, by_key }
    }

    /// Whether the feed may have skipped entries before or inside this batch: then every
    /// watch is sent it.
    fn may_skip(&self) -> bool {
        !(self.contiguous && self.follows_feed)
    }

    /// The entries of exactly `key`, in order.
    pub fn of_key<'a>(&'a self, key: &[u8]) -> impl Iterator<Item = &'a Arc<Entry>> + 'a {
        self.by_key.get(key).into_iter().flatten().map(|&i| &self.entries[i])
    }
}

/// Recent entries the feed keeps for watches that start now or fell behind: a watch from a
/// revision the feed has already passed replays them from memory instead of reading the log
/// again (a thousand workers watching from "my write + 1" would otherwise each re-read the
/// others' writes, and a thousand watches lagging after a burst would each re-read the
/// burst). Bounded in entries and in bytes. A rendezvous round of N workers appends about
/// 4 N entries, so the count holds two rounds of 4096 workers: fewer, and a burst leaves
/// the watches of a busy process behind the memory, every one of them re-reads the round
/// with `XRANGE` at once, and the shared connection carries the same entries a thousand
/// times over (with 2048 workers on one core, rounds of minutes).
const RECENT_ENTRIES: usize = 32 * 1024;
const RECENT_BYTES: usize = 32 << 20;

/// What an entry costs in memory besides its key and value (the `Arc`'d entry, the
/// allocations' headers, its slot in the queue), counted against `RECENT_BYTES`.
const ENTRY_OVERHEAD: usize = 192;

pub(crate) fn footprint(entry: &Entry) -> usize {
    entry.event.kv.key.len() + entry.event.kv.value.len() + ENTRY_OVERHEAD
}

/// Entries a starting feed reads back from the log (one read; with very large values this
/// is the feed's largest allocation, trimmed to `RECENT_BYTES` right after).
const PREFILL: usize = 1024;

/// A running feed: its broadcasts, and its recent entries.
pub(crate) struct FeedState {
    /// Every batch, for the watches of a prefix.
    tx: tokio::sync::broadcast::Sender<FeedItem>,
    /// The batches that hold a key (and every batch that may skip entries), for the
    /// watches of that key.
    keys: HashMap<Vec<u8>, tokio::sync::broadcast::Sender<FeedItem>>,
    recent: VecDeque<Arc<Entry>>,
    recent_bytes: usize,
    /// The most entries `recent` keeps (`RECENT_ENTRIES`; smaller in tests).
    recent_limit: usize,
    /// The position of `recent`'s first entry in the sequence of every entry it ever held,
    /// which names an entry for as long as it is kept (`recent[seq - first_seq]`).
    first_seq: u64,
    /// Each key's entries in `recent`, by position, oldest first: a key's watch is handed
    /// its key's entries without looking through the others'.
    seqs_of_key: HashMap<Vec<u8>, VecDeque<u64>>,
    /// The positions of the entries of `recent` that do not follow the one before them
    /// (the feed skipped entries there), oldest first.
    holes: VecDeque<u64>,
    /// Every entry after this one is in `recent` or not broadcast yet.
    floor: EntryId,
    /// The entries before `floor` of the keys watched one by one.
    kept: Kept,
    /// The last entry sent (or, before the first batch, where the feed started reading).
    sent: EntryId,
    /// Batches sent, for the sweeps of `keys`.
    batches: u64,
    /// The oldest revision the log held when the feed last found that it had skipped
    /// entries (0: it never did). A watch that needs an older revision ends as compacted
    /// without reading the log: after the feed fell behind the log's history, each of a
    /// busy client's 65,536 watches read 128 entries with `XRANGE` only to find the same
    /// gap, 2 GB of replies on the shared connection, and every session was lost.
    compacted: Revision,
}

/// The client's feed, if running (the task clears it, under the lock, when it ends).
pub(crate) type FeedSlot = Arc<Mutex<Option<FeedState>>>;

/// Lets one watch at a time start the feed, so that a thousand watches opened together make
/// one connection, not a thousand.
pub(crate) type FeedGate = tokio::sync::Mutex<()>;

/// A watch's start on the feed: its subscription, and what it takes from the feed's memory.
pub(crate) struct Joined {
    pub rx: tokio::sync::broadcast::Receiver<FeedItem>,
    pub replay: Replay,
}

/// The history a starting watch takes from the feed's memory.
#[derive(Debug)]
pub(crate) enum Replay {
    /// The memory does not reach back to the watch's cursor: read the log.
    Missing,
    /// Every entry after the cursor, in order, for the watch to check and filter.
    All(Vec<Arc<Entry>>),
    /// For a watch of one key, when the memory holds every entry from the cursor to its end
    /// without a hole: only that key's entries, and the last entry looked at (the cursor the
    /// watch goes on from). A watch started late in a busy round would otherwise be handed,
    /// and look through, every entry since its start: at 8,192 workers, 16 million entries
    /// per 4 rounds, a cost growing with N² (the same memory holds 32,768 entries).
    Key { entries: Vec<Arc<Entry>>, through: EntryId },
}

impl FeedState {
    fn new(floor: EntryId, start: EntryId) -> FeedState {
        FeedState::with_limits(floor, start, RECENT_ENTRIES, KEPT_ENTRIES)
    }

    fn with_limits(floor: EntryId, start: EntryId, recent_limit: usize, kept_per_key: usize) -> FeedState {
        let (tx, _) = tokio::sync::broadcast::channel(CAPACITY);
        FeedState {
            tx,
            keys: Default::default(),
            recent: Default::default(),
            recent_bytes: 0,
            recent_limit,
            first_seq: 0,
            seqs_of_key: Default::default(),
            holes: Default::default(),
            floor,
            kept: Kept::new(kept_per_key),
            sent: start,
            batches: 0,
            compacted: 0,
        }
    }

    /// Subscribes a watch of `key` (`None`: of a prefix, which is sent every batch).
    fn join(&mut self, cursor: EntryId, key: Option<&[u8]>) -> Joined {
        // Under the slot's lock, so nothing is pushed between the snapshot and the
        // subscription.
        let rx = match key {
            None => self.tx.subscribe(),
            Some(key) => match self.keys.get(key) {
                Some(tx) => tx.subscribe(),
                None => {
                    let (tx, rx) = tokio::sync::broadcast::channel(KEY_CAPACITY);
                    self.keys.insert(key.to_vec(), tx);
                    rx
                }
            },
        };
        if let Some(key) = key {
            self.kept.watch(key, self.floor);
        }
        let replay = match key {
            Some(key) => self.after_of_key(cursor, key),
            None => self.after(cursor, usize::MAX).map_or(Replay::Missing, Replay::All),
        };
        Joined { rx, replay }
    }

    /// Whether no watch listens any more (then the feed ends).
    fn idle(&mut self) -> bool {
        if self.tx.receiver_count() > 0 {
            return false;
        }
        self.sweep();
        self.keys.is_empty()
    }

    /// Drops the channels of keys nobody watches any more.
    fn sweep(&mut self) {
        self.keys.retain(|_, tx| tx.receiver_count() > 0);
        let keys = &self.keys;
        self.kept.retain(|key| keys.contains_key(key));
    }

    /// Sends `item` to every watch.
    fn send_all(&self, item: FeedItem) {
        for tx in self.keys.values() {
            let _ = tx.send(item.clone());
        }
        let _ = self.tx.send(item);
    }

    /// Up to `max` recent entries right after `cursor` (`None`: the memory does not reach
    /// back that far).
    fn after(&self, cursor: EntryId, max: usize) -> Option<Vec<Arc<Entry>>> {
        (cursor >= self.floor).then(|| {
            let after = self.recent.partition_point(|e| e.id <= cursor);
            self.recent.range(after..).take(max).cloned().collect()
        })
    }

    /// The recent entries of `key` after `cursor` (see [`Replay::Key`]); every entry after
    /// it when there is a hole among them, so that the watch finds the hole as before.
    fn after_of_key(&self, cursor: EntryId, key: &[u8]) -> Replay {
        if cursor < self.floor {
            return self.kept_after(cursor, key);
        }
        let start = self.recent.partition_point(|e| e.id <= cursor);
        let (Some(first), Some(last)) = (self.recent.get(start), self.recent.back()) else {
            return Replay::Key { entries: Vec::new(), through: cursor };
        };
        let start_seq = self.first_seq + start as u64;
        let hole_after_start = self.holes.back().is_some_and(|&hole| hole > start_seq);
        if !crate::watch::follows(cursor, first.id) || hole_after_start {
            return Replay::All(self.recent.range(start..).cloned().collect());
        }
        Replay::Key { entries: self.recent_of_key(key, start_seq).collect(), through: last.id }
    }

    /// `key`'s entries in memory from position `start_seq` on, in order.
    fn recent_of_key<'a>(&'a self, key: &[u8], start_seq: u64) -> impl Iterator<Item = Arc<Entry>> + 'a {
        let seqs = self.seqs_of_key.get(key);
        let from = seqs.map_or(0, |seqs| seqs.partition_point(|&seq| seq < start_seq));
        seqs.into_iter()
            .flat_map(move |seqs| seqs.range(from..))
            .map(|&seq| self.recent[(seq - self.first_seq) as usize].clone())
    }

    /// For a cursor before the memory's first entry: `key`'s kept history and its entries
    /// in memory, when the two reach back to the cursor and the memory has no hole (else
    /// the watch reads the log, which tells a hole from compaction).
    fn kept_after(&self, cursor: EntryId, key: &[u8]) -> Replay {
        let contiguous = self.holes.is_empty()
            && self.recent.front().is_some_and(|first| crate::watch::follows(self.floor, first.id));
        let (Some(mut entries), Some(last), true) =
            (self.kept.after(key, cursor), self.recent.back(), contiguous)
        else {
            return Replay::Missing;
        };
        entries.extend(self.recent_of_key(key, self.first_seq));
        Replay::Key { entries, through: last.id }
    }

    /// Keeps `entries` among the recent ones and sends them, as one batch, to the watches
    /// of a prefix and of the keys among them (to every watch if the batch may skip entries).
    fn push(&mut self, entries: Vec<Arc<Entry>>) {
        let Some(last) = entries.last().map(|e| e.id) else {
            return;
        };
        for entry in &entries {
            self.remember(entry.clone());
        }
        let batch = Arc::new(Batch::new(entries, self.sent));
        self.sent = last;
        self.batches += 1;
        if self.batches.is_multiple_of(SWEEP_EVERY) {
            self.sweep();
        }
        // No receiver is fine: the feed ends at its next check.
        if batch.may_skip() {
            self.send_all(FeedItem::Entries(batch));
            return;
        }
        for key in batch.by_key.keys() {
            if let Some(tx) = self.keys.get(key) {
                let _ = tx.send(FeedItem::Entries(batch.clone()));
            }
        }
        let _ = self.tx.send(FeedItem::Entries(batch));
    }

    fn remember(&mut self, entry: Arc<Entry>) {
        let seq = self.first_seq + self.recent.len() as u64;
        if self.recent.back().is_some_and(|before| !crate::watch::follows(before.id, entry.id)) {
            self.holes.push_back(seq);
        }
        let key = &entry.event.kv.key;
        match self.seqs_of_key.get_mut(key) {
            Some(seqs) => seqs.push_back(seq),
            None => {
                self.seqs_of_key.insert(key.clone(), VecDeque::from([seq]));
            }
        }
        self.recent_bytes += footprint(&entry);
        self.recent.push_back(entry);
        while self.recent.len() > self.recent_limit || self.recent_bytes > RECENT_BYTES {
            let Some(old) = self.recent.pop_front() else { break };
            self.recent_bytes -= footprint(&old);
            let after_hole = !crate::watch::follows(self.floor, old.id);
            self.floor = old.id;
            let old_seq = self.first_seq;
            self.first_seq += 1;
            if let Some(seqs) = self.seqs_of_key.get_mut(&old.event.kv.key) {
                seqs.pop_front();
                if seqs.is_empty() {
                    self.seqs_of_key.remove(&old.event.kv.key);
                }
            }
            // A hole before the first entry kept says nothing: a cursor is checked against
            // that entry itself.
            while self.holes.front().is_some_and(|&hole| hole <= old_seq + 1) {
                self.holes.pop_front();
            }
            if after_hole {
                self.kept.restart(old.id);
            } else {
                self.kept.dropped(old);
            }
        }
    }
}

/// Reading and parsing the log: shared by the feed and the watches' catch-up reads.
#[derive(Clone)]
pub(crate) struct Log {
    pub client: Client,
    pub config: RedisConfig,
    pub endpoint: String,
    pub epoch: String,
    pub epoch_key: String,
    pub compacted_key: String,
    pub log_key: String,
    pub rev_key: String,
    /// What the client has seen (the feed records its entries there).
    pub high: Arc<HighWater>,
}

impl Log {
    pub fn err(&self, e: redis::RedisError, what: &str) -> KvError {
        if e.code() == Some("WRONGTYPE") {
            return corrupt(self.log_key.as_bytes(), &e.to_string());
        }
        from_redis(e, &self.endpoint, what, self.config.request_timeout)
    }

    /// An integer key of ours (`None`: absent).
    pub async fn int_at<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
    ) -> KvResult<Option<Revision>> {
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(conn)
            .await
            .map_err(|e| self.err(e, "watch: reading the log"))?;
        match v {
            None => Ok(None),
            Some(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse::<Revision>().ok())
                .map(Some)
                .ok_or_else(|| corrupt(key.as_bytes(), "expected a revision number")),
        }
    }

    /// The oldest revision still in the log.
    pub async fn oldest<C: redis::aio::ConnectionLike + Send>(&self, conn: &mut C) -> KvResult<Revision> {
        Ok(self.int_at(conn, &self.compacted_key).await?.unwrap_or(1).max(1))
    }

    /// Checks that the namespace is still the one the client attached to: same epoch, and a
    /// revision no lower than the client has seen (else the server rolled back).
    pub async fn check_alive<C: redis::aio::ConnectionLike + Send>(&self, conn: &mut C) -> KvResult<()> {
        if let Some(e) = self.high.failed() {
            return Err(e);
        }
        // Read before the server's revision: a reply that arrives in between can only raise
        // it past what the server had when read, which would look like a rollback.
        let seen = self.high.revision();
        let found: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&self.epoch_key)
            .query_async(conn)
            .await
            .map_err(|e| self.err(e, "watch: reading the epoch"))?;
        let found = found.unwrap_or_default();
        if found != self.epoch.as_bytes() {
            return Err(lost(&self.endpoint, &self.config.namespace, &found));
        }
        let now = self.int_at(conn, &self.rev_key).await?.unwrap_or(0);
        if now < seen {
            let evidence = format!("its revision is {now}, but this client already saw revision {seen}");
            return Err(self.high.fail(rolled_back(&self.endpoint, &self.config.namespace, &evidence)));
        }
        Ok(())
    }

    /// Parses one stream entry.
    pub fn entry(&self, entry: StreamId) -> KvResult<Entry> {
        let log = self.log_key.as_bytes();
        let id = parse_id(&entry.id).ok_or_else(|| corrupt(log, &format!("bad entry id `{}`", entry.id)))?;
        let mut map = entry.map;
        let mut bytes = |field: &str| -> KvResult<Vec<u8>> {
            match map.remove(field) {
                Some(Value::BulkString(b)) => Ok(b),
                _ => Err(corrupt(log, &format!("event {} has no field `{field}`", entry.id))),
            }
        };
        let kind = bytes("t")?;
        let key = bytes("k")?;
        if kind == b"d" {
            let kv = KeyValue {
                key,
                value: Default::default(),
                create_revision: 0,
                mod_revision: id.0,
                version: 0,
                lease: None,
            };
            return Ok(Entry { id, event: Event { kind: EventKind::Delete, kv } });
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
        let kv = KeyValue {
            key,
            value: value.into(),
            create_revision,
            mod_revision,
            version,
            lease: (lease != 0).then_some(lease),
        };
        Ok(Entry { id, event: Event { kind: EventKind::Put, kv } })
    }

    async fn connect(&self) -> KvResult<MultiplexedConnection> {
        let mut conn = crate::connect::dedicated(&self.client, &self.config, BLOCK).await?;
        self.check_alive(&mut conn).await?;
        Ok(conn)
    }

    /// Reconnects for up to the request timeout (at least a few seconds).
    async fn reconnect(&self) -> KvResult<MultiplexedConnection> {
        let window = self.config.request_timeout.max(Duration::from_secs(3));
        let deadline = tokio::time::Instant::now() + window;
        RetryPolicy::CLIENT.run(Some(deadline), KvError::is_retryable, || self.connect()).await
    }
}

/// Joins the client's feed at `cursor`, for a watch of `key` (`None`: of a prefix),
/// starting the feed if it is not running.
pub(crate) async fn subscribe(
    slot: &FeedSlot,
    gate: &FeedGate,
    log: &Log,
    cursor: EntryId,
    key: Option<&[u8]>,
) -> KvResult<Joined> {
    if let Some(joined) = lock(slot).as_mut().map(|f| f.join(cursor, key)) {
        return Ok(joined);
    }
    let _starting = gate.lock().await;
    if let Some(joined) = lock(slot).as_mut().map(|f| f.join(cursor, key)) {
        return Ok(joined);
    }
    // Connect before filling the slot: a failure leaves no half-started feed behind.
    let mut conn = log.connect().await?;
    // Start with the log's latest entries, so that watches from a recent revision (the
    // usual "my write + 1") replay from memory.
    let latest: StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(&log.log_key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(PREFILL)
        .query_async(&mut conn)
        .await
        .map_err(|e| log.err(e, "watch: reading the event log"))?;
    let mut recent = Vec::with_capacity(latest.ids.len());
    for id in latest.ids.into_iter().rev() {
        recent.push(Arc::new(log.entry(id)?));
    }
    let (floor, start) = match (recent.first(), recent.last()) {
        (Some(first), Some(last)) => {
            let floor =
                if first.id.1 == 0 { (first.id.0 - 1, u64::MAX) } else { (first.id.0, first.id.1 - 1) };
            (floor, last.id)
        }
        _ => {
            let rev = (log.int_at(&mut conn, &log.rev_key).await?.unwrap_or(0), u64::MAX);
            (rev, rev)
        }
    };
    log.high.saw_revision(start.0);
    let mut state = FeedState::new(floor, start);
    for entry in recent {
        state.remember(entry);
    }
    let joined = state.join(cursor, key);
    *lock(slot) = Some(state);
    tokio::spawn(run(log.clone(), slot.clone(), conn, start));
    Ok(joined)
}

/// Up to `max` entries right after `cursor` from the running feed's memory, for a watch
/// that fell behind the broadcast (`None`: no feed runs, or its memory no longer reaches back
/// to `cursor`; read the log).
pub(crate) fn recent_after(slot: &FeedSlot, cursor: EntryId, max: usize) -> Option<Vec<Arc<Entry>>> {
    lock(slot).as_ref().and_then(|f| f.after(cursor, max))
}

/// What a watch of `key` that fell behind the broadcast takes from the running feed's
/// memory and its kept history ([`Replay::Missing`] when no feed runs).
pub(crate) fn key_after(slot: &FeedSlot, cursor: EntryId, key: &[u8]) -> Replay {
    lock(slot).as_ref().map_or(Replay::Missing, |f| f.after_of_key(cursor, key))
}

/// The oldest revision in the log the running feed knows of (0: none, or it never found a
/// gap): a watch that needs an older one can only end as compacted.
pub(crate) fn compacted(slot: &FeedSlot) -> Revision {
    lock(slot).as_ref().map_or(0, |f| f.compacted)
}

fn lock(slot: &FeedSlot) -> std::sync::MutexGuard<'_, Option<FeedState>> {
    // A panic elsewhere while holding this lock cannot leave the state inconsistent.
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The feed task: tails the log from `cursor` until nobody listens or it fails.
async fn run(log: Log, slot: FeedSlot, mut conn: MultiplexedConnection, mut cursor: EntryId) {
    let failure = loop {
        {
            let mut guard = lock(&slot);
            if guard.as_mut().is_none_or(|f| f.idle()) {
                *guard = None;
                return;
            }
        }
        let (rev, n) = cursor;
        let reply: Result<Option<StreamReadReply>, _> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&log.log_key)
            .arg(format!("{rev}-{n}"))
            .query_async(&mut conn)
            .await;
        if let Err(e) = &reply
            && e.code() == Some("UNBLOCKED")
        {
            // The server changed role under the blocked read (a failover, `REPLICAOF`): the
            // read was cut short, not refused. What it holds now is checked, then read on.
            match log.check_alive(&mut conn).await {
                Ok(()) => {}
                Err(e) if e.is_retryable() => match log.reconnect().await {
                    Ok(c) => conn = c,
                    Err(e) => break e,
                },
                Err(e) => break e,
            }
            continue;
        }
        match reply.map_err(|e| log.err(e, "watch: reading the event log")) {
            Ok(Some(reply)) => {
                let mut entries = Vec::new();
                let mut bad = None;
                for id in reply.keys.into_iter().flat_map(|k| k.ids) {
                    match log.entry(id) {
                        Ok(entry) => entries.push(Arc::new(entry)),
                        Err(e) => {
                            bad = Some(e);
                            break;
                        }
                    }
                }
                let skipped = entries.first().is_some_and(|first| !crate::watch::follows(cursor, first.id));
                // Learnt before the entries after the gap are sent, so that no watch the gap
                // wakes reads the log to find it.
                let oldest = if skipped { Some(log.oldest(&mut conn).await) } else { None };
                if let Some(last) = entries.last() {
                    cursor = last.id;
                    log.high.saw_revision(cursor.0);
                }
                if let Some(feed) = lock(&slot).as_mut() {
                    if let Some(Ok(oldest)) = oldest {
                        feed.compacted = feed.compacted.max(oldest);
                    }
                    feed.push(entries);
                }
                if let Some(e) = bad {
                    break e;
                }
            }
            Ok(None) => match log.check_alive(&mut conn).await {
                Ok(()) => {}
                Err(e) if e.is_retryable() => match log.reconnect().await {
                    Ok(c) => conn = c,
                    Err(e) => break e,
                },
                Err(e) => break e,
            },
            Err(e) if e.is_retryable() => match log.reconnect().await {
                Ok(c) => conn = c,
                Err(e) => break e,
            },
            Err(e) => break e,
        }
    };
    // Empty the slot first, so a new watch starts a fresh feed instead of joining this one.
    if let Some(feed) = lock(&slot).take() {
        feed.send_all(FeedItem::Failed(Arc::new(failure)));
    }
}

pub(crate) fn parse_id(id: &str) -> Option<EntryId> {
    let (rev, n) = id.split_once('-')?;
    Some((rev.parse().ok()?, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::broadcast::error::TryRecvError;

    fn entry(revision: Revision, key: &str) -> Arc<Entry> {
        let kv = KeyValue {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec().into(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: None,
        };
        Arc::new(Entry { id: (revision, 0), event: Event { kind: EventKind::Put, kv } })
    }

    fn batch(revisions: std::ops::RangeInclusive<Revision>, key: &str) -> Vec<Arc<Entry>> {
        revisions.map(|r| entry(r, key)).collect()
    }

    /// The revisions of the next batch `rx` was sent (`None`: it was sent nothing).
    fn received(rx: &mut tokio::sync::broadcast::Receiver<FeedItem>) -> Option<Vec<Revision>> {
        match rx.try_recv() {
            Ok(FeedItem::Entries(batch)) => Some(batch.entries.iter().map(|e| e.id.0).collect()),
            Ok(FeedItem::Failed(e)) => panic!("failed: {e}"),
            Err(TryRecvError::Empty) => None,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_key_is_sent_the_batches_that_hold_it_and_every_batch_that_may_skip_entries() {
        let mut feed = FeedState::new((10, u64::MAX), (10, u64::MAX));
        let mut a = feed.join((10, u64::MAX), Some(b"a")).rx;
        let mut a2 = feed.join((10, u64::MAX), Some(b"a")).rx;
        let mut b = feed.join((10, u64::MAX), Some(b"b")).rx;
        let mut prefix = feed.join((10, u64::MAX), None).rx;

        feed.push(batch(11..=12, "b"));
        assert_eq!(received(&mut a), None, "no `a` in it");
        assert_eq!(received(&mut b), Some(vec![11, 12]));
        assert_eq!(received(&mut prefix), Some(vec![11, 12]));

        let mut mixed = batch(13..=14, "c");
        mixed.push(entry(15, "a"));
        feed.push(mixed);
        for rx in [&mut a, &mut a2, &mut prefix] {
            assert_eq!(received(rx), Some(vec![13, 14, 15]));
        }
        assert_eq!(received(&mut b), None);

        // Revision 16 never reached the feed (trimmed away before it read it): every watch
        // is sent the batch after the hole, to find out for itself.
        feed.push(batch(17..=17, "c"));
        for rx in [&mut a, &mut a2, &mut b, &mut prefix] {
            assert_eq!(received(rx), Some(vec![17]));
        }
        // A hole inside a batch, too.
        feed.push(vec![entry(18, "c"), entry(20, "c")]);
        for rx in [&mut a, &mut a2, &mut b, &mut prefix] {
            assert_eq!(received(rx), Some(vec![18, 20]));
        }
    }

    /// The revisions a replay holds, and where a keyed one leaves the watch's cursor.
    fn replayed(replay: &Replay) -> (&'static str, Vec<Revision>, Option<EntryId>) {
        match replay {
            Replay::Missing => ("missing", vec![], None),
            Replay::All(entries) => ("all", entries.iter().map(|e| e.id.0).collect(), None),
            Replay::Key { entries, through } => {
                ("key", entries.iter().map(|e| e.id.0).collect(), Some(*through))
            }
        }
    }

    #[test]
    fn a_keys_watch_replays_only_its_keys_entries_when_the_memory_has_no_hole() {
        let mut feed = FeedState::new((10, u64::MAX), (10, u64::MAX));
        feed.push(vec![entry(11, "b"), entry(12, "b"), entry(13, "a"), entry(14, "b")]);

        let of_a = feed.join((10, u64::MAX), Some(b"a"));
        assert_eq!(replayed(&of_a.replay), ("key", vec![13], Some((14, 0))));
        let after_a = feed.join((13, u64::MAX), Some(b"a"));
        assert_eq!(replayed(&after_a.replay), ("key", vec![], Some((14, 0))), "nothing of `a` after 13");
        let ahead = feed.join((20, u64::MAX), Some(b"a"));
        assert_eq!(
            replayed(&ahead.replay),
            ("key", vec![], Some((20, u64::MAX))),
            "a cursor past the feed stays"
        );
        let prefix = feed.join((10, u64::MAX), None);
        assert_eq!(replayed(&prefix.replay), ("all", vec![11, 12, 13, 14], None));
        let before = feed.join((9, u64::MAX), Some(b"a"));
        assert_eq!(replayed(&before.replay), ("missing", vec![], None), "the memory starts after 10");

        // Revision 15 never reached the feed: a key's watch across the hole gets everything,
        // to find the hole itself; one from after it, only its key again.
        feed.push(vec![entry(16, "a"), entry(17, "b")]);
        let across = feed.join((12, u64::MAX), Some(b"a"));
        assert_eq!(replayed(&across.replay), ("all", vec![13, 14, 16, 17], None));
        let past = feed.join((16, u64::MAX), Some(b"b"));
        assert_eq!(replayed(&past.replay), ("key", vec![17], Some((17, 0))));
        // A cursor that the first entry after it does not follow is a hole too.
        let short = feed.join((14, u64::MAX), Some(b"a"));
        assert_eq!(replayed(&short.replay), ("all", vec![16, 17], None));
    }

    /// What a key's replay must be, by looking through every entry after the cursor.
    fn replay_by_scan(
        feed: &FeedState,
        cursor: EntryId,
        key: &[u8],
    ) -> (&'static str, Vec<Revision>, Option<EntryId>) {
        if cursor < feed.floor {
            return ("missing", vec![], None);
        }
        let after: Vec<&Arc<Entry>> = feed.recent.iter().filter(|e| e.id > cursor).collect();
        let mut through = cursor;
        for entry in &after {
            if !crate::watch::follows(through, entry.id) {
                return ("all", after.iter().map(|e| e.id.0).collect(), None);
            }
            through = entry.id;
        }
        let of_key = after.iter().filter(|e| e.event.kv.key == key).map(|e| e.id.0).collect();
        ("key", of_key, Some(through))
    }

    /// What a key's replay from before the memory must be, by looking through every entry
    /// ever pushed (`None`: entries after the cursor are missing, so only the log can say).
    fn replay_by_full_scan(
        all: &[Arc<Entry>],
        cursor: EntryId,
        key: &[u8],
    ) -> Option<(&'static str, Vec<Revision>, Option<EntryId>)> {
        let mut through = cursor;
        for entry in all.iter().filter(|e| e.id > cursor) {
            if !crate::watch::follows(through, entry.id) {
                return None;
            }
            through = entry.id;
        }
        let of_key = all.iter().filter(|e| e.id > cursor && e.event.kv.key == key).map(|e| e.id.0).collect();
        Some(("key", of_key, Some(through)))
    }

    proptest::proptest! {
        /// The index of a key's entries and of the holes answers as a scan of the memory
        /// would, while entries are trimmed away (a limit of a few entries), across holes
        /// (revisions the feed never saw) and for cursors before, inside and past the memory.
        /// Before the memory, a watched key (`a`) answers from its kept history as a scan of
        /// every entry would, and does whenever the history holds what was trimmed; a key
        /// nobody watches reads the log.
        #[test]
        fn a_keys_replay_from_the_index_is_the_scans(
            batches in proptest::collection::vec(proptest::collection::vec((0u8..3, 0u8..3, 1i64..3), 1..4), 1..12),
            limit in 1usize..8,
            kept_per_key in 1usize..4,
            cursors in proptest::collection::vec((0i64..40, 0u8..3), 1..8),
        ) {
            let mut feed = FeedState::with_limits((0, u64::MAX), (0, u64::MAX), limit, kept_per_key);
            let _watch_of_a = feed.join((0, u64::MAX), Some(b"a"));
            let (mut revision, mut all, mut holes) = (0, Vec::new(), false);
            for spec in batches {
                let mut entries = Vec::new();
                // (key, 0: a new revision, 1: another entry of the same one, 2: skip one
                // revision (a hole); the step of the revision)
                for (key, how, step) in spec {
                    let key = ["a", "b", "c"][key as usize];
                    let id = match (how, entries.last().map(|e: &Arc<Entry>| e.id)) {
                        (1, Some((r, n))) => (r, n + 1),
                        (2, _) => { revision += step + 1; holes = true; (revision, 0) }
                        _ => { revision += 1; (revision, 0) }
                    };
                    let event = Arc::into_inner(entry(id.0, key)).expect("one owner").event;
                    entries.push(Arc::new(Entry { id, event }));
                }
                all.extend(entries.iter().cloned());
                feed.push(entries);
                for &(at, key) in &cursors {
                    let key = ["a", "b", "c"][key as usize].as_bytes();
                    for cursor in [(at, u64::MAX), (at, 0)] {
                        let got = replayed(&feed.after_of_key(cursor, key));
                        if cursor >= feed.floor {
                            proptest::prop_assert_eq!(got, replay_by_scan(&feed, cursor, key), "cursor {:?}, key {:?}", cursor, key);
                            continue;
                        }
                        let trimmed = all.iter().filter(|e| e.id > cursor && e.id <= feed.floor && e.event.kv.key == key).count();
                        let must_answer = key == b"a" && !holes && trimmed <= kept_per_key && cursor >= (0, u64::MAX);
                        match replay_by_full_scan(&all, cursor, key) {
                            Some(scan) if got.0 == "key" => proptest::prop_assert_eq!(&got, &scan),
                            _ => proptest::prop_assert_eq!(got.0, "missing", "cursor {:?}, key {:?}", cursor, key),
                        }
                        proptest::prop_assert!(!must_answer || got.0 == "key", "cursor {:?}: {:?}", cursor, got);
                        proptest::prop_assert!(key == b"a" || got.0 == "missing", "{:?} is not watched", key);
                    }
                }
            }
            proptest::prop_assert!(feed.seqs_of_key.values().map(VecDeque::len).sum::<usize>() == feed.recent.len());
        }
    }

    #[test]
    fn batches_say_whether_they_follow_the_last_one_sent() {
        let mut feed = FeedState::new((4, u64::MAX), (5, 0));
        let mut rx = feed.join((5, 0), Some(b"a")).rx;
        feed.push(vec![entry(5, "a")]);
        let Ok(FeedItem::Entries(first)) = rx.try_recv() else { panic!("sent nothing") };
        assert!(!first.follows_feed, "5-0 again, after 5-0");
        feed.push(vec![entry(6, "a")]);
        let Ok(FeedItem::Entries(second)) = rx.try_recv() else { panic!("sent nothing") };
        assert!(second.follows_feed && second.contiguous);
    }

    #[test]
    fn the_feed_is_idle_once_no_watch_of_a_key_or_prefix_listens() {
        let mut feed = FeedState::new((0, u64::MAX), (0, u64::MAX));
        let key = feed.join((0, u64::MAX), Some(b"a"));
        let prefix = feed.join((0, u64::MAX), None);
        assert!(!feed.idle());
        drop(prefix);
        assert!(!feed.idle(), "the watch of `a` still listens");
        drop(key);
        assert!(feed.idle());
        assert!(feed.keys.is_empty(), "the channel of `a` is swept");
    }

    #[test]
    fn channels_of_keys_nobody_watches_are_swept() {
        let mut feed = FeedState::new((0, u64::MAX), (0, u64::MAX));
        let _prefix = feed.join((0, u64::MAX), None);
        for i in 0..100 {
            drop(feed.join((0, u64::MAX), Some(format!("k{i}").as_bytes())));
        }
        let kept = feed.join((0, u64::MAX), Some(b"kept"));
        assert_eq!(feed.keys.len(), 101);
        for r in 1..=SWEEP_EVERY as Revision {
            feed.push(vec![entry(r, "x")]);
        }
        assert_eq!(feed.keys.len(), 1, "only `kept` is watched");
        drop(kept);
    }
}
