//! The Store test suite on a backend whose every other watch starts from a compacted
//! revision, so that each blocking call goes through its re-read-and-re-watch path.

mod support;

use std::sync::Arc;

use rdzv_core::Kv;
use support::QuirkyKv;

rdzv_store::store_suite!(async { Arc::new(QuirkyKv::new(true, false)) as Arc<dyn Kv> });
