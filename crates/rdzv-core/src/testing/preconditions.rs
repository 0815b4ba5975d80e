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
