//! A Store and the futures of all its operations can move between threads (so that they
//! can be spawned). This is checked at compile time; the test only has to build.

use std::sync::Arc;
use std::time::Duration;

use rdzv_mem::MemKv;
use rdzv_store::Store;

fn assert_send<T: Send>(_: &T) {}

#[test]
fn store_and_its_futures_are_send() {
    fn assert_handle<T: Send + Sync + Clone + std::fmt::Debug + 'static>() {}
    assert_handle::<Store>();

    let store = Store::new(Arc::new(MemKv::new()), "s/");
    let t = Duration::from_secs(1);
    assert_send(&store.set("k", "v"));
    assert_send(&store.get("k"));
    assert_send(&store.add("k", 1));
    assert_send(&store.append("k", "v"));
    assert_send(&store.compare_set("k", "a", "b"));
    assert_send(&store.compare_set_checked("k", "a", "b"));
    assert_send(&store.wait(["k"], t));
    assert_send(&store.check(["k"]));
    assert_send(&store.delete_key("k"));
    assert_send(&store.num_keys());
    assert_send(&store.list_keys());
    assert_send(&store.multi_get(vec!["k"]));
    assert_send(&store.multi_set([("k", "v")]));
    assert_send(&store.queue_push("q", "v"));
    assert_send(&store.queue_pop("q", true));
    assert_send(&store.queue_len("q"));
    assert_send(&store.barrier("b", 2, t));
}
