//! Read-modify-write operations: `add`, `append` and `compare_set`. Each is one atomic
//! step on the backend: a native increment where the backend has one, otherwise a
//! compare-and-swap loop in which a lost swap hands back the winner's value at once.

use rdzv_core::kv::{KeyValue, LeaseId, PutMode, PutOptions};
use rdzv_core::{Kv, KvExt};

use crate::error::StoreError;
use crate::store::{Sent, Store};

/// The result of [`Store::compare_set_checked`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompareSet {
    /// Whether `desired` was written.
    pub swapped: bool,
    /// The value stored now (`desired` if swapped); `None` if the key does not exist.
    pub value: Option<Vec<u8>>,
}

impl Store {
    /// Atomically adds `delta` to the counter at `key` and returns the new value. A missing
    /// key counts as 0. Counters are stored as decimal text, so `get` on one returns e.g.
    /// `b"42"`, and `set(key, b"7")` makes a counter of 7. Fails with
    /// [`StoreError::NotANumber`] if the key holds something else, and
    /// [`StoreError::Overflow`] if the sum does not fit in an `i64`. Not safe to repeat: if
    /// the answer to its write is lost, it fails with [`StoreError::OutcomeUnknown`] (the
    /// count may have been made), never with a retryable error.
    pub async fn add(&self, key: impl AsRef<[u8]>, delta: i64) -> Result<i64, StoreError> {
        let key = key.as_ref();
        let full = self.user_key(key);
        self.bounded_write("add", &[key], self.timeout(), |sent| async move {
            add_at(self.kv().as_ref(), &full, key, delta, self.lease(), &sent).await
        })
        .await
    }

    /// Appends `value` to the bytes stored at `key`, creating it if missing; atomic with
    /// respect to every other writer. Not safe to repeat, like [`Store::add`]: a lost answer
    /// is [`StoreError::OutcomeUnknown`].
    pub async fn append(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let key = key.as_ref();
        let value = value.as_ref();
        let full = self.user_key(key);
        self.bounded_write("append", &[key], self.timeout(), |sent| async move {
            self.kv()
                .compare_and_swap(&full, self.write(PutMode::Overwrite), |current| {
                    let mut next = current.map(|kv| kv.value.to_vec()).unwrap_or_default();
                    next.extend_from_slice(value);
                    sent.mark();
                    Some(next)
                })
                .await?;
            Ok(())
        })
        .await
    }

    /// c10d's `compare_set`: if `key` holds `expected`, or is missing and `expected` is
    /// empty, atomically sets `desired`. Returns the value stored afterwards — except when
    /// the key is missing and `expected` is not empty: then nothing is written and
    /// `expected` itself is returned (c10d's documented quirk, kept for compatibility). Use
    /// [`Store::compare_set_checked`] to learn unambiguously whether the swap happened.
    /// Safe to call again after a retryable error: if the first swap took effect, the key
    /// holds `desired`, so the second writes nothing and returns it.
    pub async fn compare_set(
        &self,
        key: impl AsRef<[u8]>,
        expected: impl AsRef<[u8]>,
        desired: impl AsRef<[u8]>,
    ) -> Result<Vec<u8>, StoreError> {
        let expected = expected.as_ref();
        let outcome = self.compare_set_checked(key, expected, desired).await?;
        Ok(outcome.value.unwrap_or_else(|| expected.to_vec()))
    }

    /// Like [`Store::compare_set`] (same rule for writing), but says whether `desired` was
    /// written and what the key holds now (`None`: missing).
    pub async fn compare_set_checked(
        &self,
        key: impl AsRef<[u8]>,
        expected: impl AsRef<[u8]>,
        desired: impl AsRef<[u8]>,
    ) -> Result<CompareSet, StoreError> {
        let key = key.as_ref();
        let (expected, desired) = (expected.as_ref(), desired.as_ref());
        let full = self.user_key(key);
        self.bounded("compare_set", &[key], self.timeout(), async {
            let mut seen: Option<Vec<u8>> = None;
            let written = self
                .kv()
                .compare_and_swap(&full, self.write(PutMode::Overwrite), |current| {
                    seen = current.map(|kv| kv.value.to_vec());
                    let matches = match current {
                        Some(kv) => kv.value == expected,
                        None => expected.is_empty(),
                    };
                    matches.then(|| desired.to_vec())
                })
                .await?;
            Ok(match written {
                Some((value, _)) => CompareSet { swapped: true, value: Some(value) },
                None => CompareSet { swapped: false, value: seen },
            })
        })
        .await
    }
}

/// `add` on the backend key `full` (`key` is its user name, for errors), written under
/// `lease` if given; `sent` is marked before each write.
pub(crate) async fn add_at(
    kv: &dyn Kv,
    full: &[u8],
    key: &[u8],
    delta: i64,
    lease: Option<LeaseId>,
    sent: &Sent,
) -> Result<i64, StoreError> {
    // A native increment cannot bind the key to a lease: leased counters use the swap.
    let native = if lease.is_none() && kv.capabilities().native_increment {
        sent.mark();
        kv.increment(full, delta).await
    } else {
        Ok(None)
    };
    match native {
        Ok(Some(value)) => return Ok(value),
        // Declined: nothing was written.
        Ok(None) => sent.clear(),
        // A native increment reports a bad value in its own words; say it in the Store's.
        Err(e) if !e.is_retryable() => {
            let current = kv.get(full).await?.kv;
            next_count(current.as_ref(), key, delta)?;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    }
    // The closure runs once per attempt; only the last attempt's verdict matters.
    let mut verdict: Result<i64, StoreError> = Ok(0);
    kv.compare_and_swap(full, PutOptions { mode: PutMode::Overwrite, lease }, |current| {
        verdict = next_count(current, key, delta);
        let next = verdict.as_ref().ok().map(|n| n.to_string().into_bytes());
        if next.is_some() {
            sent.mark();
        }
        next
    })
    .await?;
    verdict
}

fn next_count(current: Option<&KeyValue>, key: &[u8], delta: i64) -> Result<i64, StoreError> {
    let now = match current {
        None => 0,
        Some(kv) => parse_count(&kv.value)
            .ok_or_else(|| StoreError::NotANumber { key: key.to_vec(), value: kv.value.to_vec() })?,
    };
    now.checked_add(delta).ok_or_else(|| StoreError::Overflow { key: key.to_vec(), current: now, delta })
}

/// A counter's value: decimal ASCII, optionally signed.
fn parse_count(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_decimal_text() {
        assert_eq!(parse_count(b"42"), Some(42));
        assert_eq!(parse_count(b"-7"), Some(-7));
        assert_eq!(parse_count(b""), None);
        assert_eq!(parse_count(b"4 2"), None);
        assert_eq!(parse_count(b"\xff"), None);
    }
}
