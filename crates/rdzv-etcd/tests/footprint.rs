//! What a request holds while it waits for one of its client's slots (`REQUESTS_IN_FLIGHT`):
//! in a round of 98,304 in-process workers on one client nearly every request waits at once.
//! A request's state in tonic, with the connection it may have to open, is about 7 KiB; a
//! request takes it only once it has a slot. Before, every waiting request held it: 9 page
//! faults per worker in such a round instead of 4, and 0.6 GiB more at its peak.
#![allow(clippy::unwrap_used)]

use rdzv_core::Kv;
use rdzv_core::kv::{PutMode, PutOptions, RangeOptions};
use rdzv_etcd::testing::EtcdServer;

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
