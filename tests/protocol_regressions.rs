//! Regression tests of the protocol's liveness under faults (docs/PROTOCOL.md "Failure
//! handling"): each reproduces one defect deterministically on the in-memory backend under
//! a paused clock, and demands that the round completes (or the call ends) within a bound far
//! below the call's deadline — a timeout is never an acceptable outcome here.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use async_trait::async_trait;
use rdzv::core::{
    DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, Kv, KvError, KvExt, KvResult, LeaseId,
    PutOptions, PutOutcome, RangeOptions, RangeResponse, RendezvousError, RendezvousHandler,
    RendezvousParams, Revision, RoundBroken, State, WatchScope, WatchStream,
};
use rdzv_core::testing::FaultyKv;
use rdzv_mem::MemKv;
use tokio::time::Instant;

const PREFIX: &str = "/regress";
/// Every call's deadline: far above every bound asserted below, so that a wedge shows as
/// a bound missed rather than as a timeout error.
const DEADLINE: Duration = Duration::from_secs(60);

fn params(min: usize, max: usize, node: &str) -> RendezvousParams {
    let mut p = RendezvousParams::new("run", min, max).unwrap();
    p.prefix = PREFIX.into();
    p.timeout = DEADLINE;
    p.last_call_timeout = Duration::from_millis(500);
    p.keep_alive_ttl = Duration::from_secs(2);
    p.node_id = Some(node.into());
    p
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
}

async fn handler(kv: Arc<dyn Kv>, min: usize, max: usize, node: &str) -> RendezvousHandler {
    RendezvousHandler::new(kv, params(min, max, node)).await.unwrap()
}

/// Defect 1: one failed call of the worker that creates the round (before or after the
/// backend applied it) must not wedge the run: both workers complete within a few seconds.
#[test]
fn a_creator_that_fails_once_while_opening_a_round_does_not_wedge_the_run() {
    for after_applying in [false, true] {
        for n in 1..=12 {
            paused().block_on(async {
                let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
                let link = FaultyKv::new(kv.clone(), n);
                let a = handler(link.clone(), 2, 2, "a").await;
                link.set_fail_after_applying(after_applying);
                link.fail_nth_call(n);
                let started = Instant::now();
                let first = tokio::spawn(async move { a.next_rendezvous().await });
                tokio::time::sleep(Duration::from_millis(200)).await;
                let b = handler(kv.clone(), 2, 2, "b").await;
                let second = b.next_rendezvous().await;
                let first = first.await.unwrap();
                let took = started.elapsed();
                let (first, second) = match (first, second) {
                    (Ok(x), Ok(y)) => (x, y),
                    other => panic!("call #{n} failed (after applying: {after_applying}): {other:?}"),
                };
                assert_eq!(first.version, second.version, "call #{n}");
                assert!(
                    took <= Duration::from_secs(6),
                    "call #{n} (after applying: {after_applying}): {took:?}"
                );
            });
        }
    }
}

/// Defect 2: a worker whose leave fails (the swap and the best-effort delete both) must not
/// be handed back the round it is leaving.
#[test]
fn leaving_never_hands_back_the_round_being_left() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let link = FaultyKv::new(kv.clone(), 7);
        let a = handler(link.clone(), 1, 2, "a").await;
        let b = handler(kv.clone(), 1, 2, "b").await;
        let (ra, rb) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert_eq!(ra.version, rb.version);
        // Every call of `a` fails for a while (its leave included), then the link heals.
        link.set_failure_probability(1.0);
        let healer = {
            let link = link.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                link.clear();
            })
        };
        let again = tokio::time::timeout(Duration::from_secs(10), a.next_rendezvous()).await;
        healer.await.unwrap();
        let again = again.expect("the leave did not finish").unwrap();
        assert!(
            again.version > ra.version,
            "left round {} but got round {} again",
            ra.version,
            again.version
        );
        assert!(
            matches!(b.round_broken().await, RoundBroken::Ended | RoundBroken::MemberGone { .. }),
            "b was not told"
        );
    });
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

