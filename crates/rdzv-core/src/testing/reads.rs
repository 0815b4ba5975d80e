//! Reads: get and range with their filters, ordering, limits, and the revisions they report.

use std::sync::Arc;

use super::{key, put, put_with, within};
use crate::kv::{Kv, PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder};

/// A missing key reads as `None`, with the store revision (at least that of the last write).
pub async fn get_missing_key_returns_store_revision(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let written = put(&*kv, &key(&ns, "present"), b"x").await;
    let read = within("reading a missing key", kv.get(&key(&ns, "absent")))
        .await
        .expect("get of a missing key succeeds");
    assert_eq!(read.kv, None, "a key never written must read as absent");
    assert!(read.revision >= written, "get saw revision {} before the write at {written}", read.revision);
}

/// A put reports its revision; get returns value, create/mod revision, version and lease;
/// an overwrite keeps the create revision and bumps the version.
pub async fn put_then_get_round_trips_metadata(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let first = within("creating a key", kv.put(&k, b"one", PutOptions::OVERWRITE)).await.expect("put");
    let PutOutcome::Written { revision: r1, create_revision: c1 } = first else {
        panic!("unconditional put was not written: {first:?}");
    };
    assert!(r1 > 0, "revisions start at 1");
    assert_eq!(c1, r1, "a creating write's create revision is its revision");
    let got = within("reading it", kv.get(&k)).await.expect("get").kv.expect("the key exists");
    assert_eq!(got.key, k);
    assert_eq!(got.value, &b"one"[..]);
    assert_eq!((got.create_revision, got.mod_revision, got.version, got.lease), (r1, r1, 1, None));

    let second = within("overwriting it", kv.put(&k, b"two", PutOptions::OVERWRITE)).await.expect("put");
    let PutOutcome::Written { revision: r2, create_revision: c2 } = second else {
        panic!("overwrite was not written: {second:?}");
    };
    assert!(r2 > r1);
    assert_eq!(c2, r1, "an overwrite keeps the create revision");
    let got = within("reading it again", kv.get(&k)).await.expect("get").kv.expect("the key exists");
    assert_eq!(got.value, &b"two"[..]);
    assert_eq!((got.create_revision, got.mod_revision, got.version), (r1, r2, 2));
}

/// Every write gets a revision strictly greater than the one before.
pub async fn revisions_strictly_increase(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let mut last = 0;
    for i in 0..10 {
        let k = key(&ns, &format!("k{}", i % 3));
        let r = put(&*kv, &k, format!("{i}").as_bytes()).await;
        assert!(r > last, "write {i} got revision {r}, not after {last}");
        last = r;
        if i % 4 == 3 {
            match within("deleting", kv.delete(&k, crate::kv::DeleteMode::Any)).await.expect("delete") {
                crate::kv::DeleteOutcome::Deleted { revision } => {
                    assert!(revision > last, "delete got revision {revision}, not after {last}");
                    last = revision;
                }
                other => panic!("deleting an existing key: {other:?}"),
            }
        }
    }
    let created = within("creating", kv.put(&key(&ns, "new"), b"", PutOptions::new(PutMode::Create)))
        .await
        .expect("create");
    match created {
        PutOutcome::Written { revision, .. } => assert!(revision > last),
        other => panic!("create of a new key: {other:?}"),
    }
}

/// get and range report a store revision at least that of every write that preceded them.
pub async fn reads_return_the_store_revision(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let a = put(&*kv, &key(&ns, "a"), b"1").await;
    let b = put(&*kv, &key(&ns, "b"), b"2").await;
    let got = within("get", kv.get(&key(&ns, "a"))).await.expect("get");
    assert!(got.revision >= b, "get of `a` saw revision {} though `b` was written at {b}", got.revision);
    assert_eq!(got.kv.expect("a exists").mod_revision, a);
    let range = within("range", kv.range(&ns, RangeOptions::default())).await.expect("range");
    assert!(range.revision >= b, "range saw revision {} before the write at {b}", range.revision);
    let count = within("count", kv.range(&ns, RangeOptions { count_only: true, ..Default::default() }))
        .await
        .expect("count");
    assert!(count.revision >= b);
}

