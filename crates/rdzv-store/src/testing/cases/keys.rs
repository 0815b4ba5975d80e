//! Cases for plain keys: `set`, the blocking reads and the non-blocking ones.

use std::time::Duration;

use tokio::time::Instant;

use super::{SHORT, SLACK, bytes, let_waiters_start, timed_out_keys};
use crate::{DEFAULT_TIMEOUT, Store};

/// `set` then `get` returns the value.
pub async fn set_then_get(store: Store) {
    store.set("a", "1").await.expect("set");
    assert_eq!(store.get("a").await.expect("get"), b"1");
}

/// A second `set` replaces the value.
pub async fn set_overwrites(store: Store) {
    store.set("a", "1").await.expect("set");
    store.set("a", "22").await.expect("set again");
    assert_eq!(store.get("a").await.expect("get"), b"22");
}

/// A `get` on a missing key waits for the `set`.
pub async fn get_blocks_until_set(store: Store) {
    store.set("other", "x").await.expect("set another key");
    let reader = store.clone();
    let waiting = tokio::spawn(async move { reader.get("late").await });
    let_waiters_start().await;
    assert!(!waiting.is_finished(), "get returned before the key existed");
    store.set("late", "here").await.expect("set");
    let value = waiting.await.expect("the reader task").expect("get");
    assert_eq!(value, b"here");
}

/// pytorch/pytorch#132950: a `get` started before the key *and before any key of the
/// store's prefix* exists still returns when the key is set (also through a prefix view).
pub async fn get_before_any_key_of_the_prefix_exists(store: Store) {
    let reader = store.clone();
    let direct = tokio::spawn(async move { reader.get("first").await });
    let view = store.with_prefix("nothing-here-yet");
    let through_view = tokio::spawn(async move { view.get("first").await });
    let_waiters_start().await;
    store.set("first", "1").await.expect("set");
    store.set("nothing-here-yet/first", "2").await.expect("set under the view");
    assert_eq!(direct.await.expect("the reader task").expect("get"), b"1");
    assert_eq!(through_view.await.expect("the view's reader task").expect("get"), b"2");
}

