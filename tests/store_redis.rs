//! The Store suite against a real redis-server started by the harness.
#![allow(clippy::unwrap_used)]

rdzv_store::store_suite!(rdzv_redis::testing::shared().kv());
