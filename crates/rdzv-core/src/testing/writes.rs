//! Writes beyond preconditions: prefix deletes, re-creation, large and binary data, and the
//! native increment.

use std::sync::Arc;

use super::{key, next_events, put, watch, within};
use crate::error::KvError;
use crate::ext::KvExt;
use crate::kv::{DeleteMode, EventKind, Kv, PutMode, PutOptions, PutOutcome, RangeOptions, WatchScope};

/// `delete_prefix` deletes exactly the keys under the prefix, as one write: one revision,
/// one delete event per key.
pub async fn delete_prefix_is_one_write(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    for i in 0..5 {
        put(&*kv, &key(&ns, &format!("doomed/{i}")), b"v").await;
    }
    let kept = put(&*kv, &key(&ns, "doomedish"), b"stays").await;
    let mut events = watch(&*kv, &ns, WatchScope::Prefix, kept + 1).await;
    let deleted =
        within("delete_prefix", kv.delete_prefix(&key(&ns, "doomed/"))).await.expect("delete_prefix");
    assert_eq!(deleted.deleted, 5);
    assert!(deleted.revision > kept);
    let events = next_events(&mut events, 5, "waiting for the prefix delete's events").await;
    for event in &events {
        assert_eq!(event.kind, EventKind::Delete);
        assert_eq!(event.revision(), deleted.revision, "all keys of one prefix delete share its revision");
    }
    let mut keys: Vec<_> = events.iter().map(|e| e.kv.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, (0..5).map(|i| key(&ns, &format!("doomed/{i}"))).collect::<Vec<_>>());
    let left = within("range", kv.range(&ns, RangeOptions::default())).await.expect("range");
    assert_eq!(left.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), vec![key(&ns, "doomedish")]);
    let none =
        within("empty delete_prefix", kv.delete_prefix(&key(&ns, "doomed/"))).await.expect("delete_prefix");
    assert_eq!(none.deleted, 0);
}

/// `delete_prefix` with an empty prefix is rejected (it would wipe the store).
pub async fn delete_prefix_rejects_empty_prefix(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    put(&*kv, &key(&ns, "k"), b"v").await;
    match within("delete_prefix(\"\")", kv.delete_prefix(b"")).await {
        Err(KvError::InvalidArgument(_)) => {}
        other => panic!("delete_prefix of the empty prefix must be InvalidArgument, got {other:?}"),
    }
    assert!(within("get", kv.get(&key(&ns, "k"))).await.expect("get").kv.is_some());
}

/// `delete_prefix_limited` deletes the first keys under the prefix in key order, at most the
/// limit, and says how many; once none is left, a piece deletes 0. A limit of 0 and an empty
/// prefix are refused.
pub async fn delete_prefix_limited_deletes_the_first_keys(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    for i in 0..5 {
        put(&*kv, &key(&ns, &format!("doomed/{i}")), b"v").await;
    }
    put(&*kv, &key(&ns, "doomedish"), b"stays").await;
    let names = |kvs: &[crate::kv::KeyValue]| kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>();
    let first = within("delete_prefix_limited", kv.delete_prefix_limited(&key(&ns, "doomed/"), 2))
        .await
        .expect("delete_prefix_limited");
    assert_eq!(first.deleted, 2);
    let left = within("range", kv.range(&ns, RangeOptions::default())).await.expect("range");
    let expected: Vec<_> =
        ["doomed/2", "doomed/3", "doomed/4", "doomedish"].iter().map(|name| key(&ns, name)).collect();
    assert_eq!(names(&left.kvs), expected, "the first two keys in key order go, and nothing else");
    let rest = within("delete_prefix_limited", kv.delete_prefix_limited(&key(&ns, "doomed/"), 10))
        .await
        .expect("delete_prefix_limited");
    assert_eq!(rest.deleted, 3, "the limit is above what was left: all of it");
    assert!(rest.revision > first.revision);
    let none = within("delete_prefix_limited", kv.delete_prefix_limited(&key(&ns, "doomed/"), 10))
        .await
        .expect("delete_prefix_limited");
    assert_eq!(none.deleted, 0);
    let left = within("range", kv.range(&ns, RangeOptions::default())).await.expect("range");
    assert_eq!(names(&left.kvs), vec![key(&ns, "doomedish")]);
    for (prefix, limit) in [(key(&ns, "doomedish"), 0), (Vec::new(), 1)] {
        match within("delete_prefix_limited", kv.delete_prefix_limited(&prefix, limit)).await {
            Err(KvError::InvalidArgument(_)) => {}
            other => {
                panic!("delete_prefix_limited({prefix:?}, {limit}) must be InvalidArgument, got {other:?}")
            }
        }
    }
    assert!(within("get", kv.get(&key(&ns, "doomedish"))).await.expect("get").kv.is_some());
}

