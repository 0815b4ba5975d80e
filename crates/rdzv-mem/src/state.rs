//! The store itself, as plain synchronous data: keys, the revision counter, leases, the
//! retained event history and the live watchers. Every method runs under the one lock of
//! [`MemKv`](crate::MemKv) and never awaits.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use rdzv_core::kv::{
    CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, Event, EventKind, KeyValue, LeaseId,
    PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder, RangeResponse, Revision, WatchScope,
    prefix_end,
};
use rdzv_core::{KvError, KvResult};
use tokio::time::Instant;

/// The longest lease TTL (as etcd's): about 285 years.
pub(crate) const MAX_LEASE_TTL: Duration = Duration::from_secs(9_000_000_000);

/// One live lease.
#[derive(Debug)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<Vec<u8>>,
}

/// What a watcher covers; the watchers of one filter are notified together (a write
/// checks each distinct filter once, not each watcher: 4096 watchers of one key cost one
/// comparison per write).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Filter {
    key: Vec<u8>,
    scope: WatchScope,
}

impl Filter {
    fn matches(&self, key: &[u8]) -> bool {
        match self.scope {
            WatchScope::Key => key == self.key.as_slice(),
            WatchScope::Prefix => key.starts_with(&self.key),
        }
    }
}

/// The channel a watcher's stream reads.
type Watcher = UnboundedSender<KvResult<Event>>;

/// Everything the store holds.
#[derive(Debug)]
pub(crate) struct State {
    revision: Revision,
    keys: BTreeMap<Vec<u8>, KeyValue>,
    leases: HashMap<LeaseId, Lease>,
    next_lease: LeaseId,
    /// A lower bound of every lease deadline (keep-alives only move deadlines later), so
    /// that most calls can skip scanning the leases.
    earliest_deadline: Option<Instant>,
    /// Events of the retained revisions, in revision order.
    history: VecDeque<Event>,
    /// The sequence number of `history`'s front event (each event has one, counted from the
    /// store's first).
    history_base: u64,
    /// The sequence numbers of each key's retained events, in order: a watch of one key
    /// from an old revision replays that key's events without visiting the others'. Scanning
    /// the history instead, the handlers of a round that watch the state from the revision
    /// they read it at visited every join and confirmation since: O(N²) per round under the
    /// store's one lock (16,384 workers: 3 s of a re-formed round).
    history_of_key: HashMap<Vec<u8>, VecDeque<u64>>,
    /// Number of distinct revisions in `history`.
    history_revisions: usize,
    /// Keep at most this many revisions of history.
    history_limit: usize,
    /// The oldest revision a watch may start from; older ones are compacted.
    first_available: Revision,
    /// Live watchers by filter.
    watchers: HashMap<Filter, HashMap<u64, Watcher>>,
    next_watcher: u64,
}

impl State {
    pub(crate) fn new(history_limit: usize) -> Self {
        State {
            revision: 0,
            keys: BTreeMap::new(),
            leases: HashMap::new(),
            next_lease: 1,
            earliest_deadline: None,
            history: VecDeque::new(),
            history_base: 0,
            history_of_key: HashMap::new(),
            history_revisions: 0,
            history_limit: history_limit.max(1),
            first_available: 1,
            watchers: HashMap::new(),
            next_watcher: 0,
        }
    }

