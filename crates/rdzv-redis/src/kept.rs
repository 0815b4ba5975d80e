//! The history of watched keys beyond the feed's memory: when the feed drops an entry from
//! its recent ones, an entry of a key that a watch of one key listens to moves here, so a
//! watch of that key from before the memory's start replays the key's few entries instead
//! of reading the whole log since.
//!
//! Why: a round appends about 4 entries per worker, so at 98,304 workers one round is
//! 400,000 entries, twelve times what the memory holds. A worker reads the state, then
//! joins, then watches the state from after what it read; by then the others' joins have
//! pushed the memory past its start, and every such watch read the round's log with
//! `XRANGE` on the shared connection: gigabytes of replies, a Redis thread busy for tens
//! of seconds, and the client's lease refreshes answered too late (every session lost).
//! The state key itself changes a few times a round, so its history costs next to nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::feed::{Entry, EntryId, footprint};

/// Entries kept per key; older ones are dropped (a watch from before them reads the log).
pub(crate) const KEPT_ENTRIES: usize = 16;

/// Bytes kept for all keys together (entries counted as in the feed's memory).
const KEPT_BYTES: usize = 16 << 20;

/// One watched key's entries that the feed's memory no longer holds.
#[derive(Debug)]
struct History {
    /// Every entry of the key after this one is in `entries` or still in the feed's memory.
    since: EntryId,
    entries: VecDeque<Arc<Entry>>,
}

/// The histories of the keys watched one by one, bounded in entries per key and in bytes.
#[derive(Debug)]
pub(crate) struct Kept {
    histories: HashMap<Vec<u8>, History>,
    bytes: usize,
    per_key: usize,
}

impl Kept {
    pub fn new(per_key: usize) -> Kept {
        Kept { histories: HashMap::new(), bytes: 0, per_key }
    }

    /// Starts keeping `key`'s history (if not already): the feed's memory holds every entry
    /// after `floor`, its first one.
    pub fn watch(&mut self, key: &[u8], floor: EntryId) {
        if !self.histories.contains_key(key) {
            self.histories.insert(key.to_vec(), History { since: floor, entries: VecDeque::new() });
        }
    }

    /// Stops keeping the keys nobody watches any more.
    pub fn retain(&mut self, watched: impl Fn(&[u8]) -> bool) {
        let bytes = &mut self.bytes;
        self.histories.retain(|key, history| {
            let keep = watched(key);
            if !keep {
                *bytes -= history.entries.iter().map(|e| footprint(e)).sum::<usize>();
            }
            keep
        });
    }

    /// Takes `old`, just dropped from the feed's memory, if its key is kept.
    pub fn dropped(&mut self, old: Arc<Entry>) {
        let Some(history) = self.histories.get_mut(&old.event.kv.key) else { return };
        let size = footprint(&old);
        while history.entries.len() >= self.per_key
            || (self.bytes + size > KEPT_BYTES && !history.entries.is_empty())
        {
            let Some(first) = history.entries.pop_front() else { break };
            self.bytes -= footprint(&first);
            history.since = first.id;
        }
        if self.bytes + size > KEPT_BYTES {
            history.since = old.id;
            return;
        }
        self.bytes += size;
        history.entries.push_back(old);
    }

    /// The feed skipped entries before `at` (dropped from its memory now): no history
    /// reaches back across that.
    pub fn restart(&mut self, at: EntryId) {
        for history in self.histories.values_mut() {
            history.entries.clear();
            history.since = at;
        }
        self.bytes = 0;
    }

