//! The test matrix for the etcd backend, against a real etcd started by the harness: one
//! server per test binary (started on first use), a fresh client per case — each case has
//! its own tokio runtime — and a namespace per case (see docs/TESTING.md, "The backend
//! matrix"). The scenarios run in real time.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use rdzv_core::Kv;

/// A client of the shared server with no namespace of its own, as `rdzv::connect` opens it:
/// the conformance suite gives each case its own key prefix.
async fn client() -> Arc<dyn Kv> {
    match rdzv_etcd::testing::shared().await {
        Ok(server) => server.kv().await,
        Err(e) => panic!("cannot start the shared test etcd: {e}"),
    }
}

/// A client of the shared server in a namespace no other case sees.
async fn fresh() -> Arc<dyn Kv> {
    rdzv_etcd::testing::fresh_namespace().await
}

/// The KV conformance suite of `rdzv_core::testing`.
mod kv {
    rdzv_core::conformance_suite!(super::client());
}

/// The Store suite of `rdzv_store::testing`.
mod store {
    rdzv_store::store_suite!(super::fresh());
}

/// The rendezvous scenarios of `rdzv_core::testing::rendezvous`.
mod rendezvous {
    rdzv_core::rendezvous_scenarios!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]; super::fresh());
}