#[async_trait]
impl Kv for Hooked {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        self.inner.get(key).await
    }
    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        self.inner.range(prefix, options).await
    }
    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
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
            State::parse(key, &rdzv_core::Bytes::copy_from_slice(value))
        {
            for (rank, p) in participants.iter().enumerate().filter(|(_, p)| p.node != self.me) {
                let _ = p;
                let key = format!("{PREFIX}/run_run/rdzv/v_{version}/rank_{rank}");
                self.inner.delete(key.as_bytes(), DeleteMode::Any).await?;
            }
        }
        self.inner.put(key, value, options).await
    }
    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        self.inner.delete(key, mode).await
    }
    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        self.inner.delete_prefix(prefix).await
    }
    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        self.inner.lease_grant(ttl).await
    }
    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        self.inner.lease_keep_alive(lease).await
    }
    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        self.inner.lease_revoke(lease).await
    }
    async fn watch(&self, key: &[u8], scope: WatchScope, start: Revision) -> KvResult<WatchStream> {
        self.inner.watch(key, scope, start).await
    }
    async fn count_at_revision(&self, prefix: &[u8], revision: Revision) -> KvResult<u64> {
        self.inner.count_at_revision(prefix, revision).await
    }
}

/// Defect 3: a member whose keep-alive key vanishes after the last confirmer counted it but
/// before `final` is written is still reported by `round_broken`, to both members.
#[test]
fn the_monitor_sees_a_member_that_died_just_before_final() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let hooked = |me| {
            let fail_bootstrap = AtomicU32::new(0);
            Arc::new(Hooked { inner: kv.clone(), me, kill_before_final: true, fail_bootstrap }) as Arc<dyn Kv>
        };
        let a = handler(hooked("a"), 2, 2, "a").await;
        let b = handler(hooked("b"), 2, 2, "b").await;
        let (ra, rb) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
        assert_eq!(ra.unwrap().version, rb.unwrap().version);
        for (name, h) in [("a", &a), ("b", &b)] {
            let told = tokio::time::timeout(Duration::from_secs(1), h.round_broken()).await;
            assert!(
                matches!(told, Ok(RoundBroken::MemberGone { .. })),
                "{name} was not told that a member is gone: {told:?}"
            );
        }
    });
}

/// Defect 4: `shutdown` cancels a pending `next_rendezvous` promptly; the call fails with
/// `Shutdown`.
#[test]
fn shutdown_cancels_a_pending_call_promptly() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let a = handler(kv.clone(), 2, 2, "a").await;
        let waiting = a.clone();
        let pending = tokio::spawn(async move { waiting.next_rendezvous().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), a.shutdown())
            .await
            .expect("shutdown waited for the pending call")
            .unwrap();
        let result = tokio::time::timeout(Duration::from_secs(1), pending).await.expect("call still pending");
        assert!(matches!(result.unwrap(), Err(RendezvousError::Shutdown)));
        assert!(started.elapsed() <= Duration::from_secs(2));
        // Nothing of `a` is left: a lone second worker does not see it as a joiner.
        let b = handler(kv.clone(), 1, 2, "b").await;
        let rb = b.next_rendezvous().await.unwrap();
        assert_eq!(rb.world_size, 1, "{:?}", rb.participants);
    });
}

/// Defect 5: the number of keys under a run stays bounded however many rounds pass, and a
/// worker that gave up waiting no longer counts as waiting.
#[test]
fn keys_stay_bounded_over_many_rounds() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let workers = [handler(kv.clone(), 2, 2, "a").await, handler(kv.clone(), 2, 2, "b").await];
        let mut most = 0;
        for round in 0..150u64 {
            let (x, y) = tokio::join!(workers[0].next_rendezvous(), workers[1].next_rendezvous());
            let (x, y) = (x.unwrap(), y.unwrap());
            assert_eq!(x.version, y.version, "round {round}");
            let keys = kv.count(PREFIX.as_bytes(), None).await.unwrap();
            most = most.max(keys);
        }
        // Two workers: their join, keep-alive and waiting keys of the last few rounds, the
        // state, the counter and the run lease.
        assert!(most <= 16, "{most} keys under the run after 150 rounds");

        // A spare (behind the full round) waits beyond its timeout; once its call ends (here
        // cancelled), it is no longer counted as waiting.
        let mut p = params(2, 2, "late");
        p.timeout = Duration::from_secs(3);
        let late = RendezvousHandler::new(kv.clone(), p).await.unwrap();
        let pending = tokio::spawn(async move { late.next_rendezvous().await });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!pending.is_finished(), "a spare timed out behind a full round");
        assert_eq!(workers[0].waiting().await.unwrap().waiters.len(), 1);
        assert_eq!(
            workers[0].num_nodes_waiting().await.unwrap(),
            0,
            "a spare counts as waiting to be admitted"
        );
        pending.abort();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(workers[0].waiting().await.unwrap().waiters.is_empty(), "a cancelled waiter still counts");
    });
}

