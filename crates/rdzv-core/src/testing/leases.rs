//! Leases: expiry deletes bound keys with delete events, keep-alive prolongs (one lease or a
//! batch), revoke deletes at once, and a dead lease cannot be used. Real time, short TTLs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{WAIT, key, lease_ttl, next_event, next_event_within, put, put_with, watch, within};
use crate::error::KvError;
use crate::kv::{EventKind, Kv, PutOptions, WatchScope};

/// When a lease expires, its keys are deleted, each with a delete event at a revision after
/// its put; the lease is then gone.
pub async fn lease_expiry_deletes_keys_with_events(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let ttl = lease_ttl(&*kv);
    let lease = within("lease_grant", kv.lease_grant(ttl)).await.expect("grant");
    let granted = Instant::now();
    let with_lease = PutOptions::OVERWRITE.with_lease(Some(lease));
    let r1 = put_with(&*kv, &key(&ns, "a"), b"1", with_lease).await;
    let r2 = put_with(&*kv, &key(&ns, "b"), b"2", with_lease).await;
    let r3 = put(&*kv, &key(&ns, "c"), b"no lease").await;
    let mut events = watch(&*kv, &ns, WatchScope::Prefix, r3 + 1).await;
    let mut deleted = BTreeSet::new();
    while deleted.len() < 2 {
        let event = next_event_within(&mut events, ttl + WAIT, "waiting for the lease to expire").await;
        assert_eq!(event.kind, EventKind::Delete, "only the lease's deletes are expected: {event:?}");
        assert!(event.revision() > r2.max(r1));
        assert!(deleted.insert(event.kv.key), "a key was deleted twice");
    }
    assert!(
        granted.elapsed() + Duration::from_millis(50) >= ttl,
        "keys were deleted after {:?}, before the TTL {ttl:?}",
        granted.elapsed()
    );
    assert_eq!(deleted, BTreeSet::from([key(&ns, "a"), key(&ns, "b")]));
    assert_eq!(within("get", kv.get(&key(&ns, "a"))).await.expect("get").kv, None);
    assert!(within("get", kv.get(&key(&ns, "c"))).await.expect("get").kv.is_some());
    match within("keep-alive of the expired lease", kv.lease_keep_alive(lease)).await {
        Err(KvError::LeaseNotFound(id)) => assert_eq!(id, lease),
        other => panic!("keep-alive of an expired lease must be LeaseNotFound: {other:?}"),
    }
}

/// Keep-alives hold a lease (and its keys) well past its TTL; it returns the TTL.
pub async fn keep_alive_prolongs_lease(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let ttl = lease_ttl(&*kv);
    let lease = within("lease_grant", kv.lease_grant(ttl)).await.expect("grant");
    let k = key(&ns, "k");
    put_with(&*kv, &k, b"v", PutOptions::OVERWRITE.with_lease(Some(lease))).await;
    let until = Instant::now() + ttl * 2 + ttl / 2;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 4).await;
        let granted =
            within("keep-alive", kv.lease_keep_alive(lease)).await.expect("keep-alive of a live lease");
        assert!(granted >= ttl, "keep-alive returned {granted:?}, less than the TTL {ttl:?}");
    }
    assert!(within("get", kv.get(&k)).await.expect("get").kv.is_some(), "a kept-alive lease's key vanished");
    within("revoke", kv.lease_revoke(lease)).await.expect("revoke");
}

/// A batched keep-alive answers for each lease on its own, in the order given: the live
/// leases are refreshed (their keys outlive the TTL on batched refreshes alone), a lease that
/// is gone fails alone with `LeaseNotFound`, and an empty batch has no answers.
pub async fn keep_alive_many_answers_each_lease_alone(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let ttl = lease_ttl(&*kv);
    let grant = || async { within("lease_grant", kv.lease_grant(ttl)).await.expect("grant") };
    let (first, gone, second) = (grant().await, grant().await, grant().await);
    within("revoke", kv.lease_revoke(gone)).await.expect("revoke");
    let (k1, k2) = (key(&ns, "first"), key(&ns, "second"));
    put_with(&*kv, &k1, b"1", PutOptions::OVERWRITE.with_lease(Some(first))).await;
    put_with(&*kv, &k2, b"2", PutOptions::OVERWRITE.with_lease(Some(second))).await;
    assert!(within("an empty batch", kv.lease_keep_alive_many(&[])).await.is_empty());
    let until = Instant::now() + ttl * 2 + ttl / 2;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 4).await;
        let answers = within("a batched keep-alive", kv.lease_keep_alive_many(&[first, gone, second])).await;
        let [a, b, c] = &answers[..] else { panic!("three leases, {} answers: {answers:?}", answers.len()) };
        for (lease, answer) in [(first, a), (second, c)] {
            match answer {
                Ok(granted) => {
                    assert!(granted >= &ttl, "lease {lease:#x} got {granted:?}, less than {ttl:?}")
                }
                Err(e) => panic!("the live lease {lease:#x} was not refreshed: {e}"),
            }
        }
        match b {
            Err(KvError::LeaseNotFound(id)) => assert_eq!(*id, gone),
            other => panic!("the revoked lease must be LeaseNotFound in its own slot: {other:?}"),
        }
    }
    for k in [&k1, &k2] {
        assert!(
            within("get", kv.get(k)).await.expect("get").kv.is_some(),
            "a batch-refreshed lease's key vanished"
        );
    }
    within("revoke", kv.lease_revoke(first)).await.expect("revoke");
    within("revoke", kv.lease_revoke(second)).await.expect("revoke");
}