/// range returns exactly the keys under the prefix, in key order.
pub async fn range_matches_only_the_prefix(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    for suffix in ["a/2", "a/1", "ab", "b/1", "a", "a/3/deep"] {
        put(&*kv, &key(&ns, suffix), suffix.as_bytes()).await;
    }
    let keys = |prefix: &str| {
        let kv = kv.clone();
        let ns_len = ns.len();
        let prefix = key(&ns, prefix);
        async move {
            let r = within("range", kv.range(&prefix, RangeOptions::default())).await.expect("range");
            assert_eq!(r.count as usize, r.kvs.len());
            for kv in &r.kvs {
                assert_eq!(kv.value, kv.key[ns_len..], "range returned a wrong value");
            }
            r.kvs.into_iter().map(|kv| kv.key).collect::<Vec<_>>()
        }
    };
    assert_eq!(keys("a/").await, vec![key(&ns, "a/1"), key(&ns, "a/2"), key(&ns, "a/3/deep")]);
    assert_eq!(
        keys("a").await,
        vec![key(&ns, "a"), key(&ns, "a/1"), key(&ns, "a/2"), key(&ns, "a/3/deep"), key(&ns, "ab")]
    );
    assert_eq!(keys("b/").await, vec![key(&ns, "b/1")]);
    assert_eq!(keys("c").await, Vec::<Vec<u8>>::new());
    assert_eq!(keys("").await.len(), 6);
}

/// `count` counts every match regardless of `limit`; `count_only` returns no keys.
pub async fn range_counts_all_and_limits(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    for i in 0..5 {
        put(&*kv, &key(&ns, &format!("k{i}")), b"v").await;
    }
    let limited =
        within("limited range", kv.range(&ns, RangeOptions { limit: Some(2), ..Default::default() }))
            .await
            .expect("range");
    assert_eq!(limited.count, 5);
    assert_eq!(
        limited.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(),
        vec![key(&ns, "k0"), key(&ns, "k1")]
    );
    let big = within("range", kv.range(&ns, RangeOptions { limit: Some(50), ..Default::default() }))
        .await
        .expect("range");
    assert_eq!((big.count, big.kvs.len()), (5, 5));
    let counted = within("count", kv.range(&ns, RangeOptions { count_only: true, ..Default::default() }))
        .await
        .expect("count");
    assert_eq!(counted.count, 5);
    assert!(counted.kvs.is_empty(), "count_only must return no keys");
}

/// Ordering by key or by create revision (an overwrite does not move a key).
pub async fn range_orders_by_key_or_create_revision(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    for suffix in ["c", "a", "b"] {
        put(&*kv, &key(&ns, suffix), b"1").await;
    }
    put(&*kv, &key(&ns, "c"), b"2").await; // overwriting keeps c's place
    let order = |order, limit| {
        let kv = kv.clone();
        let ns = ns.clone();
        async move {
            let r = within("range", kv.range(&ns, RangeOptions { order, limit, ..Default::default() }))
                .await
                .expect("range");
            r.kvs.into_iter().map(|kv| kv.key).collect::<Vec<_>>()
        }
    };
    let (a, b, c) = (key(&ns, "a"), key(&ns, "b"), key(&ns, "c"));
    assert_eq!(order(RangeOrder::ByKey, None).await, vec![a.clone(), b.clone(), c.clone()]);
    assert_eq!(order(RangeOrder::ByCreateRevision, None).await, vec![c.clone(), a.clone(), b.clone()]);
    assert_eq!(order(RangeOrder::ByCreateRevision, Some(2)).await, vec![c, a]);
}

