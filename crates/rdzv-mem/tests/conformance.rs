//! The backend conformance suite of `rdzv_core::testing`, on a fresh `MemKv` per case.

rdzv_core::conformance_suite!(async {
    std::sync::Arc::new(rdzv_mem::MemKv::new()) as std::sync::Arc<dyn rdzv_core::Kv>
});
