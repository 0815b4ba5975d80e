//! # rdzv
//!
//! Rendezvous for distributed jobs.
pub use rdzv_core as core;
