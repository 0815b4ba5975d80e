//! The Store test suite on the in-memory backend: as is, and behind added latency that
//! widens every race.

mod plain {
    use std::sync::Arc;

    use rdzv_core::Kv;
    use rdzv_mem::MemKv;

    rdzv_store::store_suite!(async { Arc::new(MemKv::new()) as Arc<dyn Kv> });
}

mod with_latency {
    use std::sync::Arc;
    use std::time::Duration;

    use rdzv_core::Kv;
    use rdzv_core::testing::{FaultyKv, Latency};
    use rdzv_mem::MemKv;

    rdzv_store::store_suite!(async {
        let kv = FaultyKv::new(Arc::new(MemKv::new()), 7);
        kv.set_latency(Latency::Uniform { min: Duration::ZERO, max: Duration::from_millis(2) });
        kv as Arc<dyn Kv>
    });
}