/// A spare waits as long as the round it waits behind is full and intact, whatever its
/// timeout; when a member leaves, the spare gets a whole timeout again to form the next round.
#[test]
fn a_spare_waits_without_a_deadline_then_gets_a_whole_timeout() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let (a, b) = (handler(kv.clone(), 2, 2, "a").await, handler(kv.clone(), 2, 2, "b").await);
        let (x, y) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
        let first = x.unwrap().version;
        assert_eq!(y.unwrap().version, first);
        let mut p = params(2, 2, "spare");
        p.timeout = Duration::from_secs(3);
        let spare = RendezvousHandler::new(kv.clone(), p).await.unwrap();
        let pending = tokio::spawn(async move { spare.next_rendezvous().await });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!pending.is_finished(), "the spare's deadline ran behind a full round");
        // b leaves; a re-enters 2 s later (within the spare's fresh 3 s, beyond any old one).
        b.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let again = tokio::time::timeout(Duration::from_secs(5), a.next_rendezvous()).await.unwrap().unwrap();
        let promoted = tokio::time::timeout(Duration::from_secs(5), pending).await.unwrap().unwrap().unwrap();
        assert_eq!((again.version, again.rank), (promoted.version, 0), "a keeps its rank");
        assert_eq!(promoted.rank, 1);
        assert!(promoted.version > first);
    });
}

/// Defect 7: two live handlers with the same node id never both hold a rank, and the newer
/// one never takes over the older one's place (nor its address) while the older lives.
#[test]
fn a_node_id_is_held_by_one_live_worker_at_a_time() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let mut p = params(2, 2, "x");
        p.local_addr = Some("host-a".into());
        let old_link = FaultyKv::new(kv.clone(), 1);
        let old = RendezvousHandler::new(old_link.clone(), p.clone()).await.unwrap();
        let other = handler(kv.clone(), 2, 2, "y").await;
        let (r1, r2) = tokio::join!(old.next_rendezvous(), other.next_rendezvous());
        assert_eq!(r1.unwrap().version, r2.as_ref().unwrap().version);

        // A second process with the same node id, on another host.
        p.local_addr = Some("host-b".into());
        let new = RendezvousHandler::new(kv.clone(), p).await.unwrap();
        let pending = {
            let new = new.clone();
            tokio::spawn(async move { new.next_rendezvous().await })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!pending.is_finished(), "the second `x` got a place while the first lives");

        // The old one dies; the survivor re-forms with the newcomer, at its new address.
        old_link.set_failure_probability(1.0);
        old_link.drop_open_watches();
        std::mem::forget(old);
        assert!(!matches!(other.round_broken().await, RoundBroken::NoRound));
        let again =
            tokio::time::timeout(Duration::from_secs(10), other.next_rendezvous()).await.unwrap().unwrap();
        let mine = tokio::time::timeout(Duration::from_secs(10), pending).await.unwrap().unwrap().unwrap();
        assert_eq!(again.version, mine.version);
        let x: Vec<_> = again.participants.iter().filter(|p| p.node == "x").collect();
        assert_eq!(x.len(), 1, "{:?}", again.participants);
        assert_eq!(x[0].addr, "host-b");
    });
}

/// A worker that is waiting or joining survives the loss of its session (the backend was
/// unreachable for longer than the keep-alive TTL): it starts a new one and carries on.
#[test]
fn a_worker_not_yet_in_a_round_survives_a_lost_session() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let links: Vec<_> = (0..2).map(|i| FaultyKv::new(kv.clone(), i)).collect();
        let mut pending = Vec::new();
        for (i, link) in links.iter().enumerate() {
            let h = handler(link.clone(), 3, 3, &format!("w{i}")).await;
            pending.push(tokio::spawn(async move { h.next_rendezvous().await }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // An outage of 6 s, three keep-alive TTLs: both sessions expire on the server.
        for link in &links {
            link.set_failure_probability(1.0);
            link.drop_open_watches();
        }
        tokio::time::sleep(Duration::from_secs(6)).await;
        for link in &links {
            link.clear();
        }
        let third = handler(kv.clone(), 3, 3, "w2").await;
        let r3 = tokio::time::timeout(Duration::from_secs(10), third.next_rendezvous())
            .await
            .expect("the round did not complete after the outage")
            .unwrap();
        for p in pending {
            let r = p.await.unwrap().unwrap();
            assert_eq!(r.version, r3.version);
        }
    });
}

