//! The backend conformance suite of `rdzv_core::testing` against a real etcd: one server per
//! test binary, a fresh client per case (each case has its own runtime), a fresh namespace
//! per case (chosen by the suite).

rdzv_core::conformance_suite!(async {
    match rdzv_etcd::testing::shared().await {
        Ok(server) => server.kv().await,
        Err(e) => panic!("cannot start the shared test etcd: {e}"),
    }
});
