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

/// The most a write waiting for a slot may hold on the heap, the task that runs it
/// included, in bytes (1,097 measured, a worker's join: its task, its future, its keys).
/// With etcd's request built before the wait, each held every key three times over, 1,661.
const WAITING_WRITE_HEAP_BYTES: usize = 1280;

/// Every slot taken by writes the paused server does not answer, then `N` more writes: what
/// each of those holds while it waits is what 98,304 workers hold at once when they join.
#[tokio::test]
async fn a_write_waiting_for_a_slot_holds_little_on_the_heap() {
    // The requests one client has in flight at most (`REQUESTS_IN_FLIGHT`, client.rs).
    const SLOTS: usize = 256;
    const N: usize = 1000;
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    kv.put(b"warm", b"v", PutOptions { mode: PutMode::Overwrite, lease: None }).await.unwrap();
    server.pause().unwrap();
    let write = |i: usize| {
        let kv = kv.clone();
        tokio::spawn(async move {
            let key = format!("rdzv/v_1/join/node-{i:06}");
            kv.create_counted(
                key.as_bytes(),
                br#"{"node":"node","addr":"10.0.0.1"}"#,
                None,
                b"rdzv/v_1/tally",
                None,
            )
            .await
        })
    };
    let in_flight: Vec<_> = (0..SLOTS).map(write).collect();
    settle().await;
    let before = HEAP.current_usage();
    let waiting: Vec<_> = (SLOTS..SLOTS + N).map(write).collect();
    settle().await;
    let per_write = (HEAP.current_usage() as isize - before as isize) / N as isize;
    server.resume().unwrap();
    for task in in_flight.into_iter().chain(waiting) {
        task.abort();
    }
    assert!(
        per_write <= WAITING_WRITE_HEAP_BYTES as isize,
        "a write waiting for a slot holds {per_write} bytes"
    );
}

/// Lets every spawned task run until it waits.
async fn settle() {
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
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
