//! The rendezvous scenarios against a real etcd started by the harness, in real time.
#![allow(clippy::unwrap_used)]

mod support;

rendezvous_scenarios!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]; rdzv_etcd::testing::fresh_namespace());
