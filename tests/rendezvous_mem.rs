//! The rendezvous scenarios on the in-memory backend, under a paused clock.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use rdzv::core::Kv;
use rdzv_mem::MemKv;

rendezvous_scenarios!(#[tokio::test(start_paused = true)]; async { Arc::new(MemKv::new()) as Arc<dyn Kv> });