/// A put under a session lease that expired surfaces as `LeaseLost`-style recovery, never as
/// a raw backend error: here the whole call still completes.
#[test]
fn a_worker_whose_lease_expired_unnoticed_still_completes() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let link = FaultyKv::new(kv.clone(), 3);
        let a = handler(link.clone(), 1, 1, "a").await;
        // The lease expires on the server while the worker's refreshes fail; the next call
        // must not fail with a backend "lease not found" error.
        link.set_failure_probability(1.0);
        tokio::time::sleep(Duration::from_secs(5)).await;
        link.clear();
        let r = tokio::time::timeout(Duration::from_secs(10), a.next_rendezvous()).await.unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
}

/// Defect 7, while a round is joinable: a second live handler with the same node id must not
/// overwrite the first one's join key, so the round never lists one node for two processes
/// (both would confirm the same rank).
#[test]
fn a_node_id_joins_a_round_once() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let spawn = |node: &'static str, addr: &'static str, after_ms: u64| {
            let kv = kv.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                let mut p = params(3, 3, node);
                p.local_addr = Some(addr.into());
                p.timeout = Duration::from_secs(8);
                let h = RendezvousHandler::new(kv, p).await.unwrap();
                let r = h.next_rendezvous().await;
                (addr, r, h)
            })
        };
        let tasks = [
            spawn("x", "host-a", 0),
            spawn("y", "host-y", 100),
            spawn("x", "host-b", 200),
            spawn("z", "host-z", 300),
        ];
        let mut done = Vec::new();
        for t in tasks {
            let (addr, r, h) = t.await.unwrap();
            if let Ok(info) = r {
                done.push((addr, info, h));
            }
        }
        let mut ranks: Vec<_> = done.iter().map(|(_, info, _)| (info.version, info.rank)).collect();
        ranks.sort();
        let before = ranks.len();
        ranks.dedup();
        assert_eq!(
            ranks.len(),
            before,
            "two workers hold one rank: {:?}",
            done.iter().map(|(a, i, _)| (a, i.rank)).collect::<Vec<_>>()
        );
        for (addr, info, _) in &done {
            assert_eq!(
                &info.participants[info.rank].addr, addr,
                "a worker holds a rank listed with another's address"
            );
        }
        assert_eq!(done.len(), 3, "the three distinct node ids form a round");
    });
}

/// Defect 6: rank 0's write of the bootstrap keys failing must not fail a complete round
/// (the caller would re-rendezvous and break it for everyone): the call succeeds, the keys
/// appear once the backend answers again, and the round stays intact.
#[test]
fn a_failed_bootstrap_write_does_not_fail_a_complete_round() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let hooked = |me| {
            let fail_bootstrap = AtomicU32::new(3);
            Arc::new(Hooked { inner: kv.clone(), me, kill_before_final: false, fail_bootstrap })
                as Arc<dyn Kv>
        };
        let a = rdzv::Rendezvous::new(hooked("a"), params(2, 2, "a")).await.unwrap();
        let b = rdzv::Rendezvous::new(hooked("b"), params(2, 2, "b")).await.unwrap();
        let (ra, rb) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert_eq!(ra.info.version, rb.info.version);
        let master = if ra.info.rank == 0 { &ra } else { &rb };
        let addr = tokio::time::timeout(Duration::from_secs(10), rb.store.get(rdzv::MASTER_ADDR_KEY)).await;
        assert_eq!(addr.unwrap().unwrap(), master.bootstrap.master_addr.as_bytes());
        let broken = tokio::time::timeout(Duration::from_secs(5), a.round_broken()).await;
        assert!(broken.is_err(), "the round broke: {broken:?}");
    });
}