/// Revoking deletes the lease's keys at once, with delete events; a second revoke is
/// `LeaseNotFound`.
pub async fn revoke_deletes_at_once(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let lease = within("lease_grant", kv.lease_grant(lease_ttl(&*kv) * 60)).await.expect("grant");
    let with_lease = PutOptions::OVERWRITE.with_lease(Some(lease));
    put_with(&*kv, &key(&ns, "a"), b"1", with_lease).await;
    let r = put_with(&*kv, &key(&ns, "b"), b"2", with_lease).await;
    let mut events = watch(&*kv, &ns, WatchScope::Prefix, r + 1).await;
    within("revoke", kv.lease_revoke(lease)).await.expect("revoke");
    let read = within("range", kv.range(&ns, Default::default())).await.expect("range");
    assert_eq!(read.count, 0, "revoke must delete the keys before it returns: {:?}", read.kvs);
    let mut deleted = BTreeSet::new();
    while deleted.len() < 2 {
        let event = next_event(&mut events, "waiting for the revoke's delete events").await;
        assert_eq!(event.kind, EventKind::Delete);
        assert!(event.revision() > r && event.revision() <= read.revision);
        deleted.insert(event.kv.key);
    }
    assert_eq!(deleted, BTreeSet::from([key(&ns, "a"), key(&ns, "b")]));
    match within("second revoke", kv.lease_revoke(lease)).await {
        Err(KvError::LeaseNotFound(_)) => {}
        other => panic!("revoking a revoked lease must be LeaseNotFound: {other:?}"),
    }
}

/// A put with a revoked (or never granted) lease fails with `LeaseNotFound`, writing nothing.
pub async fn put_with_dead_lease_fails(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let lease = within("lease_grant", kv.lease_grant(lease_ttl(&*kv) * 60)).await.expect("grant");
    within("revoke", kv.lease_revoke(lease)).await.expect("revoke");
    let k = key(&ns, "k");
    match within("put with a revoked lease", kv.put(&k, b"v", PutOptions::OVERWRITE.with_lease(Some(lease))))
        .await
    {
        Err(KvError::LeaseNotFound(id)) => assert_eq!(id, lease),
        other => panic!("put with a revoked lease must be LeaseNotFound: {other:?}"),
    }
    let bogus = 0x3bad_cafe_f00d_0001;
    match within("put with an unknown lease", kv.put(&k, b"v", PutOptions::OVERWRITE.with_lease(Some(bogus))))
        .await
    {
        Err(KvError::LeaseNotFound(_)) => {}
        other => panic!("put with a never-granted lease must be LeaseNotFound: {other:?}"),
    }
    assert_eq!(within("get", kv.get(&k)).await.expect("get").kv, None, "a failed put must not write");
}

/// Keep-alive of a revoked lease is `LeaseNotFound`.
pub async fn keep_alive_of_dead_lease_fails(kv: Arc<dyn Kv>, _ns: Vec<u8>) {
    let lease = within("lease_grant", kv.lease_grant(lease_ttl(&*kv) * 60)).await.expect("grant");
    within("keep-alive", kv.lease_keep_alive(lease)).await.expect("keep-alive of a live lease");
    within("revoke", kv.lease_revoke(lease)).await.expect("revoke");
    match within("keep-alive", kv.lease_keep_alive(lease)).await {
        Err(KvError::LeaseNotFound(id)) => assert_eq!(id, lease),
        other => panic!("keep-alive of a revoked lease must be LeaseNotFound: {other:?}"),
    }
}

/// Overwriting a leased key without a lease unbinds it (etcd semantics): revoking the lease
/// then leaves the key alone, while a key moved to another lease follows that one.
pub async fn overwrite_without_lease_detaches_key(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let ttl = lease_ttl(&*kv) * 60;
    let first = within("lease_grant", kv.lease_grant(ttl)).await.expect("grant");
    let second = within("lease_grant", kv.lease_grant(ttl)).await.expect("grant");
    let (free, moved) = (key(&ns, "free"), key(&ns, "moved"));
    put_with(&*kv, &free, b"1", PutOptions::OVERWRITE.with_lease(Some(first))).await;
    put_with(&*kv, &moved, b"1", PutOptions::OVERWRITE.with_lease(Some(first))).await;
    put(&*kv, &free, b"2").await;
    put_with(&*kv, &moved, b"2", PutOptions::OVERWRITE.with_lease(Some(second))).await;
    let got = within("get", kv.get(&free)).await.expect("get").kv.expect("exists");
    assert_eq!(got.lease, None);
    within("revoke", kv.lease_revoke(first)).await.expect("revoke");
    assert!(within("get", kv.get(&free)).await.expect("get").kv.is_some(), "an unbound key was deleted");
    let got = within("get", kv.get(&moved)).await.expect("get").kv.expect("bound to the second lease");
    assert_eq!(got.lease, Some(second));
    within("revoke", kv.lease_revoke(second)).await.expect("revoke");
    assert_eq!(within("get", kv.get(&moved)).await.expect("get").kv, None);
}
