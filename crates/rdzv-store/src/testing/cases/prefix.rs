//! Cases for `with_prefix` (c10d's `PrefixStore`) and for the isolation of Stores.

use super::bytes;
use crate::Store;

/// A view's key `k` is the parent's `prefix/k`, both ways, for keys and queues.
pub async fn prefix_store_maps_keys_under_its_prefix(store: Store) {
    let view = store.with_prefix("p");
    view.set("a", "1").await.expect("set through the view");
    assert_eq!(store.get("p/a").await.expect("get from the parent"), b"1");
    store.set("p/b", "2").await.expect("set in the parent");
    assert_eq!(view.get("b").await.expect("get through the view"), b"2");
    assert_eq!(view.add("n", 5).await.expect("add through the view"), 5);
    assert_eq!(store.add("p/n", 1).await.expect("add in the parent"), 6);
    view.queue_push("jobs", "j").await.expect("push through the view");
    assert_eq!(store.queue_pop("p/jobs", false).await.expect("pop in the parent"), b"j");
    assert!(view.delete_key("a").await.expect("delete through the view"));
    assert!(!store.check(["p/a"]).await.expect("check in the parent"));
}

/// Views nest: `with_prefix("a").with_prefix("b")` uses `a/b/`.
pub async fn prefix_stores_nest(store: Store) {
    let inner = store.with_prefix("a").with_prefix("b");
    assert_eq!(inner.scope(), b"a/b/");
    inner.set("x", "deep").await.expect("set through the nested view");
    assert_eq!(store.get("a/b/x").await.expect("get from the root"), b"deep");
    assert_eq!(store.with_prefix("a").get("b/x").await.expect("get from the middle"), b"deep");
    assert_eq!(inner.list_keys().await.expect("list_keys"), bytes(["x"]));
}

/// A view counts and lists only its own keys, and sees nothing of its siblings or of
/// parent keys that merely start with the same letters.
pub async fn prefix_store_is_isolated(store: Store) {
    let view = store.with_prefix("p");
    let sibling = store.with_prefix("q");
    view.set("a", "").await.expect("set a");
    view.set("b", "").await.expect("set b");
    store.set("pa", "").await.expect("set a look-alike in the parent");
    store.set("top", "").await.expect("set in the parent");
    assert_eq!(view.num_keys().await.expect("num_keys of the view"), 2);
    assert_eq!(view.list_keys().await.expect("list_keys of the view"), bytes(["a", "b"]));
    assert_eq!(store.num_keys().await.expect("num_keys of the parent"), 4);
    assert_eq!(store.list_keys().await.expect("list_keys"), bytes(["p/a", "p/b", "pa", "top"]));
    assert_eq!(sibling.num_keys().await.expect("num_keys of the sibling"), 0);
    assert!(!sibling.check(["a"]).await.expect("check in the sibling"));
    assert!(!view.check(["top"]).await.expect("the view cannot see the parent's keys"));
    view.queue_push("q", "v").await.expect("push through the view");
    assert_eq!(sibling.queue_len("q").await.expect("queue_len of the sibling"), 0);
    assert_eq!(store.queue_len("q").await.expect("queue_len of the parent"), 0);
}

/// Stores on the same backend with disjoint roots share nothing.
pub async fn stores_with_other_roots_are_isolated(store: Store) {
    let mut root_a = store.root().to_vec();
    root_a.extend_from_slice(b"A/");
    let mut root_b = store.root().to_vec();
    root_b.extend_from_slice(b"B/");
    let a = Store::new(store.kv().clone(), root_a).with_timeout(store.timeout());
    let b = Store::new(store.kv().clone(), root_b).with_timeout(store.timeout());
    a.set("k", "in a").await.expect("set in a");
    a.queue_push("q", "x").await.expect("push in a");
    b.set("k", "in b").await.expect("set in b");
    assert_eq!(a.get("k").await.expect("get in a"), b"in a");
    assert_eq!(b.get("k").await.expect("get in b"), b"in b");
    assert_eq!(b.num_keys().await.expect("num_keys of b"), 1);
    assert_eq!(b.queue_len("q").await.expect("queue_len of b"), 0);
    assert_eq!(store.num_keys().await.expect("num_keys of the enclosing root"), 0);
}