/// Issue 23, defect 6: a key a call writes for itself is registered for clean-up before the
/// write. When the write takes effect but its answer is lost and the call then ends (here it
/// is cancelled), nothing of it may stay bound to the still-live session: neither a `setup`
/// (every other worker would wait on it) nor a join key (it would be frozen into a round as
/// a ghost, which then stalls for the frozen lease).
#[test]
fn a_lost_answer_then_an_ended_call_leaves_no_setup_and_no_ghost_join_key() {
    paused().block_on(async {
        // The setup of the first round.
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let link = FaultyKv::new(kv.clone(), 1);
        let creator = RendezvousHandler::new(link.clone(), params(1, 1, "a")).await.unwrap();
        link.set_fail_after_applying(true);
        link.fail_next("put");
        assert!(tokio::time::timeout(Duration::from_millis(10), creator.next_rendezvous()).await.is_err());
        link.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other = handler(kv.clone(), 1, 1, "b").await;
        let round = tokio::time::timeout(Duration::from_secs(1), other.next_rendezvous()).await;
        assert!(matches!(round, Ok(Ok(_))), "a lost setup blocked the run: {round:?}");

        // A join key.
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let first = handler(kv.clone(), 2, 2, "b").await;
        let waiting = {
            let first = first.clone();
            tokio::spawn(async move { first.next_rendezvous().await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let link = FaultyKv::new(kv.clone(), 2);
        let ghost = RendezvousHandler::new(link.clone(), params(2, 2, "a")).await.unwrap();
        link.set_fail_after_applying(true);
        link.fail_next("put");
        assert!(tokio::time::timeout(Duration::from_millis(10), ghost.next_rendezvous()).await.is_err());
        link.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let late = handler(kv.clone(), 2, 2, "c").await;
        let round = tokio::time::timeout(Duration::from_secs(1), late.next_rendezvous()).await;
        let round = round.expect("a ghost join key stalled the round").unwrap();
        let theirs = tokio::time::timeout(Duration::from_secs(1), waiting).await.unwrap().unwrap().unwrap();
        assert_eq!(round.version, theirs.version);
        assert!(round.participants.iter().all(|p| p.node != "a"), "{:?}", round.participants);
    });
}

/// Issue 23, item 11: a worker restarted with its old node id on the same machine, whose
/// earlier process was frozen into a round and is gone, ends that round at once (the gone
/// process can never confirm) instead of making everyone wait for the frozen lease (10 s).
#[test]
fn a_restarted_worker_ends_a_round_frozen_with_its_gone_predecessor() {
    paused().block_on(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let a = handler(kv.clone(), 2, 2, "a").await;
        let a_call = {
            let a = a.clone();
            tokio::spawn(async move { a.next_rendezvous().await })
        };
        let state_key = a.keys().state();
        let version = loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Some(kv) = kv.get(&state_key).await.unwrap().kv
                && let Ok(rdzv::core::State::Joinable { version, .. }) =
                    rdzv::core::State::parse(&kv.key, &kv.value)
            {
                break version;
            }
        };
        // The earlier process of "x" on host-x joined, then died (its pid is gone) before
        // confirming; a third worker comes, so the round freezes with a and that process.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let before =
            rdzv::core::Participant { node: "x".into(), addr: "host-x".into(), pid: gone_pid, port: None };
        kv.put(&a.keys().join(version, "x"), &before.to_bytes(), PutOptions::OVERWRITE).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let b = handler(kv.clone(), 2, 2, "b").await;
        let b_call = {
            let b = b.clone();
            tokio::spawn(async move { b.next_rendezvous().await })
        };
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = kv.get(&state_key).await.unwrap().kv.unwrap();
            if let rdzv::core::State::Frozen { participants, .. } =
                rdzv::core::State::parse(&now.key, &now.value).unwrap()
            {
                assert!(participants.iter().any(|p| p.pid == gone_pid), "{participants:?}");
                break;
            }
        }
        // x restarts on host-x: the round its earlier process stalls ends at once.
        let mut p = params(2, 2, "x");
        p.local_addr = Some("host-x".into());
        let x = RendezvousHandler::new(kv.clone(), p).await.unwrap();
        let started = tokio::time::Instant::now();
        let x_call = tokio::spawn(async move { x.next_rendezvous().await });
        // Two of the three form the next round (max = 2); the third waits as a spare.
        let mut calls = vec![a_call, b_call, x_call];
        let mut rounds = Vec::new();
        while rounds.len() < 2 && started.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            for call in calls.iter_mut().filter(|c| c.is_finished()) {
                rounds.push(call.await.unwrap().unwrap());
            }
            calls.retain(|c| !c.is_finished());
        }
        assert_eq!(rounds.len(), 2, "no round of 2 within 3 s of the restart: {rounds:?}");
        assert!(
            rounds.iter().all(|r| r.version > version && r.participants.iter().all(|p| p.pid != gone_pid))
        );
    });
}
