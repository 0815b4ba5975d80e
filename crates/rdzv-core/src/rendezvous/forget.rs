//! Deleting the rounds nobody can be in any more (docs/PROTOCOL.md "Creating a round"), so
//! that the keys under a run stay bounded however many rounds pass.
//!
//! Round numbers have gaps (a version handed out whose round was never opened, rounds that
//! never became final), and a creator's own deletes may be lost (its answer to `joinable`
//! lost, or the creator dead before its background deletes ran). So which rounds are left is
//! not derived from the new round's number: the run keeps a record, `rdzv/forgotten`, of how
//! far the deletes got, and each creator deletes from there.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::ext::KvExt;
use crate::kv::{Event, EventKind, KeyValue, Kv, KvResult, LeaseId, PutMode, PutOptions, WatchScope};
use crate::retry::RetryPolicy;
use crate::wait::{Reading, Start, Wait};

use super::keys::RunKeys;
use super::state::State;

/// How long the creator of a round keeps trying to delete the old rounds when the backend
/// fails it; after that, the next creator deletes them (the record was not advanced).
pub(crate) const FORGET_RETRY_FOR: Duration = Duration::from_secs(60);

/// At most this many rounds are deleted by one creator: a record far behind (or none, in a
/// run started by an older release) costs one bounded burst of deletes, not one per round the
/// run ever had.
pub const MAX_ROUNDS_FORGOTTEN_AT_ONCE: u64 = 64;

/// How long the deletes wait for the round just opened to be settled (final, a later round
/// under way, or the run closed) before they start anyway.
pub const FORGET_WAIT_FOR: Duration = Duration::from_secs(600);

/// The most keys one delete takes: a round of thousands of workers is deleted a piece of
/// this many keys at a time ([`Kv::delete_prefix_limited`]). etcd applies one delete of
/// thousands of keys (each detached from its lease) for seconds, and every request it answers
/// meanwhile (lease refreshes included) copies the writes not yet committed: one delete of a
/// whole 8,192-worker round (about 25,000 keys) stalled it for six seconds and lost the
/// sessions of the round being formed.
pub const KEYS_PER_DELETE: usize = 256;
/// How long the deletes pause after a full piece, before the next one: they run beside the
/// next rounds, and take at most this share of the server (about 2,500 keys a second).
pub const PAUSE_BETWEEN_DELETES: Duration = Duration::from_millis(100);

/// The prefixes round `old` is deleted by: its join, keep-alive and waiting keys (a few per
/// worker each), then whatever is left of it (tallies, extra data, Store).
fn pieces(keys: &RunKeys, old: u64) -> [Vec<u8>; 4] {
    [keys.joins(old), keys.ranks(old), keys.waiting(old), keys.round(old).into_bytes()]
}

/// The record `rdzv/forgotten`: every round below `below` is deleted, except `kept` (the
/// round whose members were the survivors when it was written: its keep-alive keys tell
/// which of them are alive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forgotten {
    /// Every round below this one is deleted, except `kept`.
    pub below: u64,
    /// The round below `below` that was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
}

impl Forgotten {
    /// The record as stored.
    pub fn to_bytes(self) -> Vec<u8> {
        serde_json::to_vec(&self).expect("a record of two numbers serializes")
    }

    /// A stored record; `None` if it is not one (then deletes start as if there were none).
    pub fn parse(bytes: &[u8]) -> Option<Forgotten> {
        serde_json::from_slice(bytes).ok()
    }
}

/// Which rounds the creator of round `version` deletes, given the round that was final before
/// it (`previous`, kept: the survivors' keep-alive keys tell who is alive) and the record of
/// what earlier creators deleted: the record's `kept` round, and every round from the
/// record's `below` up to `version` (at most [`MAX_ROUNDS_FORGOTTEN_AT_ONCE`] of them),
/// except `previous`. A creator that does not know `previous` deletes nothing: any earlier
/// round may be the one whose survivors are about to join.
pub fn rounds_to_forget(version: u64, previous: Option<u64>, record: Option<Forgotten>) -> Vec<u64> {
    let Some(previous) = previous.filter(|p| *p < version) else {
        return Vec::new();
    };
    let lowest = version.saturating_sub(MAX_ROUNDS_FORGOTTEN_AT_ONCE - 1).max(1);
    let from = record.map_or(lowest, |r| r.below.max(lowest));
    let kept = record.and_then(|r| r.kept).filter(|k| *k < from);
    kept.into_iter().chain(from..version).filter(|v| *v != previous).collect()
}

