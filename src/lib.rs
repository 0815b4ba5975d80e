//! # rdzv
//!
//! Rendezvous for distributed jobs: workers meet through a key-value store (etcd v3, Redis,
//! or memory), agree on membership, each get a rank and the world size, and share a
//! c10d-style Store.
pub use rdzv_core as core;
pub use rdzv_mem as mem;
