//! The backend conformance suite of `rdzv_core::testing` against a real `redis-server`
//! (one per test binary), each case on a client in a fresh namespace.

rdzv_core::conformance_suite!(rdzv_redis::testing::shared().kv());
