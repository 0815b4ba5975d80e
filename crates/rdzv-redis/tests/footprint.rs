//! What an open watch holds: in a round of 98,304 in-process workers each holds a watch or
//! two of the same key, which mostly carry a few events.
#![allow(clippy::unwrap_used)]

use peak_alloc::PeakAlloc;
use rdzv_core::testing::watch::heap_per_watch;
use rdzv_redis::testing::RedisServer;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// The most an open watch of a key may hold on the heap once it has handed out an event, in
/// bytes (1,271 measured, 896 of them its task). It held 6.6 KiB when each watch cloned the
/// client's configuration and keys and queued its events in tokio's channel, which
/// allocates 32 slots at once.
const WATCH_BYTES: usize = 2048;

#[tokio::test]
async fn a_watch_holds_little() {
    let server = RedisServer::start().unwrap();
    let kv = server.kv().await;
    let per_watch = heap_per_watch(&*kv, b"state", 1000, || HEAP.current_usage()).await;
    assert!(per_watch <= WATCH_BYTES as isize, "an open watch holds {per_watch} bytes");
}
