//! The Store suite against a real etcd started by the harness.
#![allow(clippy::unwrap_used)]

rdzv_store::store_suite!(rdzv_etcd::testing::fresh_namespace());
