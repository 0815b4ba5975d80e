//! The protocol under faults, one at a time (docs/PROTOCOL.md "Failure handling"): each test
//! reproduces one way a single fault used to wedge or corrupt a run (issue 12 and the defects
//! found after it), deterministically on the in-memory backend under a paused clock, and
//! demands what must happen *after* the fault — the round completes, or the call ends —
//! within a bound far below the call's deadline: a timeout is never an accepted outcome here.
//! Grouped by area, one file each (this file holds what they share).
#![allow(clippy::unwrap_used)]

use rdzv_core::testing::rendezvous as support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use rdzv_core::kv::{DeleteMode, PutMode, PutOptions, PutOutcome};
use rdzv_core::layer::{Decorator, FaultyKv};
use rdzv_core::protocol::State;
use rdzv_core::{
    Kv, KvError, KvExt, KvResult, RendezvousError, RendezvousHandler, RendezvousInfo, RendezvousParams,
    RoundBroken,
};
use rdzv_mem::MemKv;
use tokio::time::{Instant, timeout};

use support::{Worker, assert_agreement, params, run_id};

/// Runs `f` on a fresh single-threaded runtime with a paused clock (a fresh world per case).
fn paused<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}

fn mem() -> Arc<dyn Kv> {
    Arc::new(MemKv::new())
}

/// How long a `frozen` state lives when a member never confirms (round.rs `FROZEN_TTL`).
const FROZEN_TTL: Duration = Duration::from_secs(10);

/// A bound on the keys under a run (see `props::KEYS_PER_WORKER`): a few per live worker plus
/// the run's own keys, however many rounds passed.
const KEYS_PER_WORKER: u64 = 6;
/// The run's own keys (state, version counter, run lease) and some slack.
const KEYS_CONSTANT: u64 = 10;

/// Every handler of `group` keeps calling until all hold the same round, each within
/// `bound`; returns their results.
async fn settle(group: &[RendezvousHandler], bound: Duration) -> Vec<RendezvousInfo> {
    let deadline = Instant::now() + bound;
    let tasks: Vec<_> = group
        .iter()
        .cloned()
        .map(|h| {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let info = tokio::time::timeout_at(deadline, h.next_rendezvous())
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{}: no round within the bound; got {seen:?}", h.participant().node)
                        })
                        .unwrap();
                    seen.push(info.clone());
                    // Hold it unless it breaks at once (a round with a ghost in it).
                    match timeout(Duration::from_millis(500), h.round_broken()).await {
                        Err(_) => return seen,
                        Ok(_) => continue,
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut last = Vec::new();
    for t in tasks {
        let seen = t.await.unwrap();
        last.push(seen.last().cloned().unwrap());
        all.extend(seen);
    }
    check_no_twin(&all, "", "");
    let newest = last.iter().map(|i| i.version).max().unwrap();
    assert!(last.iter().all(|i| i.version == newest), "the group did not settle in one round: {last:?}");
    assert_agreement(&last, 1, usize::MAX);
    last
}

/// No round lists a node id twice; `node`, if listed, is at `addr`.
fn check_no_twin(infos: &[RendezvousInfo], node: &str, addr: &str) {
    for info in infos {
        let nodes: BTreeSet<_> = info.participants.iter().map(|p| &p.node).collect();
        assert_eq!(
            nodes.len(),
            info.participants.len(),
            "round {} lists a node id twice: {info:?}",
            info.version
        );
        if !node.is_empty() {
            let p = info.participants.iter().find(|p| p.node == node);
            assert!(
                p.is_some_and(|p| p.addr == addr),
                "round {}: {node} is {p:?}, expected it at {addr}",
                info.version
            );
        }
    }
}

const PREFIX: &str = "/regress";
/// Every call's deadline: far above every bound asserted below, so that a wedge shows as
/// a bound missed rather than as a timeout error.
const DEADLINE: Duration = Duration::from_secs(60);

fn worker_params(min: usize, max: usize, node: &str) -> RendezvousParams {
    let mut p = RendezvousParams::new("run", min, max).unwrap();
    p.prefix = PREFIX.into();
    p.timeout = DEADLINE;
    p.last_call_timeout = Duration::from_millis(500);
    p.keep_alive_ttl = Duration::from_secs(2);
    p.node_id = Some(node.into());
    p
}

async fn handler(kv: Arc<dyn Kv>, min: usize, max: usize, node: &str) -> RendezvousHandler {
    RendezvousHandler::new(kv, worker_params(min, max, node)).await.unwrap()
}

/// A backend with two hooks. `kill_before_final`: just before this worker's `final` write
/// lands, delete the keep-alive key of the other members (a member dying in the window
/// between the last confirmer's count and its swap). `fail_bootstrap`: fail this many writes
/// of the bootstrap keys (`MASTER_ADDR`, `MASTER_PORT`) as unreachable.
#[derive(Debug)]
struct Hooked {
    inner: Arc<dyn Kv>,
    me: &'static str,
    kill_before_final: bool,
    fail_bootstrap: AtomicU32,
}

impl Decorator for Hooked {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }
    async fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8], options: PutOptions) -> KvResult<PutOutcome> {
        if String::from_utf8_lossy(key).contains("/kv/")
            && self.fail_bootstrap.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
        {
            return Err(KvError::Unavailable {
                backend: "hooked",
                endpoint: String::new(),
                message: "injected".into(),
                source: None,
            });
        }
        if !self.kill_before_final {
        } else if let Ok(State::Final { version, participants, .. }) =
            State::parse(key, &rdzv_core::kv::Bytes::copy_from_slice(value))
        {
            for (rank, p) in participants.iter().enumerate().filter(|(_, p)| p.node != self.me) {
                let _ = p;
                let key = format!("{PREFIX}/run_run/rdzv/v_{version}/rank_{rank}");
                self.inner.delete(key.as_bytes(), DeleteMode::Any).await?;
            }
        }
        self.inner.put(key, value, options).await
    }
}

mod deadlines;
mod dying_members;
mod failed_calls;
mod keys;
mod leaving_and_shutdown;
mod node_ids;
mod outcomes;
mod pieces;
mod sessions;
mod watches;