/// A key deleted and written again is a new incarnation: new create revision, version 1.
pub async fn recreated_key_starts_a_new_incarnation(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    put(&*kv, &k, b"1").await;
    put(&*kv, &k, b"2").await;
    within("delete", kv.delete(&k, DeleteMode::Any)).await.expect("delete");
    let outcome = within("re-create", kv.put(&k, b"3", PutOptions::new(PutMode::Create))).await.expect("put");
    let PutOutcome::Written { revision, create_revision } = outcome else { panic!("re-create: {outcome:?}") };
    assert_eq!(create_revision, revision);
    let got = within("get", kv.get(&k)).await.expect("get").kv.expect("exists");
    assert_eq!((got.create_revision, got.version, got.value.to_vec()), (revision, 1, b"3".to_vec()));
}

/// A 1 MiB value round-trips byte for byte, through get, range and watch.
pub async fn large_values_round_trip(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let value: Vec<u8> = (0..1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let k = key(&ns, "big");
    let r = put(&*kv, &k, &value).await;
    let got = within("get", kv.get(&k)).await.expect("get").kv.expect("exists");
    assert!(got.value == value, "1 MiB value came back altered ({} bytes)", got.value.len());
    let range = within("range", kv.range(&ns, RangeOptions::default())).await.expect("range");
    assert!(range.kvs.len() == 1 && range.kvs[0].value == value);
    let mut events = watch(&*kv, &k, WatchScope::Key, r).await;
    let event = &next_events(&mut events, 1, "replaying the big put").await[0];
    assert!(event.kv.value == value, "1 MiB value altered in a watch event");
}

/// Keys and values with every byte value (including 0x00 and 0xff) round-trip, and range
/// orders such keys by their bytes.
pub async fn binary_keys_and_values_round_trip(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let all: Vec<u8> = (0..=255u8).collect();
    let mut k = ns.clone();
    k.extend_from_slice(&all);
    let r = put(&*kv, &k, &all).await;
    let got = within("get", kv.get(&k)).await.expect("get").kv.expect("exists");
    assert_eq!((got.key, got.value.to_vec()), (k.clone(), all.clone()));
    let mut keys: Vec<Vec<u8>> =
        [&[0xffu8][..], &[0x00], &[0x00, 0x00], &[0x7f], &[0x80, 0x00], &[0xff, 0xff]]
            .iter()
            .map(|suffix| [&ns[..], b"z/", suffix].concat())
            .collect();
    for k in &keys {
        put(&*kv, k, k).await;
    }
    keys.sort();
    let range = within("range", kv.range(&key(&ns, "z/"), RangeOptions::default())).await.expect("range");
    assert_eq!(range.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), keys, "byte order");
    assert!(range.kvs.iter().all(|kv| kv.key == kv.value));
    let mut events = watch(&*kv, &ns, WatchScope::Prefix, r).await;
    let first = &next_events(&mut events, 1, "replaying the binary put").await[0];
    assert_eq!((&first.kv.key, &first.kv.value.to_vec()), (&k, &all));
}

/// The native increment (where the capabilities say there is one) behaves like a
/// compare-and-swap of a decimal integer: missing = 0, it sees values written by puts, and
/// puts see its results. Without one, `increment` is `Unsupported`.
pub async fn increment_matches_compare_and_swap(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "n");
    let first = within("increment", kv.increment(&k, 5)).await;
    if !kv.capabilities().native_increment {
        assert!(
            matches!(first, Err(KvError::Unsupported { .. })),
            "an increment without the capability must be Unsupported: {first:?}"
        );
        // The caller's fallback is compare-and-swap, which must work.
        let (value, _) =
            within("cas", kv.compare_and_swap(&k, PutOptions::OVERWRITE, |_| Some(b"5".to_vec())))
                .await
                .expect("cas")
                .expect("written");
        assert_eq!(value, b"5");
        return;
    }
    assert_eq!(first.expect("native increment"), Some(5), "incrementing a missing key by 5");
    assert_eq!(within("increment", kv.increment(&k, -7)).await.expect("increment"), Some(-2));
    let got = within("get", kv.get(&k)).await.expect("get").kv.expect("exists");
    assert_eq!(got.value, &b"-2"[..], "the stored form is the decimal integer");
    let before = got.mod_revision;
    let (_, swapped) = within(
        "cas",
        kv.compare_and_swap(&k, PutOptions::OVERWRITE, |cur| {
            let n: i64 = std::str::from_utf8(&cur?.value).ok()?.parse().ok()?;
            Some((n + 10).to_string().into_bytes())
        }),
    )
    .await
    .expect("cas")
    .expect("written");
    assert!(swapped > before);
    assert_eq!(within("increment", kv.increment(&k, 1)).await.expect("increment"), Some(9));
    let after = within("get", kv.get(&k)).await.expect("get").kv.expect("exists");
    assert!(after.mod_revision > swapped, "an increment is a write with its own revision");
    put(&*kv, &k, b"not a number").await;
    assert!(
        within("increment", kv.increment(&k, 1)).await.is_err(),
        "incrementing a non-integer must fail, not overwrite"
    );
}
