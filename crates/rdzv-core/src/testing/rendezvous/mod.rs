//! The rendezvous scenarios ([`scenarios`]), written once and run on every backend, and the
//! helpers they and other rendezvous tests use: workers whose link can be cut, a round of
//! calls at once, the guarantees every round's members must agree on.
//!
//! A backend runs the scenarios with [`rendezvous_scenarios!`](crate::rendezvous_scenarios),
//! one `#[tokio::test]` per scenario, given the test attribute its backend needs (a paused
//! clock for memory, real time with two worker threads for a server) and an async builder of
//! the backend, evaluated once per case (give each case its own namespace or store):
//!
//! ```text
//! mod rendezvous {
//!     rdzv_core::rendezvous_scenarios!(#[tokio::test(start_paused = true)]; async {
//!         std::sync::Arc::new(rdzv_mem::MemKv::new()) as std::sync::Arc<dyn rdzv_core::Kv>
//!     });
//! }
//! ```
#![allow(clippy::unwrap_used)]

pub mod scenarios;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::error::RendezvousError;
use crate::kv::Kv;
use crate::layer::FaultyKv;
use crate::params::RendezvousParams;
use crate::rendezvous::{RendezvousHandler, RendezvousInfo};

/// A unique run id for one test case.
pub fn run_id(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{name}-{n}-{nanos:x}")
}

/// Parameters of run `run` with test-sized timeouts (a 30 s call, a 1 s last call, a 3 s
/// keep-alive TTL) under the prefix `/rdzv-test`, and the `members_inline_bytes` of
/// [`set_members_inline_bytes`]; panics if `min` and `max` are not valid.
pub fn params(run: &str, min: usize, max: usize) -> RendezvousParams {
    let mut p = RendezvousParams::new(run, min, max).unwrap();
    p.prefix = "/rdzv-test".into();
    p.timeout = Duration::from_secs(30);
    p.last_call_timeout = Duration::from_secs(1);
    p.keep_alive_ttl = Duration::from_secs(3);
    p.members_inline_bytes = MEMBERS_INLINE_BYTES.load(Ordering::Relaxed);
    p
}

static MEMBERS_INLINE_BYTES: AtomicUsize = AtomicUsize::new(crate::params::DEFAULT_MEMBERS_INLINE_BYTES);

/// Makes [`params`] give `bytes` as `members_inline_bytes` from now on, in this whole
/// process: for a test binary whose every scenario keeps its member lists in pieces (a few
/// dozen bytes: a member or two a piece). Not for a binary whose other tests expect the
/// default.
pub fn set_members_inline_bytes(bytes: usize) {
    MEMBERS_INLINE_BYTES.store(bytes, Ordering::Relaxed);
}

/// One in-process worker whose backend connection can be cut, to simulate its death.
pub struct Worker {
    /// The worker's handler, on `link`.
    pub handler: RendezvousHandler,
    /// Its connection to the backend.
    pub link: Arc<FaultyKv>,
}

impl Worker {
    /// A worker of `params` on `kv`, through a [`FaultyKv`] seeded with `seed`; panics if the
    /// handler cannot start.
    pub async fn new(kv: &Arc<dyn Kv>, params: RendezvousParams, seed: u64) -> Worker {
        let link = FaultyKv::new(kv.clone(), seed);
        let handler = RendezvousHandler::new(link.clone() as Arc<dyn Kv>, params).await.unwrap();
        Worker { handler, link }
    }

    /// Cuts the worker off its backend, like a crash: it stops refreshing its lease, and the
    /// server expires it after the TTL.
    pub fn kill(&self) {
        self.link.set_failure_probability(1.0);
        self.link.drop_open_watches();
    }
}

/// Starts `n` workers of one run.
pub async fn workers(kv: &Arc<dyn Kv>, params: &RendezvousParams, n: usize) -> Vec<Worker> {
    let mut all = Vec::new();
    for i in 0..n {
        let mut p = params.clone();
        p.node_id = Some(format!("node{i}"));
        all.push(Worker::new(kv, p, i as u64).await);
    }
    all
}

/// Runs `next_rendezvous` on every handler concurrently.
pub async fn rendezvous_all(handlers: &[RendezvousHandler]) -> Vec<Result<RendezvousInfo, RendezvousError>> {
    let tasks: Vec<_> =
        handlers.iter().cloned().map(|h| tokio::spawn(async move { h.next_rendezvous().await })).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The guarantees of docs/PROTOCOL.md for the members of one round: same version, world size and
/// participants; ranks exactly `0..W`; `min ≤ W ≤ max`.
pub fn assert_agreement(infos: &[RendezvousInfo], min: usize, max: usize) {
    assert!(!infos.is_empty());
    let first = &infos[0];
    for info in infos {
        assert_eq!(info.version, first.version, "versions differ: {infos:#?}");
        assert_eq!(info.world_size, first.world_size);
        assert_eq!(info.participants, first.participants);
        assert_eq!(
            info.participants[info.rank].node,
            infos.iter().find(|i| i.rank == info.rank).unwrap().participants[info.rank].node
        );
    }
    let ranks: BTreeSet<usize> = infos.iter().map(|i| i.rank).collect();
    assert_eq!(ranks.len(), infos.len(), "duplicate ranks: {infos:#?}");
    assert_eq!(ranks, (0..first.world_size).collect(), "ranks are not 0..W");
    assert!(
        min <= first.world_size && first.world_size <= max,
        "W = {} outside {min}..={max}",
        first.world_size
    );
}