/// A `get` on a key nobody sets fails with a timeout naming the key, on time.
pub async fn get_times_out_on_time_naming_the_key(store: Store) {
    let store = store.with_timeout(SHORT);
    let started = Instant::now();
    let result = store.get("never-set").await;
    let elapsed = started.elapsed();
    let message = match &result {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    assert_eq!(timed_out_keys(result, "get"), bytes(["never-set"]));
    assert!(message.contains("never-set"), "the message names the key: {message}");
    assert!(elapsed >= SHORT, "timed out early, after {elapsed:?}");
    assert!(elapsed <= SHORT + SLACK, "timed out late, after {elapsed:?}");
}

/// `multi_set` writes every pair; `multi_get` returns the values in the order asked.
pub async fn multi_set_then_multi_get(store: Store) {
    store.multi_set([("a", "1"), ("b", "2"), ("c", "3")]).await.expect("multi_set");
    let values = store.multi_get(["c", "a", "b"]).await.expect("multi_get");
    assert_eq!(values, bytes(["3", "1", "2"]));
    assert!(store.multi_get(Vec::<&str>::new()).await.expect("multi_get of nothing").is_empty());
    store.multi_set(Vec::<(&str, &str)>::new()).await.expect("multi_set of nothing");
}

/// `multi_get` waits until every key exists.
pub async fn multi_get_blocks_until_all_exist(store: Store) {
    store.set("a", "1").await.expect("set a");
    let reader = store.clone();
    let waiting = tokio::spawn(async move { reader.multi_get(["a", "b", "c"]).await });
    let_waiters_start().await;
    store.set("b", "2").await.expect("set b");
    let_waiters_start().await;
    assert!(!waiting.is_finished(), "multi_get returned before `c` existed");
    store.set("c", "3").await.expect("set c");
    let values = waiting.await.expect("the reader task").expect("multi_get");
    assert_eq!(values, bytes(["1", "2", "3"]));
}

/// A timed-out `multi_get` names exactly the keys that were missing.
pub async fn multi_get_times_out_naming_the_missing_keys(store: Store) {
    store.set("a", "1").await.expect("set a");
    let store = store.with_timeout(SHORT);
    let result = store.multi_get(["a", "b", "c"]).await;
    assert_eq!(timed_out_keys(result, "multi_get"), bytes(["b", "c"]));
}

/// `wait` returns once every key exists.
pub async fn wait_returns_once_all_keys_exist(store: Store) {
    let waiter = store.clone();
    let waiting = tokio::spawn(async move { waiter.wait(["x", "y"], Duration::from_secs(20)).await });
    let_waiters_start().await;
    store.set("x", "").await.expect("set x");
    store.set("y", "").await.expect("set y");
    waiting.await.expect("the waiter task").expect("wait");
    store.wait(Vec::<&str>::new(), SHORT).await.expect("wait for nothing");
}

/// A timed-out `wait` names the missing keys, on time.
pub async fn wait_times_out_naming_the_missing_keys(store: Store) {
    store.set("x", "").await.expect("set x");
    let started = Instant::now();
    let result = store.wait(["x", "y", "z"], SHORT).await;
    let elapsed = started.elapsed();
    assert_eq!(timed_out_keys(result, "wait"), bytes(["y", "z"]));
    assert!(elapsed >= SHORT && elapsed <= SHORT + SLACK, "timed out after {elapsed:?}");
}

/// `check` says whether every key exists, without waiting.
pub async fn check_tells_whether_all_exist(store: Store) {
    assert!(store.check(Vec::<&str>::new()).await.expect("check nothing"));
    assert!(!store.check(["a"]).await.expect("check a missing key"));
    store.set("a", "").await.expect("set a");
    assert!(store.check(["a"]).await.expect("check a"));
    assert!(!store.check(["a", "b"]).await.expect("check a and b"));
    store.set("b", "").await.expect("set b");
    assert!(store.check(["a", "b"]).await.expect("check a and b"));
}

/// `delete_key` says whether the key existed, and the key is gone afterwards.
pub async fn delete_key_tells_whether_it_existed(store: Store) {
    store.set("a", "1").await.expect("set");
    assert!(store.delete_key("a").await.expect("delete"));
    assert!(!store.delete_key("a").await.expect("delete again"));
    assert!(!store.check(["a"]).await.expect("check"));
    let result = store.with_timeout(SHORT).get("a").await;
    assert_eq!(timed_out_keys(result, "get"), bytes(["a"]));
}

/// `num_keys` and `list_keys` see the user keys, not the queues' or barriers' bookkeeping.
pub async fn num_keys_and_list_keys_count_user_keys_only(store: Store) {
    assert_eq!(store.num_keys().await.expect("num_keys"), 0);
    assert!(store.list_keys().await.expect("list_keys").is_empty());
    store.set("b", "").await.expect("set");
    store.add("a", 1).await.expect("add");
    store.append("c", "x").await.expect("append");
    store.compare_set("d", "", "y").await.expect("compare_set");
    store.queue_push("queue", "item").await.expect("queue_push");
    store.barrier("barrier", 1, SHORT).await.expect("a barrier of one");
    assert_eq!(store.num_keys().await.expect("num_keys"), 4);
    assert_eq!(store.list_keys().await.expect("list_keys"), bytes(["a", "b", "c", "d"]));
    store.delete_key("b").await.expect("delete");
    assert_eq!(store.num_keys().await.expect("num_keys"), 3);
}

/// Keys and values are arbitrary bytes, including the separators the Store uses.
pub async fn binary_keys_and_values_round_trip(store: Store) {
    let all_bytes: Vec<u8> = (0..=255).collect();
    let keys: [&[u8]; 5] = [b"\x00", b"\xff\xfe", b"k/q/b/", b"/", b"1:x/y"];
    for key in keys {
        store.set(key, &all_bytes).await.expect("set a binary key");
    }
    for key in keys {
        assert_eq!(store.get(key).await.expect("get a binary key"), all_bytes);
    }
    let mut listed = store.list_keys().await.expect("list_keys");
    listed.sort();
    let mut expected: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    store.set("empty", b"").await.expect("set an empty value");
    assert_eq!(store.get("empty").await.expect("get an empty value"), b"");
    store.queue_push(b"\x00q", &all_bytes).await.expect("push to a binary queue");
    assert_eq!(store.queue_pop(b"\x00q", false).await.expect("pop"), all_bytes);
}

/// A 256 KiB value round-trips.
pub async fn large_values_round_trip(store: Store) {
    let value: Vec<u8> = (0..256 * 1024).map(|i: u32| (i % 251) as u8).collect();
    store.set("big", &value).await.expect("set a large value");
    assert_eq!(store.get("big").await.expect("get a large value"), value);
}

/// Each handle has its own timeout; a new Store starts at the c10d default.
pub async fn timeouts_belong_to_each_handle(store: Store) {
    let fresh = Store::new(store.kv().clone(), store.root().to_vec());
    assert_eq!(fresh.timeout(), DEFAULT_TIMEOUT);
    assert_eq!(DEFAULT_TIMEOUT, Duration::from_secs(300));
    let mut short = store.clone();
    short.set_timeout(SHORT);
    assert_eq!(short.timeout(), SHORT);
    assert_ne!(store.timeout(), SHORT);
    assert_eq!(short.with_prefix("p").timeout(), SHORT, "a view inherits the timeout");
    let result = short.get("missing").await;
    assert_eq!(timed_out_keys(result, "get"), bytes(["missing"]));
}