    pub(crate) fn revision(&self) -> Revision {
        self.revision
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<KeyValue> {
        self.keys.get(key).cloned()
    }

    pub(crate) fn range(&self, prefix: &[u8], options: RangeOptions) -> RangeResponse {
        use std::ops::Bound;
        // The keys under `prefix` are those from it up to (excluding) its successor: no
        // per-key prefix comparison.
        let end = prefix_end(prefix).map_or(Bound::Unbounded, Bound::Excluded);
        let under = self.keys.range::<Vec<u8>, _>((Bound::Included(prefix.to_vec()), end)).map(|(_, kv)| kv);
        let wanted = |kv: &&KeyValue| options.max_create_revision.is_none_or(|max| kv.create_revision <= max);
        if options.count_only {
            let count = under.filter(wanted).count() as u64;
            return RangeResponse { kvs: Vec::new(), count, revision: self.revision };
        }
        let mut matches: Vec<&KeyValue> = under.filter(wanted).collect();
        let count = matches.len() as u64;
        if options.order == RangeOrder::ByCreateRevision {
            matches.sort_by_key(|kv| kv.create_revision);
        }
        let limit = options.limit.unwrap_or(usize::MAX);
        let kvs = matches
            .into_iter()
            .take(limit)
            .map(|kv| {
                let mut kv = kv.clone();
                if options.keys_only {
                    kv.value = Default::default();
                }
                kv
            })
            .collect();
        RangeResponse { kvs, count, revision: self.revision }
    }

    pub(crate) fn put(&mut self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        let current = self.keys.get(key);
        let allowed = match options.mode {
            PutMode::Overwrite => true,
            PutMode::Create => current.is_none(),
            PutMode::Update(rev) => current.is_some_and(|kv| kv.mod_revision == rev),
        };
        if !allowed {
            return Ok(PutOutcome::Conflict { current: current.cloned() });
        }
        if let Some(lease) = options.lease
            && !self.leases.contains_key(&lease)
        {
            return Err(KvError::LeaseNotFound(lease));
        }
        let revision = self.revision + 1;
        let (create_revision, version, old_lease) = match current {
            Some(kv) => (kv.create_revision, kv.version + 1, kv.lease),
            None => (revision, 1, None),
        };
        if let Some(old) = old_lease
            && let Some(lease) = self.leases.get_mut(&old)
        {
            lease.keys.remove(key);
        }
        if let Some(new) = options.lease
            && let Some(lease) = self.leases.get_mut(&new)
        {
            lease.keys.insert(key.to_vec());
        }
        let kv = KeyValue {
            key: key.to_vec(),
            value: rdzv_core::kv::Bytes::copy_from_slice(value),
            create_revision,
            mod_revision: revision,
            version,
            lease: options.lease,
        };
        self.keys.insert(key.to_vec(), kv.clone());
        self.commit(vec![Event { kind: EventKind::Put, kv }]);
        Ok(PutOutcome::Written { revision, create_revision })
    }

    /// Creates `key` and bumps the tally under `tally` (its version, as etcd's is) under one
    /// lock: no other write comes between them.
    pub(crate) fn create_counted(
        &mut self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        if let Some(current) = self.keys.get(key) {
            return Ok(CountedCreate {
                outcome: PutOutcome::Conflict { current: Some(current.clone()) },
                tally: None,
            });
        }
        for lease in [lease, tally_lease].into_iter().flatten() {
            if !self.leases.contains_key(&lease) {
                return Err(KvError::LeaseNotFound(lease));
            }
        }
        let outcome = self.put(key, value, PutOptions { mode: PutMode::Create, lease })?;
        self.put(tally, b"", PutOptions { mode: PutMode::Overwrite, lease: tally_lease })?;
        let count = self.keys.get(tally).map_or(1, |kv| kv.version);
        Ok(CountedCreate { outcome, tally: Some(count as u64) })
    }

    pub(crate) fn delete(&mut self, key: &[u8], mode: DeleteMode) -> DeleteOutcome {
        let current = self.keys.get(key);
        match (mode, current) {
            (DeleteMode::Any, None) => return DeleteOutcome::Missing,
            (DeleteMode::IfRevision(rev), current) if current.is_none_or(|kv| kv.mod_revision != rev) => {
                return DeleteOutcome::Conflict { current: current.cloned() };
            }
            _ => {}
        }
        let revision = self.revision + 1;
        let event = self.remove(key, revision);
        self.commit(event.into_iter().collect());
        DeleteOutcome::Deleted { revision }
    }

    /// Deletes the first `limit` keys under `prefix` (all of them with `usize::MAX`).
    pub(crate) fn delete_prefix(&mut self, prefix: &[u8], limit: usize) -> DeletePrefixResponse {
        let doomed: Vec<Vec<u8>> = self
            .keys
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect();
        self.delete_all(doomed)
    }

    /// Deletes `keys` (all existing) in one revision; nothing is written if there are none.
    fn delete_all(&mut self, keys: Vec<Vec<u8>>) -> DeletePrefixResponse {
        if keys.is_empty() {
            return DeletePrefixResponse { deleted: 0, revision: self.revision };
        }
        let revision = self.revision + 1;
        let events: Vec<Event> = keys.iter().filter_map(|key| self.remove(key, revision)).collect();
        let deleted = events.len() as u64;
        self.commit(events);
        DeletePrefixResponse { deleted, revision: self.revision }
    }

    /// Removes one key (detaching it from its lease) and returns its delete event.
    fn remove(&mut self, key: &[u8], revision: Revision) -> Option<Event> {
        let kv = self.keys.remove(key)?;
        if let Some(id) = kv.lease
            && let Some(lease) = self.leases.get_mut(&id)
        {
            lease.keys.remove(key);
        }
        Some(Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: kv.key,
                value: Default::default(),
                create_revision: 0,
                mod_revision: revision,
                version: 0,
                lease: None,
            },
        })
    }

    /// Records the events of one write (all carrying revision `self.revision + 1`): bumps
    /// the revision, appends to the history (trimming it to the limit) and notifies watchers.
    fn commit(&mut self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        self.revision += 1;
        self.watchers.retain(|filter, watchers| {
            for event in events.iter().filter(|e| filter.matches(&e.kv.key)) {
                // A failed send: the stream was dropped; forget the watcher.
                watchers.retain(|_, tx| tx.unbounded_send(Ok(event.clone())).is_ok());
            }
            !watchers.is_empty()
        });
        let first = self.history_base + self.history.len() as u64;
        for (seq, event) in (first..).zip(&events) {
            match self.history_of_key.get_mut(&event.kv.key) {
                Some(seqs) => seqs.push_back(seq),
                None => {
                    self.history_of_key.insert(event.kv.key.clone(), VecDeque::from([seq]));
                }
            }
        }
        self.history.extend(events);
        self.history_revisions += 1;
        while self.history_revisions > self.history_limit {
            self.drop_oldest_revision();
        }
    }

    fn drop_oldest_revision(&mut self) {
        let Some(oldest) = self.history.front().map(Event::revision) else {
            return;
        };
        while self.history.front().is_some_and(|e| e.revision() == oldest) {
            let Some(event) = self.history.pop_front() else { break };
            // A key's oldest retained event is the history's oldest of that key.
            if let Some(seqs) = self.history_of_key.get_mut(&event.kv.key) {
                seqs.pop_front();
                if seqs.is_empty() {
                    self.history_of_key.remove(&event.kv.key);
                }
            }
            self.history_base += 1;
        }
        self.history_revisions -= 1;
        self.first_available = oldest + 1;
    }

    /// Discards history before `revision`.
    pub(crate) fn compact(&mut self, revision: Revision) -> KvResult<()> {
        if revision > self.revision {
            return Err(KvError::InvalidArgument(format!(
                "cannot compact at revision {revision}: the store is only at revision {}",
                self.revision
            )));
        }
        while self.history.front().is_some_and(|e| e.revision() < revision) {
            self.drop_oldest_revision();
        }
        self.first_available = self.first_available.max(revision);
        Ok(())
    }

    pub(crate) fn first_available(&self) -> Revision {
        self.first_available
    }

    /// Registers a watcher after queueing the retained events from `start` on, so that it
    /// sees every later write exactly once; returns what [`State::unwatch`] takes. Fails with
    /// `Compacted` if `start` is too old.
    pub(crate) fn watch(
        &mut self,
        key: &[u8],
        scope: WatchScope,
        start: Revision,
        tx: UnboundedSender<KvResult<Event>>,
    ) -> KvResult<(Filter, u64)> {
        let start = start.max(1);
        if start < self.first_available {
            return Err(KvError::Compacted { requested: start, oldest: self.first_available });
        }
        let filter = Filter { key: key.to_vec(), scope };
        // The receiver is alive: it is in the caller's hands.
        let replay = |event: &Event| {
            let _ = tx.unbounded_send(Ok(event.clone()));
        };
        match scope {
            WatchScope::Key => {
                if let Some(seqs) = self.history_of_key.get(key) {
                    let event = |seq: u64| &self.history[(seq - self.history_base) as usize];
                    let from = seqs.partition_point(|&seq| event(seq).revision() < start);
                    seqs.range(from..).map(|&seq| event(seq)).for_each(replay);
                }
            }
            WatchScope::Prefix => {
                // The history is in revision order: skip to `start` instead of scanning it all.
                let from = self.history.partition_point(|e| e.revision() < start);
                self.history.range(from..).filter(|e| filter.matches(&e.kv.key)).for_each(replay);
            }
        }
        let id = self.next_watcher;
        self.next_watcher += 1;
        self.watchers.entry(filter.clone()).or_default().insert(id, tx);
        Ok((filter, id))
    }

    /// Forgets the watcher `id` of `filter` (its stream was dropped).
    pub(crate) fn unwatch(&mut self, filter: &Filter, id: u64) {
        if let Some(watchers) = self.watchers.get_mut(filter) {
            watchers.remove(&id);
            if watchers.is_empty() {
                self.watchers.remove(filter);
            }
        }
    }

    pub(crate) fn watcher_count(&self) -> usize {
        self.watchers.values().map(HashMap::len).sum()
    }

    pub(crate) fn lease_grant(&mut self, ttl: Duration, now: Instant) -> KvResult<LeaseId> {
        let deadline = now.checked_add(ttl).filter(|_| ttl <= MAX_LEASE_TTL).ok_or_else(|| {
            KvError::InvalidArgument(format!(
                "lease TTL {ttl:?} is too long; the longest is {MAX_LEASE_TTL:?}"
            ))
        })?;
        let id = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(id, Lease { ttl, deadline, keys: BTreeSet::new() });
        self.earliest_deadline = Some(self.earliest_deadline.map_or(deadline, |e| e.min(deadline)));
        Ok(id)
    }

    pub(crate) fn lease_keep_alive(&mut self, id: LeaseId, now: Instant) -> KvResult<Duration> {
        let lease = self.leases.get_mut(&id).ok_or(KvError::LeaseNotFound(id))?;
        // Cannot overflow: the grant checked `now + ttl` with a TTL of at most MAX_LEASE_TTL.
        lease.deadline = now.checked_add(lease.ttl).unwrap_or(lease.deadline);
        Ok(lease.ttl)
    }

    pub(crate) fn lease_revoke(&mut self, id: LeaseId) -> KvResult<()> {
        let lease = self.leases.remove(&id).ok_or(KvError::LeaseNotFound(id))?;
        self.delete_all(lease.keys.into_iter().collect());
        Ok(())
    }

    /// Ends every lease whose deadline is at or before `now`, earliest first (ties by id),
    /// each deleting its keys in one revision. Returns when to look again: a time after `now`
    /// and at or before the next deadline, or `None` without leases.
    pub(crate) fn expire_leases(&mut self, now: Instant) -> Option<Instant> {
        if self.earliest_deadline.is_none_or(|earliest| earliest > now) {
            return self.earliest_deadline;
        }
        let mut due: Vec<(Instant, LeaseId)> =
            self.leases.iter().filter(|(_, l)| l.deadline <= now).map(|(id, l)| (l.deadline, *id)).collect();
        due.sort();
        for (_, id) in due {
            if let Some(lease) = self.leases.remove(&id) {
                tracing::trace!(lease = id, keys = lease.keys.len(), "mem lease expired");
                self.delete_all(lease.keys.into_iter().collect());
            }
        }
        self.earliest_deadline = self.leases.values().map(|l| l.deadline).min();
        self.earliest_deadline
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What a watch of `key` from `start` is handed at once (its replay).
    fn replayed(
        state: &mut State,
        key: &[u8],
        scope: WatchScope,
        start: Revision,
    ) -> Vec<(Vec<u8>, Revision)> {
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        let (filter, id) = state.watch(key, scope, start, tx).expect("a retained revision");
        state.unwatch(&filter, id);
        let mut events = Vec::new();
        while let Ok(event) = rx.try_recv() {
            let event = event.expect("an event");
            let revision = event.revision();
            events.push((event.kv.key, revision));
        }
        events
    }

    proptest! {
        /// A key's watch replays what a scan of the history would find, however the history
        /// was trimmed (by its limit or a compaction) and whatever else was written.
        #[test]
        fn a_keys_replay_is_the_historys_events_of_that_key(
            writes in proptest::collection::vec((0u8..4, 0u8..3), 1..80),
            limit in 1usize..20,
            compact_at in proptest::option::of(0usize..80),
        ) {
            let mut state = State::new(limit);
            let key = |k: u8| vec![b'k', b'0' + k];
            for (i, (k, op)) in writes.iter().enumerate() {
                match op {
                    0 => { state.delete(&key(*k), DeleteMode::Any); }
                    1 => { state.delete_prefix(b"k", usize::MAX); }
                    _ => { state.put(&key(*k), b"v", PutOptions::OVERWRITE).expect("put"); }
                }
                if compact_at == Some(i) {
                    state.compact(state.revision()).expect("compact");
                }
            }
            for k in 0..4 {
                for start in state.first_available..=state.revision() + 1 {
                    let all = replayed(&mut state, b"k", WatchScope::Prefix, start);
                    let of_key: Vec<_> = all.into_iter().filter(|(name, _)| *name == key(k)).collect();
                    prop_assert_eq!(replayed(&mut state, &key(k), WatchScope::Key, start), of_key);
                }
            }
        }
    }

    #[test]
    fn ranges_stop_at_the_prefix_end() {
        let mut state = State::new(10);
        for key in [&b"a"[..], b"a\xff", b"a\xff\x00", b"a\xff\xff", b"b", b"\xff\xff\x01"] {
            state.put(key, b"v", PutOptions::OVERWRITE).expect("put");
        }
        let keys = |prefix: &[u8]| -> Vec<Vec<u8>> {
            state.range(prefix, RangeOptions::default()).kvs.into_iter().map(|kv| kv.key).collect()
        };
        assert_eq!(keys(b"a\xff"), vec![b"a\xff".to_vec(), b"a\xff\x00".to_vec(), b"a\xff\xff".to_vec()]);
        assert_eq!(keys(b"\xff\xff"), vec![b"\xff\xff\x01".to_vec()]);
        assert_eq!(keys(b"").len(), 6);
        let count = state.range(b"a", RangeOptions { count_only: true, ..RangeOptions::default() }).count;
        assert_eq!(count, 4);
    }
}
