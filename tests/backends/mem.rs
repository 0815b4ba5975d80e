//! The test matrix for the in-memory backend: every generic suite on a fresh `MemKv` per
//! case (see docs/TESTING.md, "The backend matrix").
//!
//! The KV conformance suite and the Store suite run as they are and again through wrappers
//! (`CountingKv` and `FaultyKv` with added latency) that must be transparent; the rendezvous
//! scenarios run under a paused clock, so their timeouts and TTLs cost no real time.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use rdzv_core::Kv;
use rdzv_mem::MemKv;

/// A fresh, empty backend: nothing is shared between cases.
async fn fresh() -> Arc<dyn Kv> {
    Arc::new(MemKv::new())
}

/// The KV conformance suite of `rdzv_core::testing`.
mod kv {
    rdzv_core::conformance_suite!(super::fresh());
}

/// The Store suite of `rdzv_store::testing`.
mod store {
    rdzv_store::store_suite!(super::fresh());
}

/// The rendezvous scenarios of `rdzv_core::testing::rendezvous`.
mod rendezvous {
    rdzv_core::rendezvous_scenarios!(#[tokio::test(start_paused = true)]; super::fresh());
}

mod kv_wrapped {
    //! The wrappers are transparent: the conformance suite passes through `CountingKv` around
    //! a `FaultyKv` around `MemKv`, with no fault and with random latency.

    use std::sync::Arc;
    use std::time::Duration;

    use rdzv_core::Kv;
    use rdzv_core::layer::{CountingKv, FaultyKv, Latency};
    use rdzv_mem::MemKv;

    fn wrapped(latency: Latency) -> Arc<dyn Kv> {
        let faulty = FaultyKv::new(Arc::new(MemKv::new()), 1);
        faulty.set_latency(latency);
        CountingKv::new(faulty)
    }

    mod idle {
        rdzv_core::conformance_suite!(async { super::wrapped(rdzv_core::layer::Latency::None) });
    }

    mod slow {
        rdzv_core::conformance_suite!(async {
            let (min, max) = (super::Duration::ZERO, super::Duration::from_millis(1));
            super::wrapped(super::Latency::Uniform { min, max })
        });
    }
}

/// The Store suite behind added latency, which widens every race.
mod store_with_latency {
    use std::sync::Arc;
    use std::time::Duration;

    use rdzv_core::Kv;
    use rdzv_core::layer::{FaultyKv, Latency};
    use rdzv_mem::MemKv;

    rdzv_store::store_suite!(async {
        let kv = FaultyKv::new(Arc::new(MemKv::new()), 7);
        kv.set_latency(Latency::Uniform { min: Duration::ZERO, max: Duration::from_millis(2) });
        kv as Arc<dyn Kv>
    });
}
