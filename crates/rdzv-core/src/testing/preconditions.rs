//! Puts and deletes with preconditions: a failed precondition is an outcome carrying the
//! current key, never an error.

use std::sync::Arc;

use super::{key, put, within};
use crate::kv::{DeleteMode, DeleteOutcome, Kv, PutMode, PutOptions, PutOutcome};

/// Create-if-absent on an existing key returns that key, unchanged.
pub async fn create_if_absent_conflict_returns_current(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let first = within("create", kv.put(&k, b"first", PutOptions::new(PutMode::Create))).await.expect("put");
    let PutOutcome::Written { revision, .. } = first else { panic!("create of a new key: {first:?}") };
    let second =
        within("second create", kv.put(&k, b"second", PutOptions::new(PutMode::Create))).await.expect("put");
    let PutOutcome::Conflict { current: Some(current) } = second else {
        panic!("create of an existing key must conflict with it: {second:?}");
    };
    assert_eq!(
        (current.key, current.value.to_vec(), current.mod_revision),
        (k.clone(), b"first".to_vec(), revision)
    );
    let now = within("get", kv.get(&k)).await.expect("get").kv.expect("exists");
    assert_eq!(now.value, &b"first"[..], "a failed create must not write");
}

/// Many tasks create the same key at once: exactly one wins, every loser gets the winner's
/// key in its conflict.
pub async fn create_if_absent_race_has_one_winner(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "leader");
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let kv = kv.clone();
            let k = k.clone();
            tokio::spawn(async move {
                let value = format!("candidate-{i}").into_bytes();
                let outcome = within("racing create", kv.put(&k, &value, PutOptions::new(PutMode::Create)))
                    .await
                    .expect("create");
                (value, outcome)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(within("joining a racer", task).await.expect("racer task"));
    }
    let winners: Vec<_> = outcomes.iter().filter(|(_, o)| o.is_written()).collect();
    assert_eq!(winners.len(), 1, "exactly one create must win: {outcomes:?}");
    let (winner_value, winner) = winners[0];
    let PutOutcome::Written { revision, .. } = winner else { unreachable!() };
    for (_, outcome) in outcomes.iter().filter(|(_, o)| !o.is_written()) {
        let PutOutcome::Conflict { current: Some(current) } = outcome else {
            panic!("a losing create must see the winner's key: {outcome:?}");
        };
        assert_eq!((&current.value.to_vec(), current.mod_revision), (winner_value, *revision));
    }
}

/// A swap on a stale revision fails and returns the winner's key.
pub async fn swap_on_stale_revision_returns_winner(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let base = put(&*kv, &k, b"base").await;
    let won = within("first swap", kv.put(&k, b"winner", PutOptions::new(PutMode::Update(base))))
        .await
        .expect("put");
    let PutOutcome::Written { revision: won_at, create_revision } = won else {
        panic!("swap on the current revision must win: {won:?}");
    };
    assert_eq!(create_revision, base, "an update keeps the create revision");
    let lost = within("stale swap", kv.put(&k, b"loser", PutOptions::new(PutMode::Update(base))))
        .await
        .expect("put");
    let PutOutcome::Conflict { current: Some(current) } = lost else {
        panic!("swap on a stale revision must conflict: {lost:?}");
    };
    assert_eq!(
        (current.value.to_vec(), current.mod_revision, current.version),
        (b"winner".to_vec(), won_at, 2)
    );
    let next = within(
        "swap on the winner's revision",
        kv.put(&k, b"next", PutOptions::new(PutMode::Update(won_at))),
    )
    .await
    .expect("put");
    assert!(next.is_written(), "swap on the revision learnt from a conflict must win: {next:?}");
}

/// An update of a missing key conflicts with `None`.
pub async fn update_of_missing_key_conflicts_with_none(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "missing");
    let r = put(&*kv, &key(&ns, "other"), b"").await;
    let outcome = within("update", kv.put(&k, b"v", PutOptions::new(PutMode::Update(r)))).await.expect("put");
    assert_eq!(outcome, PutOutcome::Conflict { current: None });
    assert_eq!(within("get", kv.get(&k)).await.expect("get").kv, None, "a failed update must not create");
}

/// Deleting a missing key reports `Missing`.
pub async fn delete_of_missing_key_is_missing(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let outcome = within("delete", kv.delete(&key(&ns, "nothing"), DeleteMode::Any)).await.expect("delete");
    assert_eq!(outcome, DeleteOutcome::Missing);
}

/// A delete on a stale revision conflicts with the current key and deletes nothing.
pub async fn delete_on_stale_revision_returns_current(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let old = put(&*kv, &k, b"old").await;
    let new = put(&*kv, &k, b"new").await;
    let outcome = within("delete", kv.delete(&k, DeleteMode::IfRevision(old))).await.expect("delete");
    let DeleteOutcome::Conflict { current: Some(current) } = outcome else {
        panic!("delete on a stale revision must conflict: {outcome:?}");
    };
    assert_eq!((current.value.to_vec(), current.mod_revision), (b"new".to_vec(), new));
    assert!(within("get", kv.get(&k)).await.expect("get").kv.is_some(), "a failed delete must not delete");
}

