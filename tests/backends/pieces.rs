//! The rendezvous scenarios again on every backend, each round's member list in pieces of a
//! member or two (`members_inline_bytes` of a few dozen bytes, docs/PROTOCOL.md "How large a
//! round can be"): what a round of tens of thousands of members does, at the size of a test.
//! Each worker is on a link of its own, so each reads the pieces itself. Its own binary: the
//! setting is the whole process's.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use rdzv_core::Kv;
use rdzv_core::testing::rendezvous::set_members_inline_bytes;

/// Small enough that no list of two members fits in one piece.
const INLINE_BYTES: usize = 40;

async fn mem() -> Arc<dyn Kv> {
    set_members_inline_bytes(INLINE_BYTES);
    Arc::new(rdzv_mem::MemKv::new())
}

async fn etcd() -> Arc<dyn Kv> {
    set_members_inline_bytes(INLINE_BYTES);
    rdzv_etcd::testing::fresh_namespace().await
}

async fn redis() -> Arc<dyn Kv> {
    set_members_inline_bytes(INLINE_BYTES);
    rdzv_redis::testing::shared().kv().await
}

mod on_mem {
    rdzv_core::rendezvous_scenarios!(#[tokio::test(start_paused = true)]; super::mem());
}

mod on_etcd {
    rdzv_core::rendezvous_scenarios!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]; super::etcd());
}

mod on_redis {
    rdzv_core::rendezvous_scenarios!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]; super::redis());
}