/// The record after the creator of round `version` deleted [`rounds_to_forget`]'s rounds.
pub fn record_after(version: u64, previous: u64) -> Forgotten {
    Forgotten { below: version, kept: Some(previous) }
}

/// In the background, once round `version` is settled ([`RoundSettled`], at most
/// [`FORGET_WAIT_FOR`] of waiting: off the round's critical path, and not while its members
/// join): the creator of round `version` deletes the rounds nobody can be in any more
/// (their join, keep-alive and waiting keys, extra data and Store: deletes of at most
/// [`KEYS_PER_DELETE`] keys, [`PAUSE_BETWEEN_DELETES`] apart), then advances the record,
/// bound to the run lease `run_lease`. Each delete is retried with a backoff for up to
/// [`FORGET_RETRY_FOR`]; if one still fails, the record stays where it was and the next
/// creator deletes those rounds.
pub(crate) fn forget_old_rounds(
    kv: std::sync::Arc<dyn Kv>,
    keys: &RunKeys,
    version: u64,
    previous: u64,
    run_lease: Option<LeaseId>,
) {
    let keys = keys.clone();
    tokio::spawn(async move {
        // Off the critical path of the round too: its members are joining now, and on etcd
        // a delete of thousands of keys stalls every write (and lease refresh) behind it.
        let settled = RoundSettled { kv: &*kv, key: keys.state(), version };
        let _ = tokio::time::timeout(FORGET_WAIT_FOR, kv.wait_until(settled, Start::Read)).await;
        let record_key = keys.forgotten();
        let Some(read) = keep_trying(version, || kv.get(&record_key)).await else {
            return;
        };
        let existing = read.kv;
        let record = existing.as_ref().and_then(|kv| Forgotten::parse(&kv.value));
        for old in rounds_to_forget(version, Some(previous), record) {
            for prefix in pieces(&keys, old) {
                if !delete_all_of(&*kv, &prefix, old).await {
                    return;
                }
            }
        }
        // Advanced only if nobody else moved it since the read: a later creator that did has
        // deleted at least as much; an earlier one that did only makes the next creator
        // repeat deletes that find nothing.
        let mode = match &existing {
            Some(found) => PutMode::Update(found.mod_revision),
            None => PutMode::Create,
        };
        let value = record_after(version, previous).to_bytes();
        if let Err(e) = kv.put(&record_key, &value, PutOptions { mode, lease: run_lease }).await {
            tracing::debug!(error = %e, version, "could not record which rounds are deleted");
        }
    });
}

/// Deletes every key under `prefix` (of round `round`), a piece of at most
/// [`KEYS_PER_DELETE`] keys at a time, [`PAUSE_BETWEEN_DELETES`] after each full piece;
/// `false` if a delete kept failing ([`keep_trying`]). Only a piece that deletes nothing
/// ends it: a piece may come up short while keys remain (on etcd a listed key whose lease
/// expired before the delete is not counted, and the keys after the listed ones are not
/// touched).
async fn delete_all_of(kv: &dyn Kv, prefix: &[u8], round: u64) -> bool {
    loop {
        let Some(piece) = keep_trying(round, || kv.delete_prefix_limited(prefix, KEYS_PER_DELETE)).await
        else {
            return false;
        };
        if piece.deleted == 0 {
            return true;
        }
        if piece.deleted >= KEYS_PER_DELETE as u64 {
            tokio::time::sleep(PAUSE_BETWEEN_DELETES).await;
        }
    }
}

/// The wait for round `version` to be settled: final (or a later round under way, or the
/// run closed or gone), so that its members are no longer joining and confirming.
struct RoundSettled<'a> {
    kv: &'a dyn Kv,
    key: Vec<u8>,
    version: u64,
}

impl RoundSettled<'_> {
    fn settled(&self, found: Option<&KeyValue>) -> bool {
        let Some(found) = found else { return true };
        match State::parse_header(&self.key, &found.value) {
            Ok(State::Final { version, .. }) => version >= self.version,
            Ok(State::Closed { .. }) | Err(_) => true,
            Ok(other) => other.version().is_some_and(|v| v > self.version),
        }
    }
}