/// A delete on the current revision deletes, at a new revision.
pub async fn delete_on_current_revision_deletes(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let r = put(&*kv, &k, b"v").await;
    let outcome = within("delete", kv.delete(&k, DeleteMode::IfRevision(r))).await.expect("delete");
    let DeleteOutcome::Deleted { revision } = outcome else {
        panic!("delete on the current revision: {outcome:?}")
    };
    assert!(revision > r);
    let read = within("get", kv.get(&k)).await.expect("get");
    assert_eq!(read.kv, None);
    assert!(read.revision >= revision);
}

/// A conditional delete of a missing key conflicts with `None`.
pub async fn delete_on_revision_of_missing_key_conflicts_with_none(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let r = put(&*kv, &k, b"v").await;
    within("delete", kv.delete(&k, DeleteMode::Any)).await.expect("delete");
    let outcome =
        within("conditional delete", kv.delete(&k, DeleteMode::IfRevision(r))).await.expect("delete");
    assert_eq!(outcome, DeleteOutcome::Conflict { current: None });
}

/// `create_counted`, where the backend's capabilities say it can: a burst of creations each
/// gets a distinct tally, `1..=n` in the order of their revisions; a create that conflicts
/// returns the key that is there and leaves the tally alone; the key is bound to its lease and
/// the tally to its own; a missing lease (the key's or the tally's) is `LeaseNotFound` naming
/// it, and nothing is written; the tally ends with its lease and then counts from 1 again.
/// Where the capabilities say it cannot, it fails with `Unsupported`.
pub async fn create_counted_tallies_each_creation(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let tally = key(&ns, "tally");
    let ttl = super::lease_ttl(&*kv) * 30;
    let session = within("granting a lease", kv.lease_grant(ttl)).await.expect("grant");
    let tally_lease = within("granting a lease", kv.lease_grant(ttl)).await.expect("grant");
    if !kv.capabilities().counted_create {
        let refused = kv.create_counted(&key(&ns, "k"), b"", Some(session), &tally, Some(tally_lease)).await;
        assert!(matches!(refused, Err(crate::KvError::Unsupported { .. })), "{refused:?}");
        return;
    }
    let n = 20;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (kv, k, tally) = (kv.clone(), key(&ns, &format!("k{i:02}")), tally.clone());
            tokio::spawn(async move {
                within(
                    "counted create",
                    kv.create_counted(&k, b"me", Some(session), &tally, Some(tally_lease)),
                )
                .await
                .expect("counted create")
            })
        })
        .collect();
    let mut created = Vec::new();
    for task in tasks {
        let counted = task.await.expect("task");
        let PutOutcome::Written { create_revision, .. } = counted.outcome else {
            panic!("a create of a new key must write: {counted:?}");
        };
        created.push((create_revision, counted.tally.expect("a create that wrote has a tally")));
    }
    created.sort_unstable();
    let tallies: Vec<u64> = created.iter().map(|&(_, tally)| tally).collect();
    assert_eq!(tallies, (1..=n).collect::<Vec<_>>(), "tallies in revision order: {created:?}");

    let again = within(
        "counted create of an existing key",
        kv.create_counted(&key(&ns, "k00"), b"other", Some(session), &tally, Some(tally_lease)),
    )
    .await
    .expect("counted create");
    let PutOutcome::Conflict { current: Some(current) } = &again.outcome else {
        panic!("a create of an existing key must conflict with it: {again:?}");
    };
    assert_eq!((current.value.to_vec(), again.tally), (b"me".to_vec(), None));
    let next = within(
        "counted create",
        kv.create_counted(&key(&ns, "next"), b"", Some(session), &tally, Some(tally_lease)),
    )
    .await
    .expect("counted create");
    assert_eq!(next.tally, Some(n + 1), "a conflict must not count");
    let bound = |k: Vec<u8>| {
        let kv = kv.clone();
        async move { within("get", kv.get(&k)).await.expect("get").kv.and_then(|kv| kv.lease) }
    };
    assert_eq!(bound(key(&ns, "next")).await, Some(session));
    assert_eq!(bound(tally.clone()).await, Some(tally_lease));

    let dead = within("granting a lease", kv.lease_grant(ttl)).await.expect("grant");
    within("revoking", kv.lease_revoke(dead)).await.expect("revoke");
    for (lease, tally_of) in [(dead, tally_lease), (session, dead)] {
        let refused = within(
            "counted create with a dead lease",
            kv.create_counted(&key(&ns, "never"), b"", Some(lease), &tally, Some(tally_of)),
        )
        .await;
        assert!(matches!(refused, Err(crate::KvError::LeaseNotFound(l)) if l == dead), "{refused:?}");
        assert!(
            within("get", kv.get(&key(&ns, "never"))).await.expect("get").kv.is_none(),
            "nothing written"
        );
    }
    within("revoking", kv.lease_revoke(tally_lease)).await.expect("revoke");
    let fresh = within("granting a lease", kv.lease_grant(ttl)).await.expect("grant");
    let first = within(
        "counted create",
        kv.create_counted(&key(&ns, "anew"), b"", Some(session), &tally, Some(fresh)),
    )
    .await
    .expect("counted create");
    assert_eq!(first.tally, Some(1), "the tally ended with its lease");
    let _ = within("revoking", kv.lease_revoke(session)).await;
    let _ = within("revoking", kv.lease_revoke(fresh)).await;
}
