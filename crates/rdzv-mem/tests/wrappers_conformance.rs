//! The wrappers are transparent: the conformance suite passes through `CountingKv` around
//! a `FaultyKv` around `MemKv`, with no fault and with random latency.

use std::sync::Arc;
use std::time::Duration;

use rdzv_core::Kv;
use rdzv_core::testing::{CountingKv, FaultyKv, Latency};
use rdzv_mem::MemKv;

fn wrapped(latency: Latency) -> Arc<dyn Kv> {
    let faulty = FaultyKv::new(Arc::new(MemKv::new()), 1);
    faulty.set_latency(latency);
    CountingKv::new(faulty)
}

mod idle {
    rdzv_core::conformance_suite!(async { super::wrapped(super::Latency::None) });
}

mod slow {
    rdzv_core::conformance_suite!(async {
        let (min, max) = (super::Duration::ZERO, super::Duration::from_millis(1));
        super::wrapped(super::Latency::Uniform { min, max })
    });
}