impl Wait for RoundSettled<'_> {
    type Output = ();

    fn watched(&self) -> Vec<(Vec<u8>, WatchScope)> {
        vec![(self.key.clone(), WatchScope::Key)]
    }

    async fn read(&mut self) -> KvResult<Reading<()>> {
        let read = self.kv.get(&self.key).await?;
        Ok(if self.settled(read.kv.as_ref()) { Reading::Done(()) } else { Reading::Pending(read.revision) })
    }

    async fn event(&mut self, _: usize, event: Event) -> KvResult<Option<()>> {
        let found = (event.kind == EventKind::Put).then_some(&event.kv);
        Ok(self.settled(found).then_some(()))
    }
}

/// `op` until it succeeds, retried after any failure ([`RetryPolicy::PROTOCOL`]) for up to
/// [`FORGET_RETRY_FOR`]; `None` if it never did. `round`: which round the failures are
/// logged under.
async fn keep_trying<T, F, Fut>(round: u64, op: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::kv::KvResult<T>>,
{
    let give_up = Instant::now() + FORGET_RETRY_FOR;
    let retry = |e: &crate::KvError| {
        tracing::debug!(error = %e, round, "could not delete an old round's keys yet");
        true
    };
    match RetryPolicy::PROTOCOL.run(Some(give_up), retry, op).await {
        Ok(done) => Some(done),
        Err(e) => {
            tracing::warn!(error = %e, round, "gave up deleting old rounds' keys; the next round's creator will");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(below: u64, kept: u64) -> Option<Forgotten> {
        Some(Forgotten { below, kept: Some(kept) })
    }

    #[test]
    fn without_a_record_the_creator_deletes_every_round_below_except_the_previous_one() {
        assert_eq!(rounds_to_forget(1, None, None), Vec::<u64>::new());
        assert_eq!(rounds_to_forget(2, Some(1), None), Vec::<u64>::new());
        assert_eq!(rounds_to_forget(5, Some(4), None), [1, 2, 3]);
        assert_eq!(rounds_to_forget(6, Some(4), None), [1, 2, 3, 5]);
    }

    #[test]
    fn with_a_record_the_creator_deletes_from_where_the_last_one_stopped() {
        // Rounds 1..=4 final in turn: each creator deletes one round.
        assert_eq!(rounds_to_forget(3, Some(2), rec(2, 1)), [1]);
        assert_eq!(rounds_to_forget(4, Some(3), rec(3, 2)), [2]);
        // Round 5 never became final: round 6 keeps 4's members' keys, deletes 3 and 5.
        assert_eq!(rounds_to_forget(6, Some(4), rec(5, 4)), [5]);
        assert_eq!(rounds_to_forget(6, Some(4), rec(4, 3)), [3, 5]);
    }

    #[test]
    fn gaps_in_the_versions_do_not_leave_rounds_behind() {
        // 5 final, 6 handed out but never opened, 7 final after 5: the round before 7's
        // previous is 5, not 6. (The rule "previous - 1" left round 5 forever.)
        assert_eq!(rounds_to_forget(8, Some(7), rec(7, 5)), [5]);
        // Creators of 8 and 9 lost their answers and deleted nothing: 10 deletes all of it.
        assert_eq!(rounds_to_forget(10, Some(9), rec(7, 5)), [5, 7, 8]);
    }

    #[test]
    fn a_creator_that_does_not_know_the_previous_round_deletes_nothing() {
        assert_eq!(rounds_to_forget(9, None, rec(7, 5)), Vec::<u64>::new());
        assert_eq!(rounds_to_forget(9, Some(9), rec(7, 5)), Vec::<u64>::new());
    }

    #[test]
    fn one_creator_deletes_a_bounded_number_of_rounds() {
        let versions = rounds_to_forget(1000, Some(999), None);
        assert!(versions.len() as u64 <= MAX_ROUNDS_FORGOTTEN_AT_ONCE, "{versions:?}");
        assert_eq!(versions.last(), Some(&998));
        let versions = rounds_to_forget(1000, Some(999), rec(10, 3));
        assert!(versions.len() as u64 <= MAX_ROUNDS_FORGOTTEN_AT_ONCE, "{versions:?}");
        assert_eq!(versions.first(), Some(&3));
    }

    #[test]
    fn a_record_that_is_not_one_reads_as_none() {
        assert_eq!(Forgotten::parse(b"7"), None);
        let r = Forgotten { below: 7, kept: Some(5) };
        assert_eq!(Forgotten::parse(&r.to_bytes()), Some(r));
        assert_eq!(r.to_bytes(), br#"{"below":7,"kept":5}"#);
    }
}
