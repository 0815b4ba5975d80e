//! The errors of the Store: one enum, [`StoreError`], whose variants are the outcomes a
//! caller branches on (a timeout, an empty queue, a counter that is not a number) plus the
//! backend's own error.

use std::time::Duration;

use rdzv_core::KvError;
use rdzv_core::kv::show_key;

/// An error of a [`Store`](crate::Store) operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The operation did not complete within its timeout (the store's
    /// [`timeout`](crate::Store::timeout), or the one passed to `wait`/`barrier`). For a
    /// blocking call, `keys` are the keys that were still missing; for any other call, the
    /// keys it was working on. Nothing was written that calling again would repeat (an
    /// operation whose write was under way reports [`StoreError::OutcomeUnknown`] instead),
    /// except by a [`barrier`](crate::Store::barrier), whose arrival was already counted.
    #[error(
        "`{operation}` timed out after {after:?} on {keys}; check that the process that writes them runs, or raise the store timeout",
        keys = show_keys(keys)
    )]
    Timeout {
        /// The Store operation (`"get"`, `"wait"`, `"queue_pop"`, …).
        operation: &'static str,
        /// The keys concerned, as the caller named them (without any prefix).
        keys: Vec<Vec<u8>>,
        /// The timeout that passed.
        after: Duration,
    },
    /// A non-blocking [`queue_pop`](crate::Store::queue_pop) found the queue empty.
    #[error("queue `{}` is empty; pop with `block = true` to wait for an item", show_key(key))]
    QueueEmpty {
        /// The queue's key.
        key: Vec<u8>,
    },
    /// [`add`](crate::Store::add) found a value that is not a decimal 64-bit integer.
    #[error(
        "key `{}` holds `{}`, not a decimal integer; `add` only works on keys written by `add` or set to a number",
        show_key(key),
        preview(value)
    )]
    NotANumber {
        /// The key.
        key: Vec<u8>,
        /// The value found there.
        value: Vec<u8>,
    },
    /// [`add`](crate::Store::add) would overflow a 64-bit signed integer.
    #[error("adding {delta} to key `{}` (now {current}) overflows a 64-bit integer", show_key(key))]
    Overflow {
        /// The key.
        key: Vec<u8>,
        /// Its current value.
        current: i64,
        /// The delta that did not fit.
        delta: i64,
    },
    /// An argument makes no sense (a barrier of zero ranks, …); the message says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The backend failed; see [`StoreError::is_retryable`].
    #[error("store backend error: {0}")]
    Backend(#[from] KvError),
    /// An operation that is not safe to repeat — [`add`](crate::Store::add),
    /// [`append`](crate::Store::append), [`queue_push`](crate::Store::queue_push),
    /// [`queue_pop`](crate::Store::queue_pop), [`barrier`](crate::Store::barrier) — sent its
    /// write, and the answer did not come back (the backend failed, or the deadline passed):
    /// the write may or may not have taken effect. Calling again may apply it twice (count
    /// twice, append twice, push a second item), and a pop may have removed an item that is
    /// now lost. Not retryable: read the key to learn where it stands.
    #[error(
        "`{operation}` on {keys} may or may not have taken effect: its write was sent, then {reason}; calling it again may apply it twice (read the key to see where it stands)",
        keys = show_keys(keys)
    )]
    OutcomeUnknown {
        /// The Store operation.
        operation: &'static str,
        /// The keys concerned, as the caller named them.
        keys: Vec<Vec<u8>>,
        /// What happened to the write's answer (the backend's error, or the deadline).
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation may succeed because the backend was unreachable
    /// or slow — and is safe: an operation whose write may already have taken effect fails
    /// with [`StoreError::OutcomeUnknown`] instead, which is not retryable. A
    /// [`StoreError::Timeout`] of the Store itself is not counted here: it means nobody
    /// wrote the awaited key in time, which a retry does not fix by itself.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Backend(e) if e.is_retryable())
    }

    /// Whether this is a [`StoreError::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Timeout { .. })
    }
}

fn show_keys(keys: &[Vec<u8>]) -> String {
    let shown: Vec<String> = keys.iter().map(|k| format!("`{}`", show_key(k))).collect();
    match shown.len() {
        0 => "no key".to_owned(),
        1 => format!("key {}", shown.join("")),
        _ => format!("keys {}", shown.join(", ")),
    }
}

/// At most 64 bytes of a value, escaped, for a message.
fn preview(value: &[u8]) -> String {
    const MAX: usize = 64;
    if value.len() <= MAX {
        show_key(value)
    } else {
        format!("{}… ({} bytes)", show_key(&value[..MAX]), value.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_names_the_missing_keys() {
        let e = StoreError::Timeout {
            operation: "wait",
            keys: vec![b"a".to_vec(), b"b\x00".to_vec()],
            after: Duration::from_millis(5),
        };
        let text = e.to_string();
        assert!(text.contains("`a`, `b\\x00`"), "{text}");
        assert!(text.contains("`wait`"), "{text}");
        assert!(e.is_timeout());
        assert!(!e.is_retryable());
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let e = StoreError::NotANumber { key: b"c".to_vec(), value: vec![b'x'; 1000] };
        assert!(e.to_string().contains("(1000 bytes)"));
    }
}
