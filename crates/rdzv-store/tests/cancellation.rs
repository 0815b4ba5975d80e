//! Blocking calls that time out or are dropped leave no watch behind.

use std::sync::Arc;
use std::time::Duration;

use rdzv_mem::MemKv;
use rdzv_store::Store;

const SHORT: Duration = Duration::from_millis(100);

#[tokio::test]
async fn timed_out_calls_close_their_watches() {
    let kv = Arc::new(MemKv::new());
    let store = Store::new(kv.clone(), "t/").with_timeout(SHORT);
    assert!(store.get("a").await.is_err());
    assert!(store.multi_get(["a", "b"]).await.is_err());
    assert!(store.wait(["a", "b"], SHORT).await.is_err());
    assert!(store.queue_pop("q", true).await.is_err());
    assert!(store.barrier("b", 2, SHORT).await.is_err());
    assert_eq!(kv.watcher_count(), 0);
}

#[tokio::test]
async fn dropped_calls_close_their_watches() {
    let kv = Arc::new(MemKv::new());
    let store = Store::new(kv.clone(), "t/");
    let reader = store.clone();
    let waiting = tokio::spawn(async move { reader.get("a").await });
    let popper = store.clone();
    let popping = tokio::spawn(async move { popper.queue_pop("q", true).await });
    tokio::time::timeout(Duration::from_secs(10), async {
        while kv.watcher_count() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("both calls start watching");
    waiting.abort();
    popping.abort();
    let _ = waiting.await;
    let _ = popping.await;
    assert_eq!(kv.watcher_count(), 0);
}
