//! The test matrix for the Redis backend, against a real `redis-server` started by the
//! harness: one server per test binary (started on first use), and a fresh client in a
//! fresh namespace per case — each case has its own tokio runtime (see docs/TESTING.md,
//! "The backend matrix"). The scenarios run in real time.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use rdzv_core::Kv;

/// A client of the shared server in a namespace no other case sees.
async fn fresh() -> Arc<dyn Kv> {
    rdzv_redis::testing::shared().kv().await
}

/// The KV conformance suite of `rdzv_core::testing`.
mod kv {
    rdzv_core::conformance_suite!(super::fresh());
}

/// The Store suite of `rdzv_store::testing`.
mod store {
    rdzv_store::store_suite!(super::fresh());
}

/// The rendezvous scenarios of `rdzv_core::testing::rendezvous`.
mod rendezvous {
    rdzv_core::rendezvous_scenarios!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]; super::fresh());
}
