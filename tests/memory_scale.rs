//! Memory grows linearly with the number of workers (issue 25): the peak heap of N in-process
//! workers forming a round and re-forming it, per worker, is at most twice as large at 8,192
//! workers as at 1,024. It was not: every handler kept its own parsed copy of the participant
//! list (N² in all), and 16,384 workers needed 24 GB. Heap bytes are counted by the global
//! allocator of this test binary (`peak_alloc`) (the only test in it, so nothing else allocates meanwhile).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use peak_alloc::PeakAlloc;
use rdzv_core::testing::rendezvous as support;
use rdzv_core::{Kv, RendezvousHandler};
use rdzv_mem::MemKv;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// The peak heap, per worker, of `n` workers on memory forming a round and forming the next
/// one together, in a runtime of their own (dropped at the end with every task the handlers
/// left, so that the next size starts from nothing); what was allocated before does not count.
fn peak_per_worker(n: usize) -> f64 {
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    rt.block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let mut params = support::params(&support::run_id("memory"), n, n);
        params.timeout = Duration::from_secs(600);
        let mut handlers = Vec::with_capacity(n);
        for i in 0..n {
            let mut p = params.clone();
            p.node_id = Some(format!("node{i}"));
            handlers.push(RendezvousHandler::new(kv.clone(), p).await.unwrap());
        }
        for _ in 0..2 {
            let infos: Vec<_> =
                support::rendezvous_all(&handlers).await.into_iter().map(Result::unwrap).collect();
            support::assert_agreement(&infos, n, n);
        }
        for h in &handlers {
            h.shutdown().await.unwrap();
        }
    });
    drop(rt);
    HEAP.peak_usage().saturating_sub(before) as f64 / n as f64
}

#[test]
fn peak_memory_per_worker_at_8192_is_at_most_twice_that_at_1024() {
    let small = peak_per_worker(1024);
    let large = peak_per_worker(8192);
    println!("peak heap per worker: {small:.0} B at 1024 workers, {large:.0} B at 8192");
    assert!(
        large <= 2.0 * small,
        "peak heap per worker grows with N: {small:.0} B at 1024 workers, {large:.0} B at 8192"
    );
}
