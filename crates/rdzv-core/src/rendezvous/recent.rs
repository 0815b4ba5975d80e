//! [`Recent`]: what a process worked out about the last few shared lists, found again by the
//! lists' addresses.
//!
//! The thousands of handlers of one process that form a round together receive the same
//! `Arc` of each member list (`State::parse` shares it), so what one of them derives from a
//! list (a rank index, the changes since the round before) is worked out once and handed to
//! the others.

use std::collections::VecDeque;
use std::sync::Mutex;

/// The last [`Recent::KEEP`] results, each with its key. A key holds the `Arc`s it was
/// worked out from, so that their addresses are not reused for other lists while the entry
/// lasts: the same addresses are then the same lists.
pub(super) struct Recent<K, V> {
    entries: Mutex<VecDeque<(K, V)>>,
}

impl<K, V: Clone> Recent<K, V> {
    const KEEP: usize = 4;

    pub(super) fn new() -> Recent<K, V> {
        Recent { entries: Mutex::new(VecDeque::new()) }
    }

    /// The value of the entry whose key `is_key`, else `make()`'s, which is then kept (the
    /// oldest entry makes room). `make` runs under the lock: the other handlers of the
    /// process want the same value, and would otherwise each work it out too.
    pub(super) fn get_or_make(&self, is_key: impl Fn(&K) -> bool, make: impl FnOnce() -> (K, V)) -> V {
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, value)) = entries.iter().find(|(key, _)| is_key(key)) {
            return value.clone();
        }
        let (key, value) = make();
        if entries.len() == Self::KEEP {
            entries.pop_front();
        }
        entries.push_back((key, value.clone()));
        value
    }
}