    /// `key`'s kept entries after `cursor`, if the history reaches back to it (`None`: it
    /// does not, or the key is not kept). The entries after these are in the feed's memory.
    pub fn after(&self, key: &[u8], cursor: EntryId) -> Option<Vec<Arc<Entry>>> {
        let history = self.histories.get(key).filter(|h| h.since <= cursor)?;
        let from = history.entries.partition_point(|e| e.id <= cursor);
        Some(history.entries.range(from..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdzv_core::kv::{Event, EventKind, KeyValue};

    fn entry(revision: i64, key: &str, value_bytes: usize) -> Arc<Entry> {
        let kv = KeyValue {
            key: key.as_bytes().to_vec(),
            value: vec![0; value_bytes].into(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: None,
        };
        Arc::new(Entry { id: (revision, 0), event: Event { kind: EventKind::Put, kv } })
    }

    fn revisions(entries: Option<Vec<Arc<Entry>>>) -> Option<Vec<i64>> {
        entries.map(|e| e.iter().map(|e| e.id.0).collect())
    }

    #[test]
    fn a_watched_keys_dropped_entries_are_kept_and_others_are_not() {
        let mut kept = Kept::new(4);
        kept.watch(b"state", (10, u64::MAX));
        for r in 11..=14 {
            kept.dropped(entry(r, if r == 12 { "state" } else { "join" }, 1));
        }
        assert_eq!(revisions(kept.after(b"state", (10, u64::MAX))), Some(vec![12]));
        assert_eq!(revisions(kept.after(b"state", (12, 0))), Some(vec![]), "nothing after 12");
        assert_eq!(revisions(kept.after(b"state", (9, u64::MAX))), None, "from before the history");
        assert_eq!(revisions(kept.after(b"join", (10, u64::MAX))), None, "not watched");
    }

    #[test]
    fn a_history_keeps_its_newest_entries_and_says_from_where() {
        let mut kept = Kept::new(2);
        kept.watch(b"k", (0, u64::MAX));
        for r in 1..=5 {
            kept.dropped(entry(r, "k", 1));
        }
        assert_eq!(revisions(kept.after(b"k", (3, 0))), Some(vec![4, 5]));
        assert_eq!(revisions(kept.after(b"k", (2, 0))), None, "3 was dropped: from before it, read the log");
    }

    #[test]
    fn the_bytes_of_all_histories_are_bounded() {
        let mut kept = Kept::new(KEPT_ENTRIES);
        kept.watch(b"a", (0, u64::MAX));
        kept.watch(b"b", (0, u64::MAX));
        let big = KEPT_BYTES / 4;
        kept.dropped(entry(1, "a", big));
        kept.dropped(entry(2, "a", big));
        kept.dropped(entry(3, "b", big));
        assert!(kept.bytes <= KEPT_BYTES);
        kept.dropped(entry(4, "b", big));
        assert!(kept.bytes <= KEPT_BYTES, "{} bytes", kept.bytes);
        assert_eq!(revisions(kept.after(b"b", (3, 0))), Some(vec![4]), "3 made room for 4");
        assert_eq!(revisions(kept.after(b"a", (0, u64::MAX))), Some(vec![1, 2]), "only its own");
        kept.dropped(entry(5, "b", KEPT_BYTES));
        assert!(kept.bytes <= KEPT_BYTES);
        assert_eq!(
            revisions(kept.after(b"b", (4, 0))),
            None,
            "too large to keep: from before it, read the log"
        );
        assert_eq!(revisions(kept.after(b"b", (5, 0))), Some(vec![]));
    }

    #[test]
    fn a_hole_ends_every_history_and_unwatched_keys_are_forgotten() {
        let mut kept = Kept::new(4);
        kept.watch(b"a", (0, u64::MAX));
        kept.watch(b"b", (0, u64::MAX));
        kept.dropped(entry(1, "a", 1));
        kept.restart((5, 0));
        assert_eq!(revisions(kept.after(b"a", (0, u64::MAX))), None);
        assert_eq!(revisions(kept.after(b"a", (5, 0))), Some(vec![]));
        kept.dropped(entry(6, "b", 1));
        kept.retain(|key| key == b"a");
        assert_eq!(revisions(kept.after(b"b", (5, 0))), None);
        assert_eq!(kept.bytes, 0);
    }
}
