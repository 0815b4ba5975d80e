//! What a client holds for each of many requests and watches: in a round of 98,304
//! in-process workers on one client nearly every request waits at once, and each worker
//! holds a watch or two.
//!
//! A request's state in tonic, with the connection it may have to open, is about 7 KiB; a
//! request takes it only once it has one of its client's slots (`REQUESTS_IN_FLIGHT`).
//! Before, every waiting request held it: 9 page faults per worker in such a round instead
//! of 4, and 0.6 GiB more at its peak.
#![allow(clippy::unwrap_used)]

use peak_alloc::PeakAlloc;
use rdzv_core::Kv;
use rdzv_core::kv::{PutMode, PutOptions, RangeOptions};
use rdzv_core::testing::watch::heap_per_watch;
use rdzv_etcd::testing::EtcdServer;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// The most a request not yet started may hold, in bytes.
const WAITING_REQUEST_BYTES: usize = 2048;

#[tokio::test]
async fn a_request_waiting_for_a_slot_holds_little() {
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let put = PutOptions { mode: PutMode::Overwrite, lease: None };
    let sizes = [
        ("get", std::mem::size_of_val(&*kv.get(b"k"))),
        ("range", std::mem::size_of_val(&*kv.range(b"k", RangeOptions::default()))),
        ("put", std::mem::size_of_val(&*kv.put(b"k", b"v", put))),
        ("create_counted", std::mem::size_of_val(&*kv.create_counted(b"k", b"v", None, b"t", None))),
        ("count_at_revision", std::mem::size_of_val(&*kv.count_at_revision(b"k", 1))),
        ("lease_keep_alive", std::mem::size_of_val(&*kv.lease_keep_alive(1))),
    ];
    for (request, size) in sizes {
        assert!(size <= WAITING_REQUEST_BYTES, "a {request} not yet started holds {size} bytes");
    }
}

/// The most an open watch of a key that other watches of the client share may hold on the
/// heap once it has handed out an event, in bytes (354 measured). With tokio's channel as
/// each one's queue of events, which allocates 32 slots at once, a watch held 3.5 KiB before
/// any event, and the two a worker holds at the end of a round 6.6 of the 16 KiB it held
/// then (a round of 8,192); keeping the buffer of the last batch of events took 416 bytes
/// more.
const SHARED_WATCH_BYTES: usize = 512;

#[tokio::test]
async fn a_watch_of_a_shared_key_holds_little() {
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let per_watch = heap_per_watch(&kv, b"state", 1000, || HEAP.current_usage()).await;
    assert!(per_watch <= SHARED_WATCH_BYTES as isize, "an open watch holds {per_watch} bytes");
}
