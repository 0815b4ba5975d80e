//! The Store test suite on the in-memory backend.

use std::sync::Arc;

use rdzv_core::Kv;
use rdzv_mem::MemKv;

rdzv_store::store_suite!(async { Arc::new(MemKv::new()) as Arc<dyn Kv> });
