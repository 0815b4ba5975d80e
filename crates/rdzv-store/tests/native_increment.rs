//! The Store test suite on a backend with a native `increment` (as Redis has), which the
//! Store's `add` uses instead of its compare-and-swap loop.

mod support;

use std::sync::Arc;

use rdzv_core::Kv;
use support::QuirkyKv;

rdzv_store::store_suite!(async { Arc::new(QuirkyKv::new(false, true)) as Arc<dyn Kv> });
