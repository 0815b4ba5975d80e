//! The wrappers are transparent when idle: the conformance suite passes through
//! `CountingKv` around a fault-free `FaultyKv` around `MemKv`.

rdzv_core::conformance_suite!(async {
    let mem: std::sync::Arc<dyn rdzv_core::Kv> = std::sync::Arc::new(rdzv_mem::MemKv::new());
    rdzv_core::CountingKv::new(rdzv_mem::FaultyKv::new(mem, 1)) as std::sync::Arc<dyn rdzv_core::Kv>
});