/// `max_create_revision` keeps only keys created at or before it (in count, too).
pub async fn range_filters_by_max_create_revision(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let r1 = put(&*kv, &key(&ns, "z1"), b"").await;
    let r2 = put(&*kv, &key(&ns, "y2"), b"").await;
    let r3 = put(&*kv, &key(&ns, "x3"), b"").await;
    put(&*kv, &key(&ns, "z1"), b"again").await; // a later overwrite does not change creation
    let upto = |max, order, count_only| {
        let kv = kv.clone();
        let ns = ns.clone();
        async move {
            let options =
                RangeOptions { max_create_revision: Some(max), order, count_only, ..Default::default() };
            within("filtered range", kv.range(&ns, options)).await.expect("range")
        }
    };
    let r = upto(r2, RangeOrder::ByKey, false).await;
    assert_eq!(r.count, 2);
    assert_eq!(
        r.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(),
        vec![key(&ns, "y2"), key(&ns, "z1")]
    );
    let r = upto(r2, RangeOrder::ByCreateRevision, false).await;
    assert_eq!(
        r.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(),
        vec![key(&ns, "z1"), key(&ns, "y2")]
    );
    assert_eq!(upto(r1, RangeOrder::ByKey, true).await.count, 1);
    assert_eq!(upto(r1 - 1, RangeOrder::ByKey, true).await.count, 0);
    assert_eq!(upto(r3, RangeOrder::ByKey, true).await.count, 3);
    let limited = within(
        "filtered, limited range",
        kv.range(
            &ns,
            RangeOptions {
                max_create_revision: Some(r2),
                limit: Some(1),
                order: RangeOrder::ByCreateRevision,
                ..Default::default()
            },
        ),
    )
    .await
    .expect("range");
    assert_eq!(limited.count, 2);
    assert_eq!(limited.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), vec![key(&ns, "z1")]);
}

/// `count_at_revision`, where the backend's capabilities say it can, counts the keys as they
/// were at a past revision: later creations and deletions do not change it. Where they say it
/// cannot, it fails with `Unsupported` (callers then count with a filtered range).
pub async fn count_at_revision_reads_the_past(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let r1 = put(&*kv, &key(&ns, "a"), b"").await;
    let r2 = put(&*kv, &key(&ns, "b"), b"").await;
    put(&*kv, &key(&ns, "c"), b"").await;
    within("delete", kv.delete(&key(&ns, "a"), crate::kv::DeleteMode::Any)).await.expect("delete");
    let at = |revision| {
        let kv = kv.clone();
        let ns = ns.clone();
        async move { within("count at revision", kv.count_at_revision(&ns, revision)).await }
    };
    if !kv.capabilities().count_at_revision {
        let refused = at(r2).await;
        assert!(matches!(refused, Err(crate::KvError::Unsupported { .. })), "{refused:?}");
        return;
    }
    assert_eq!(at(r2).await.expect("count"), 2);
    assert_eq!(at(r1).await.expect("count"), 1);
    assert_eq!(at(r1 - 1).await.expect("count"), 0);
}

/// `keys_only` returns the keys and their metadata with empty values.
pub async fn range_keys_only_drops_values(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let r = put(&*kv, &key(&ns, "k"), b"a value").await;
    let lease = within("granting a lease", kv.lease_grant(super::lease_ttl(&*kv) * 30)).await.expect("grant");
    let leased =
        put_with(&*kv, &key(&ns, "l"), b"another", PutOptions::OVERWRITE.with_lease(Some(lease))).await;
    let range =
        within("keys-only range", kv.range(&ns, RangeOptions { keys_only: true, ..Default::default() }))
            .await
            .expect("range");
    assert_eq!(range.count, 2);
    let [k, l] = &range.kvs[..] else { panic!("expected two keys, got {:?}", range.kvs) };
    assert_eq!((k.key.clone(), k.value.is_empty(), k.mod_revision, k.version), (key(&ns, "k"), true, r, 1));
    assert_eq!(
        (l.key.clone(), l.value.is_empty(), l.mod_revision, l.lease),
        (key(&ns, "l"), true, leased, Some(lease))
    );
    let _ = within("revoking", kv.lease_revoke(lease)).await;
}
