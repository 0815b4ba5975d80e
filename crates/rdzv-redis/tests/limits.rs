//! Size limits: keys, values and requests over them are refused before sending, and a key
//! full of separators costs a bounded number of indexes.

#![allow(clippy::unwrap_used)]

mod support;

use rdzv_core::KvError;
use rdzv_core::kv::{PutOptions, RangeOptions, WatchScope};
use rdzv_redis::testing::{RedisServer, shared};

use support::{connect, put, raw, within};

fn assert_too_large(
    result: rdzv_core::KvResult<impl std::fmt::Debug>,
    what: &str,
    size: usize,
    limit: usize,
) {
    match result {
        Err(e @ KvError::TooLarge { backend: "redis", .. }) => {
            let KvError::TooLarge { what: w, size: s, limit: l, raise, .. } = &e else { unreachable!() };
            assert_eq!((*w, *s, *l), (what, size, limit));
            // Redis's limits are fixed: the message must not send anyone looking for an option.
            assert_eq!(*raise, None);
            assert!(!e.to_string().contains("option") && e.to_string().contains("fixed"), "{e}");
        }
        other => panic!("expected {what} of {size} bytes to be too large, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_values_and_requests_over_the_limits_are_refused_before_sending() {
    use rdzv_redis::{MAX_KEY_BYTES, MAX_REQUEST_BYTES, MAX_VALUE_BYTES};
    let server = shared();
    let kv = connect(server.config(&RedisServer::fresh_namespace())).await;
    let start = within("get", kv.get(b"k")).await.unwrap().revision;

    let long = vec![b'k'; MAX_KEY_BYTES + 1];
    let (size, limit) = (MAX_KEY_BYTES + 1, MAX_KEY_BYTES);
    assert_too_large(kv.put(&long, b"v", PutOptions::OVERWRITE).await, "a key", size, limit);
    assert_too_large(kv.get(&long).await, "a key", size, limit);
    assert_too_large(kv.range(&long, RangeOptions::default()).await, "a key", size, limit);
    assert_too_large(kv.delete(&long, rdzv_core::kv::DeleteMode::Any).await, "a key", size, limit);
    assert_too_large(kv.delete_prefix(&long).await, "a key", size, limit);
    assert_too_large(kv.increment(&long, 1).await, "a key", size, limit);
    assert_too_large(kv.watch(&long, WatchScope::Key, 0).await.map(|_| ()), "a key", size, limit);
    let big = vec![0u8; MAX_VALUE_BYTES + 1];
    assert_too_large(kv.put(b"k", &big, PutOptions::OVERWRITE).await, "a value", big.len(), MAX_VALUE_BYTES);
    let key = vec![b'k'; 100];
    let value = vec![0u8; MAX_REQUEST_BYTES - 50];
    assert_too_large(
        kv.put(&key, &value, PutOptions::OVERWRITE).await,
        "a request",
        100 + value.len(),
        MAX_REQUEST_BYTES,
    );
    let e = kv.put(&key, &value, PutOptions::OVERWRITE).await.unwrap_err();
    assert!(e.to_string().contains(&MAX_REQUEST_BYTES.to_string()), "the error names the limit: {e}");
    // Nothing was sent: no revision was used.
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().revision, start);

    // Exactly at the limits is fine.
    let at_limit = vec![b'k'; MAX_KEY_BYTES];
    put(&*kv, &at_limit, b"v", PutOptions::OVERWRITE).await;
    let value = vec![7u8; MAX_REQUEST_BYTES - 1];
    let rev = put(&*kv, b"k", &value, PutOptions::OVERWRITE).await;
    assert_eq!(rev, start + 2);
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().value, value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_full_of_separators_costs_a_bounded_number_of_indexes() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let kv = connect(server.config(&ns)).await;
    // 4095 bytes, 1365 '/' and 1365 '_': one index per separator would be 2731 sorted sets,
    // each holding the whole key, written by one atomic script.
    let key = b"/a_".repeat(1365);
    let first = put(&*kv, &key, b"1", PutOptions::OVERWRITE).await;
    let mut conn = raw(server).await;
    let indexes: Vec<String> =
        redis::cmd("KEYS").arg(format!("{{rdzv:{ns}}}:i:*")).query_async(&mut conn).await.unwrap();
    // Only the prefixes ending at its 5th to 16th '/' are indexed.
    assert_eq!(indexes.len(), 12, "{} index sets for one key: {indexes:?}", indexes.len());
    let marker = format!("{{rdzv:{ns}}}:i:");
    for index in &indexes {
        let slashes = index.trim_start_matches(&marker).matches('/').count();
        assert!((5..=16).contains(&slashes), "an index of a prefix with {slashes} '/'");
    }

    // Prefixes with and without an index are answered alike, in creation order too.
    let mut sibling = b"/a_".repeat(30);
    sibling.extend_from_slice(b"/zz");
    let second = put(&*kv, &sibling, b"2", PutOptions::OVERWRITE).await;
    let deep_dir = b"/a_".repeat(30);
    let mut deep_dir = deep_dir.to_vec();
    deep_dir.push(b'/');
    let deep_underscore = b"/a_".repeat(25);
    // Indexed (its 7th '/'), and not (past the 16th; ends at '_'; above the 5th).
    let indexed_dir = [&b"/a_".repeat(6)[..], b"/"].concat();
    for prefix in [&indexed_dir[..], &deep_dir[..], &deep_underscore[..], b"/a_/a_/"] {
        let by_create =
            RangeOptions { order: rdzv_core::kv::RangeOrder::ByCreateRevision, ..RangeOptions::default() };
        let read = within("range", kv.range(prefix, by_create)).await.unwrap();
        let revs: Vec<i64> = read.kvs.iter().map(|kv| kv.create_revision).collect();
        assert_eq!((revs, read.count), (vec![first, second], 2), "prefix of {} bytes", prefix.len());
        let upto_first =
            RangeOptions { max_create_revision: Some(first), count_only: true, ..RangeOptions::default() };
        assert_eq!(within("count", kv.range(prefix, upto_first)).await.unwrap().count, 1);
    }
    // Deleting the key removes it from every index it was in.
    within("delete", kv.delete(&key, rdzv_core::kv::DeleteMode::Any)).await.unwrap();
    let by_create =
        RangeOptions { order: rdzv_core::kv::RangeOrder::ByCreateRevision, ..RangeOptions::default() };
    assert_eq!(within("range", kv.range(b"/a_/", by_create)).await.unwrap().count, 1);
}
