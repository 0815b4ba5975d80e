//! What an open watch holds: in a round of 98,304 in-process workers each holds a watch or
//! two of the same key, which mostly carry a few events.
#![allow(clippy::unwrap_used)]

use peak_alloc::PeakAlloc;
use rdzv_core::testing::watch::heap_per_watch;
use rdzv_mem::MemKv;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// The most an open watch of a key may hold on the heap once it has handed out an event, in
/// bytes (279 measured). With tokio's channel as each one's queue of events, which allocates
/// 32 slots at once, a watch held 3.9 KiB before any event.
const WATCH_BYTES: usize = 512;

#[tokio::test]
async fn a_watch_holds_little() {
    let per_watch = heap_per_watch(&MemKv::new(), b"state", 1000, || HEAP.current_usage()).await;
    assert!(per_watch <= WATCH_BYTES as isize, "an open watch holds {per_watch} bytes");
}
