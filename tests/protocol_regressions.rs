//! The protocol under faults, one at a time (docs/PROTOCOL.md "Failure handling"): each test
//! reproduces one way a single fault used to wedge or corrupt a run (issue 12 and the defects
//! found after it), deterministically on the in-memory backend under a paused clock, and
//! demands what must happen *after* the fault — the round completes, or the call ends —
//! within a bound far below the call's deadline: a timeout is never an accepted outcome here.
//! Grouped by area, one module each.
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

/// One failed call — before it reached the store, or after it took effect with only its answer lost — never wedges a run or fails a complete round.
mod failed_calls {
    use super::*;

    /// Issue 12's reproduction: min = max = 2; the worker that creates the round fails its n-th
    /// call once (before the request reaches the store, or after it took effect with only the
    /// answer lost); the other arrives 200 ms later. Both must complete the round well within
    /// their 20 s deadline, whichever call fails. The same for the second worker's n-th call.
    #[test]
    fn one_failed_call_of_either_worker_never_wedges_the_run() {
        const DEADLINE: Duration = Duration::from_secs(20);
        const BOUND: Duration = Duration::from_secs(6);
        let mut wedged = Vec::new();
        for (faulty, after_applying) in [(0, false), (0, true), (1, false), (1, true)] {
            for n in 1..=12u64 {
                let outcome = paused(async move {
                    let kv = mem();
                    let mut p = params(&run_id("repro"), 2, 2);
                    p.timeout = DEADLINE;
                    let mut pa = p.clone();
                    pa.node_id = Some("creator".into());
                    let mut pb = p.clone();
                    pb.node_id = Some("second".into());
                    let a = Worker::new(&kv, pa, 1).await;
                    let b = Worker::new(&kv, pb, 2).await;
                    let link = if faulty == 0 { &a.link } else { &b.link };
                    link.set_fail_after_applying(after_applying);
                    link.fail_nth_call(n);
                    let started = Instant::now();
                    let ha = a.handler.clone();
                    let first = tokio::spawn(async move { ha.next_rendezvous().await });
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let rb = b.handler.next_rendezvous().await;
                    let ra = first.await.unwrap();
                    (ra, rb, started.elapsed())
                });
                match outcome {
                    (Ok(ra), Ok(rb), took) if took <= BOUND => assert_agreement(&[ra, rb], 2, 2),
                    (ra, rb, took) => wedged.push(format!(
                        "{}'s call #{n} failed {}: after {took:?}: creator {:?}, second {:?}",
                        if faulty == 0 { "the creator" } else { "the second worker" },
                        if after_applying { "after applying" } else { "before the request" },
                        ra.map(|i| i.version),
                        rb.map(|i| i.version)
                    )),
                }
            }
        }
        assert!(
            wedged.is_empty(),
            "{} of 48 single faults broke the run:\n{}",
            wedged.len(),
            wedged.join("\n")
        );
    }

    /// Defect 1: one failed call of the worker that creates the round (before or after the
    /// backend applied it) must not wedge the run: both workers complete within a few seconds.
    #[test]
    fn a_creator_that_fails_once_while_opening_a_round_does_not_wedge_the_run() {
        for after_applying in [false, true] {
            for n in 1..=12 {
                paused(async {
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

    /// Defect 6: rank 0's write of the bootstrap keys failing must not fail a complete round
    /// (the caller would re-rendezvous and break it for everyone): the call succeeds, the keys
    /// appear once the backend answers again, and the round stays intact.
    #[test]
    fn a_failed_bootstrap_write_does_not_fail_a_complete_round() {
        paused(async {
            let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
            let hooked = |me| {
                let fail_bootstrap = AtomicU32::new(3);
                Arc::new(Hooked { inner: kv.clone(), me, kill_before_final: false, fail_bootstrap })
                    as Arc<dyn Kv>
            };
            let a = rdzv::Rendezvous::new(hooked("a"), worker_params(2, 2, "a")).await.unwrap();
            let b = rdzv::Rendezvous::new(hooked("b"), worker_params(2, 2, "b")).await.unwrap();
            let (ra, rb) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
            let (ra, rb) = (ra.unwrap(), rb.unwrap());
            assert_eq!(ra.info.version, rb.info.version);
            let master = if ra.info.rank == 0 { &ra } else { &rb };
            let addr =
                tokio::time::timeout(Duration::from_secs(10), rb.store.get(rdzv::MASTER_ADDR_KEY)).await;
            assert_eq!(addr.unwrap().unwrap(), master.bootstrap.master_addr.as_bytes());
            let broken = tokio::time::timeout(Duration::from_secs(5), a.round_broken()).await;
            assert!(broken.is_err(), "the round broke: {broken:?}");
        });
    }
}

/// A worker that leaves or shuts down is never handed back its round, and a pending call ends at once.
mod leaving_and_shutdown {
    use super::*;

    /// Defect 2: a worker whose leave fails (the swap and the best-effort delete both) must not
    /// be handed back the round it is leaving.
    #[test]
    fn leaving_never_hands_back_the_round_being_left() {
        paused(async {
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

    /// Defect 4: `shutdown` cancels a pending `next_rendezvous` promptly; the call fails with
    /// `Shutdown`.
    #[test]
    fn shutdown_cancels_a_pending_call_promptly() {
        paused(async {
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
            let result =
                tokio::time::timeout(Duration::from_secs(1), pending).await.expect("call still pending");
            assert!(matches!(result.unwrap(), Err(RendezvousError::Shutdown)));
            assert!(started.elapsed() <= Duration::from_secs(2));
            // Nothing of `a` is left: a lone second worker does not see it as a joiner.
            let b = handler(kv.clone(), 1, 2, "b").await;
            let rb = b.next_rendezvous().await.unwrap();
            assert_eq!(rb.world_size, 1, "{:?}", rb.participants);
        });
    }

    /// `shutdown()` while the worker's own `next_rendezvous` is pending (waiting for a second
    /// worker): returns at once, the pending call fails with `Shutdown` at once, and the two
    /// workers that come next form a round without it that nobody breaks.
    #[test]
    fn shutdown_cancels_a_pending_call_promptly_and_the_others_form_a_round() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("shutdown-pending"), 2, 2);
            let ws = support::workers(&kv, &p, 3).await;
            let a = ws[0].handler.clone();
            let pending = tokio::spawn(async move { a.next_rendezvous().await });
            tokio::time::sleep(Duration::from_secs(1)).await;
            let asked = Instant::now();
            timeout(Duration::from_secs(1), ws[0].handler.shutdown())
                .await
                .expect("shutdown waited for the pending call")
                .unwrap();
            let r =
                timeout(Duration::from_secs(1), pending).await.expect("the pending call went on").unwrap();
            assert!(matches!(r, Err(RendezvousError::Shutdown)), "{r:?}");
            assert!(asked.elapsed() <= Duration::from_secs(1));
            let others: Vec<_> = ws[1..].iter().map(|w| w.handler.clone()).collect();
            let infos: Vec<_> = timeout(Duration::from_secs(10), support::rendezvous_all(&others))
                .await
                .unwrap()
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_agreement(&infos, 2, 2);
            assert!(infos[0].participants.iter().all(|p| p.node != "node0"), "{infos:?}");
            let broken = timeout(2 * p.keep_alive_ttl, ws[1].handler.round_broken()).await;
            assert!(broken.is_err(), "the round broke: {broken:?}");
        });
    }

    /// `shutdown()` racing a round that completes: worker A waits (min = max = 2); B and C arrive
    /// 100 ms later (every call takes 20 ms, so a round takes a while to form); A shuts down at
    /// every moment of the round's formation. A's pending call must fail with `Shutdown`
    /// promptly, unless it had already returned a round before the shutdown began. B and C must
    /// end up in a round without A that stays up. A round that completed with A in it is
    /// acceptable only if its members are told at once that it broke (A's keys went with its
    /// revoked session) — never a member that vanished silently, never a fresh round broken by a
    /// shutdown that began before it completed.
    #[test]
    fn shutdown_racing_a_completing_round() {
        let mut failures = Vec::new();
        for delay_ms in (0..=600).step_by(20) {
            let outcome: Result<(), String> = paused(async move {
                let kv = mem();
                let p = params(&run_id("shutdown-race"), 2, 2);
                let ws = support::workers(&kv, &p, 3).await;
                for w in &ws {
                    w.link.set_latency(rdzv_core::layer::Latency::Fixed(Duration::from_millis(20)));
                }
                let a = ws[0].handler.clone();
                let pending = tokio::spawn(async move {
                    let r = a.next_rendezvous().await;
                    (r, Instant::now())
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                let mut others = Vec::new();
                for w in &ws[1..] {
                    let h = w.handler.clone();
                    others.push(tokio::spawn(async move {
                        // B and C keep calling until they hold a round without A for two TTLs.
                        loop {
                            let info = h.next_rendezvous().await.map_err(|e| format!("{e}"))?;
                            let has_a = info.participants.iter().any(|p| p.node == "node0");
                            let hold =
                                if has_a { Duration::from_secs(2) } else { 2 * h.params().keep_alive_ttl };
                            match (has_a, timeout(hold, h.round_broken()).await) {
                                (false, Err(_)) => return Ok::<_, String>(info),
                                (true, Ok(_)) => continue,
                                (true, Err(_)) => {
                                    return Err(format!(
                                        "round {} lists A, and nobody was told it broke",
                                        info.version
                                    ));
                                }
                                (false, Ok(reason)) => {
                                    return Err(format!(
                                        "round {} without A broke: {reason:?}",
                                        info.version
                                    ));
                                }
                            }
                        }
                    }));
                }
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                let asked = Instant::now();
                if timeout(Duration::from_secs(1), ws[0].handler.shutdown()).await.is_err() {
                    return Err("shutdown waited for the pending call".into());
                }
                match timeout(Duration::from_secs(1), pending).await {
                    Ok(Ok((Err(RendezvousError::Shutdown), _))) => {}
                    Ok(Ok((Ok(_), at))) if at <= asked => {}
                    Ok(Ok((other, at))) => {
                        let other = other.map(|i| {
                            (i.version, i.participants.iter().map(|p| p.node.clone()).collect::<Vec<_>>())
                        });
                        return Err(format!(
                            "A's pending call gave {other:?}, {:?} after shutdown began",
                            at - asked
                        ));
                    }
                    Ok(Err(e)) => return Err(format!("A's task: {e}")),
                    Err(_) => return Err("A's pending call went on after shutdown".into()),
                }
                let mut infos = Vec::new();
                for t in others {
                    match timeout(Duration::from_secs(40), t).await {
                        Ok(Ok(Ok(info))) => infos.push(info),
                        Ok(Ok(Err(e))) => return Err(e),
                        Ok(Err(e)) => return Err(format!("task: {e}")),
                        Err(_) => return Err("B and C never held a round without A".into()),
                    }
                }
                if infos[0].version != infos[1].version {
                    return Err(format!("B and C settled in different rounds: {infos:?}"));
                }
                Ok(())
            });
            if let Err(e) = outcome {
                failures.push(format!("shutdown {delay_ms} ms after B and C started: {e}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// A member that dies just before its round turns final is noticed by the others.
mod dying_members {
    use super::*;

    /// Defect 3: a member whose keep-alive key vanishes after the last confirmer counted it but
    /// before `final` is written is still reported by `round_broken`, to both members.
    #[test]
    fn the_monitor_sees_a_member_that_died_just_before_final() {
        paused(async {
            let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
            let hooked = |me| {
                let fail_bootstrap = AtomicU32::new(0);
                Arc::new(Hooked { inner: kv.clone(), me, kill_before_final: true, fail_bootstrap })
                    as Arc<dyn Kv>
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

    /// A member that is gone just before the round turns final (its keep-alive key vanishes
    /// after the last confirmer counted the keys and before its `final` write lands) is noticed:
    /// either the round never completes (and a later one does, within the calls' deadline), or
    /// its members are told at once that it broke — never do they run with a member that is not
    /// there. The last confirmer's link is slow (300 ms a call) to open the window;
    /// the key is deleted in the middle of it, as a lease expiry would.
    #[test]
    fn a_member_gone_just_before_final_is_noticed() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("gone-before-final"), 3, 3);
            let ws = support::workers(&kv, &p, 3).await;
            ws[2].link.set_latency(rdzv_core::layer::Latency::Fixed(Duration::from_millis(300)));
            let calls: Vec<_> = ws
                .iter()
                .map(|w| {
                    let h = w.handler.clone();
                    tokio::spawn(async move { h.next_rendezvous().await })
                })
                .collect();
            // Every member confirmed once the three keep-alive keys of round 1 are there. The slow
            // worker, last, then counts them (one or two calls, 300 ms each) and writes `final`
            // (finding the run lease first: three calls more); 1 s later is in between.
            let keys = ws[0].handler.keys().clone();
            let started = Instant::now();
            while kv.count(&keys.ranks(1), None).await.unwrap() < 3 {
                assert!(started.elapsed() < Duration::from_secs(10), "round 1 never got three confirmations");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let gone = kv.get(&keys.rank(1, 0)).await.unwrap().kv.expect("rank 0's key");
            let gone = rdzv_core::Participant::parse(&gone.key, &gone.value).unwrap().node;
            kv.delete(&keys.rank(1, 0), rdzv_core::kv::DeleteMode::Any).await.unwrap();
            for (w, call) in ws.iter().zip(calls) {
                let h = &w.handler;
                let node = h.participant().node.clone();
                let r = timeout(Duration::from_secs(20), call).await.expect("a call hung").unwrap();
                // Round 1 may also never complete (it then stalls until its frozen lease ends, and
                // a later round forms): fine, as long as every call completes.
                let info = r.unwrap_or_else(|e| panic!("{node}: {e}"));
                if info.version != 1 || node == gone {
                    continue;
                }
                let told = timeout(Duration::from_secs(2), h.round_broken()).await;
                assert!(
                    matches!(told, Ok(RoundBroken::MemberGone { .. } | RoundBroken::Ended)),
                    "{node}: holds round {} listing {gone}, whose key vanished before it turned final; told {told:?}",
                    info.version
                );
            }
        });
    }
}

/// One live process per node id, and a process restarted with its old node id.
mod node_ids {
    use super::*;

    /// Defect 7: two live handlers with the same node id never both hold a rank, and the newer
    /// one never takes over the older one's place (nor its address) while the older lives.
    #[test]
    fn a_node_id_is_held_by_one_live_worker_at_a_time() {
        paused(async {
            let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
            let mut p = worker_params(2, 2, "x");
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
            let again = tokio::time::timeout(Duration::from_secs(10), other.next_rendezvous())
                .await
                .unwrap()
                .unwrap();
            let mine =
                tokio::time::timeout(Duration::from_secs(10), pending).await.unwrap().unwrap().unwrap();
            assert_eq!(again.version, mine.version);
            let x: Vec<_> = again.participants.iter().filter(|p| p.node == "x").collect();
            assert_eq!(x.len(), 1, "{:?}", again.participants);
            assert_eq!(x[0].addr, "host-b");
        });
    }

    /// Defect 7, while a round is joinable: a second live handler with the same node id must not
    /// overwrite the first one's join key, so the round never lists one node for two processes
    /// (both would confirm the same rank).
    #[test]
    fn a_node_id_joins_a_round_once() {
        paused(async {
            let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
            let spawn = |node: &'static str, addr: &'static str, after_ms: u64| {
                let kv = kv.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    let mut p = worker_params(3, 3, node);
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

    /// Two live handlers with the same node id (a misconfiguration, or a restart whose old
    /// process is not dead yet) and one other worker, min 2, max 3: whatever the rule (the second
    /// is refused with a clear error, or replaces the first), no round ever lists a node id twice,
    /// and whoever gets a rank finds its own address at it.
    #[test]
    fn two_live_workers_with_one_node_id_never_share_a_round() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("twins"), 2, 3);
            let mut pa = p.clone();
            pa.node_id = Some("twin".into());
            pa.local_addr = Some("host-a".into());
            let mut pb = pa.clone();
            pb.local_addr = Some("host-b".into());
            let mut pc = p.clone();
            pc.node_id = Some("other".into());
            let hs = [
                RendezvousHandler::new(kv.clone(), pa).await.unwrap(),
                RendezvousHandler::new(kv.clone(), pb).await.unwrap(),
                RendezvousHandler::new(kv.clone(), pc).await.unwrap(),
            ];
            let results = timeout(Duration::from_secs(60), support::rendezvous_all(&hs)).await.unwrap();
            let mut ok = Vec::new();
            for (h, r) in hs.iter().zip(results) {
                match r {
                    Ok(info) => {
                        assert_eq!(
                            info.participants[info.rank].addr,
                            h.participant().addr,
                            "{} got a rank whose descriptor is another process's: {info:?}",
                            h.participant().addr
                        );
                        ok.push(info);
                    }
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
            for info in &ok {
                let nodes: BTreeSet<_> = info.participants.iter().map(|p| &p.node).collect();
                assert_eq!(
                    nodes.len(),
                    info.participants.len(),
                    "a node id twice in round {}: {info:?}",
                    info.version
                );
            }
            assert!(
                ok.iter().any(|i| i.participants.iter().any(|p| p.node == "other")),
                "no round formed: {ok:?}"
            );
        });
    }

    /// A worker killed (link cut, no goodbye) and restarted at once with the same node id from
    /// another address, after its round completed: the group completes a round containing the
    /// new one (after the old session's TTL at most), never with its node id twice, never with
    /// its old address.
    #[test]
    fn restart_with_the_same_node_id_after_completing() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("restart-member"), 3, 3);
            let ws = support::workers(&kv, &p, 3).await;
            let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
            let first: Vec<_> =
                support::rendezvous_all(&handlers).await.into_iter().map(Result::unwrap).collect();
            assert_agreement(&first, 3, 3);
            ws[2].kill();
            let restarted_at = Instant::now();
            let mut pn = p.clone();
            pn.node_id = Some("node2".into());
            pn.local_addr = Some("new-host".into());
            let new = Worker::new(&kv, pn, 99).await;
            let group = vec![ws[0].handler.clone(), ws[1].handler.clone(), new.handler.clone()];
            let infos = settle(&group, p.keep_alive_ttl + p.last_call_timeout + Duration::from_secs(5)).await;
            check_no_twin(&infos, "node2", "new-host");
            assert!(
                restarted_at.elapsed() <= p.keep_alive_ttl + Duration::from_secs(5),
                "{:?}",
                restarted_at.elapsed()
            );
        });
    }

    /// The same, while the round is still forming: the old process had joined (its join key is
    /// there, bound to its session) when it was killed and restarted at once from another
    /// address. The round that forms has the new one, once, at its new address — at worst after
    /// the old session's TTL and a stalled freeze.
    #[test]
    fn restart_with_the_same_node_id_while_joining() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("restart-joiner"), 3, 3);
            let ws = support::workers(&kv, &p, 3).await;
            let h0 = ws[0].handler.clone();
            let h2 = ws[2].handler.clone();
            let t0 = tokio::spawn(async move { h0.next_rendezvous().await });
            let old = tokio::spawn(async move { h2.next_rendezvous().await });
            tokio::time::sleep(Duration::from_millis(300)).await;
            ws[2].kill();
            old.abort();
            let mut pn = p.clone();
            pn.node_id = Some("node2".into());
            pn.local_addr = Some("new-host".into());
            let new = Worker::new(&kv, pn, 99).await;
            let hn = new.handler.clone();
            let tn = tokio::spawn(async move { hn.next_rendezvous().await });
            let h1 = ws[1].handler.clone();
            // The round that was forming froze with the old process's join key in it (still alive
            // until its session expires): it stalls until the frozen lease ends, then the next one
            // forms with the new process.
            let bound = p.keep_alive_ttl + FROZEN_TTL + p.last_call_timeout + Duration::from_secs(2);
            let r1 = timeout(bound, h1.next_rendezvous()).await.expect("no round within the bound");
            let r0 = timeout(bound, t0).await.expect("no round within the bound").unwrap();
            let rn = timeout(bound, tn).await.expect("no round within the bound").unwrap();
            let infos = vec![r0.unwrap(), r1.unwrap(), rn.unwrap()];
            assert_agreement(&infos, 3, 3);
            check_no_twin(&infos, "node2", "new-host");
        });
    }

    /// Issue 23, item 11: a worker restarted with its old node id on the same machine, whose
    /// earlier process was frozen into a round and is gone, ends that round at once (the gone
    /// process can never confirm) instead of making everyone wait for the frozen lease (10 s).
    #[test]
    fn a_restarted_worker_ends_a_round_frozen_with_its_gone_predecessor() {
        paused(async {
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
                    && let Ok(rdzv_core::protocol::State::Joinable { version, .. }) =
                        rdzv_core::protocol::State::parse(&kv.key, &kv.value)
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
                rdzv_core::Participant { node: "x".into(), addr: "host-x".into(), pid: gone_pid, port: None };
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
                if let rdzv_core::protocol::State::Frozen { participants, .. } =
                    rdzv_core::protocol::State::parse(&now.key, &now.value).unwrap()
                {
                    assert!(participants.iter().any(|p| p.pid == gone_pid), "{participants:?}");
                    break;
                }
            }
            // x restarts on host-x: the round its earlier process stalls ends at once.
            let mut p = worker_params(2, 2, "x");
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
                rounds
                    .iter()
                    .all(|r| r.version > version && r.participants.iter().all(|p| p.pid != gone_pid))
            );
        });
    }
}

/// The keys under a run stay bounded over many rounds, through failed clean-ups and lost answers.
mod keys {
    use super::*;

    /// Defect 5: the number of keys under a run stays bounded however many rounds pass, and a
    /// worker that gave up waiting no longer counts as waiting.
    #[test]
    fn keys_stay_bounded_over_many_rounds() {
        paused(async {
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
            let mut p = worker_params(2, 2, "late");
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
            assert!(
                workers[0].waiting().await.unwrap().waiters.is_empty(),
                "a cancelled waiter still counts"
            );
        });
    }

    /// Five workers (min 2, max 4: one is always left waiting) re-rendezvous as fast as they
    /// can, for 200+ rounds; the key count under the run, sampled every second and at the end,
    /// stays within a few keys per worker — per-round keys (join, keep-alive, waiting) of
    /// finished rounds do not pile up.
    #[test]
    fn key_count_stays_bounded_over_hundreds_of_rounds() {
        const WORKERS: usize = 5;
        const ROUNDS: u64 = 220;
        paused(async {
            let kv = mem();
            let mut p = params(&run_id("keys"), 2, 4);
            p.last_call_timeout = Duration::from_millis(100);
            p.timeout = Duration::from_secs(60);
            let ws = support::workers(&kv, &p, WORKERS).await;
            let root = ws[0].handler.keys().root().as_bytes().to_vec();
            let limit = KEYS_PER_WORKER * WORKERS as u64 + KEYS_CONSTANT;
            let (done_tx, done) = tokio::sync::watch::channel(false);
            let mut tasks = Vec::new();
            for w in &ws {
                let (h, mut done) = (w.handler.clone(), done.clone());
                tasks.push(tokio::spawn(async move {
                    let mut last = 0;
                    loop {
                        let r = tokio::select! {
                            r = h.next_rendezvous() => r,
                            _ = async { let _ = done.wait_for(|d| *d).await; } => return last,
                        };
                        let info = r.unwrap_or_else(|e| panic!("{}: {e}", h.participant().node));
                        assert!(info.version > last);
                        last = info.version;
                        // Hold the round a moment, as a training step would (and so that the
                        // paused clock moves).
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }));
            }
            let mut samples = Vec::new();
            let started = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let count = kv.count(&root, None).await.unwrap();
                let version =
                    ws[0].handler.backend().get(&ws[0].handler.keys().version_counter()).await.unwrap();
                let version: u64 =
                    version.kv.map(|kv| String::from_utf8_lossy(&kv.value).parse().unwrap()).unwrap();
                samples.push((version, count));
                assert!(
                    count <= limit,
                    "{count} keys under the run after {version} rounds ({WORKERS} workers, limit {limit}); samples \
                     (round, keys): {samples:?}"
                );
                if version >= ROUNDS {
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(3600), "only {version} rounds in an hour");
            }
            done_tx.send_replace(true);
            for t in tasks {
                t.await.unwrap();
            }
            let count = kv.count(&root, None).await.unwrap();
            assert!(
                count <= limit,
                "{count} keys at the end (limit {limit}); samples (round, keys): {samples:?}"
            );
            println!("keys at the end: {count} (limit {limit}); samples (round, keys): {samples:?}");
        });
    }

    /// A clean-up that fails once must not leak a finished round's keys for as long as its
    /// workers live: three workers re-rendezvous 25 times; from round 3 on, each worker's next
    /// `delete_prefix` fails once (whoever opens a round and deletes an old one gets the
    /// failure). At the end the key count is within the bound, and no round older than the
    /// previous one has keys left.
    #[test]
    fn a_failed_cleanup_does_not_leak_a_round() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("cleanup"), 3, 3);
            let ws = support::workers(&kv, &p, 3).await;
            let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
            let mut last = 0;
            for round in 0..25 {
                if round == 2 {
                    ws.iter().for_each(|w| w.link.fail_next(rdzv_core::kv::Op::DeletePrefixLimited));
                }
                let infos: Vec<_> = timeout(Duration::from_secs(30), support::rendezvous_all(&handlers))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
                assert_agreement(&infos, 3, 3);
                last = infos[0].version;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_no_round_left_before(&kv, ws[0].handler.keys().root(), last - 1, 3).await;
        });
    }

    /// Keys of round `keep` and later may exist under run `root`, and at most the bound for
    /// `workers`; nothing of an older round.
    async fn assert_no_round_left_before(kv: &Arc<dyn Kv>, root: &str, keep: u64, workers: u64) {
        let options = rdzv_core::kv::RangeOptions { keys_only: true, ..Default::default() };
        let read = kv.range(root.as_bytes(), options).await.unwrap();
        let old: BTreeSet<String> = read
            .kvs
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(&kv.key[root.len()..]).into_owned();
                let version: u64 = key.strip_prefix("rdzv/v_")?.split('/').next()?.parse().ok()?;
                (version < keep).then_some(key)
            })
            .collect();
        let limit = KEYS_PER_WORKER * workers + KEYS_CONSTANT;
        assert!(
            old.is_empty() && read.count <= limit,
            "{} keys under the run (limit {limit}); keys of rounds before {keep}: {old:?}",
            read.count,
        );
    }

    /// Versions have gaps: a version handed out whose round never opened (the answer to the
    /// counter's swap lost, the creator gone). Each creator used to delete "the round before
    /// the previous one" by number, so a gap left a finished round's keys for as long as its
    /// workers lived (found by `protocol_props`: four rounds' keys under a run). Three workers
    /// re-rendezvous 12 times, and before every other round the counter skips a version; at
    /// the end no round older than the previous one has keys left.
    #[test]
    fn gaps_in_the_versions_do_not_leave_rounds_behind() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("gaps"), 3, 3);
            let ws = support::workers(&kv, &p, 3).await;
            let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
            let counter = ws[0].handler.keys().version_counter();
            let mut versions = Vec::new();
            for round in 0..12 {
                if round % 2 == 1 {
                    let found = kv.get(&counter).await.unwrap().kv.expect("a version counter");
                    let skipped: u64 = String::from_utf8_lossy(&found.value).parse().unwrap();
                    let options =
                        PutOptions { mode: PutMode::Update(found.mod_revision), lease: found.lease };
                    kv.put(&counter, (skipped + 1).to_string().as_bytes(), options).await.unwrap();
                }
                let infos: Vec<_> = timeout(Duration::from_secs(30), support::rendezvous_all(&handlers))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
                assert_agreement(&infos, 3, 3);
                versions.push(infos[0].version);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(versions.windows(2).filter(|w| w[1] > w[0] + 1).count() >= 5, "no gaps: {versions:?}");
            tokio::time::sleep(Duration::from_secs(1)).await;
            let keep = versions[versions.len() - 2];
            assert_no_round_left_before(&kv, ws[0].handler.keys().root(), keep, 3).await;
        });
    }

    /// `workers` (all of the run, `min = max`) form three rounds in turn; their versions.
    async fn three_rounds(workers: &[Worker]) -> Vec<u64> {
        let handlers: Vec<_> = workers.iter().map(|w| w.handler.clone()).collect();
        let mut versions = Vec::new();
        for _ in 0..3 {
            let infos: Vec<_> = timeout(Duration::from_secs(60), support::rendezvous_all(&handlers))
                .await
                .unwrap()
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_agreement(&infos, workers.len(), workers.len());
            versions.push(infos[0].version);
        }
        versions
    }

    /// Records every prefix delete: the prefix, and the limit (`None`: the whole prefix).
    #[derive(Debug)]
    struct DeleteLog {
        inner: Arc<dyn Kv>,
        deletes: std::sync::Mutex<Vec<(String, Option<usize>)>>,
    }

    impl Decorator for DeleteLog {
        fn inner(&self) -> &dyn Kv {
            &*self.inner
        }

        async fn delete_prefix<'a>(
            &'a self,
            prefix: &'a [u8],
        ) -> rdzv_core::KvResult<rdzv_core::kv::DeletePrefixResponse> {
            self.deletes.lock().unwrap().push((String::from_utf8_lossy(prefix).into_owned(), None));
            self.inner.delete_prefix(prefix).await
        }

        async fn delete_prefix_limited<'a>(
            &'a self,
            prefix: &'a [u8],
            limit: usize,
        ) -> rdzv_core::KvResult<rdzv_core::kv::DeletePrefixResponse> {
            self.deletes.lock().unwrap().push((String::from_utf8_lossy(prefix).into_owned(), Some(limit)));
            self.inner.delete_prefix_limited(prefix, limit).await
        }
    }

    /// Issue 25: an old round is deleted a bounded piece at a time (on etcd one delete of a
    /// whole 8,192-worker round stalled the server for seconds and lost the next round's
    /// sessions). 600 workers rendezvous three times; the first round's 600 join keys and 600
    /// keep-alive keys go in deletes of at most `KEYS_PER_DELETE` keys, none of an old round
    /// goes in one unbounded delete, and no round before the previous one is left.
    #[test]
    fn old_rounds_are_deleted_in_bounded_pieces() {
        paused(async {
            const N: usize = 600;
            let log = Arc::new(DeleteLog { inner: mem(), deletes: Default::default() });
            let kv: Arc<dyn Kv> = log.clone();
            let p = params(&run_id("pieces"), N, N);
            let ws = support::workers(&kv, &p, N).await;
            let versions = three_rounds(&ws).await;
            // The deletes wait for the third round to be final, then pause between pieces.
            tokio::time::sleep(Duration::from_secs(30)).await;
            let root = ws[0].handler.keys().root().to_string();
            assert_no_round_left_before(&kv, &root, versions[1], N as u64).await;
            let first_round = format!("{root}rdzv/v_{}/", versions[0]);
            let deletes = log.deletes.lock().unwrap().clone();
            let of_first: Vec<_> =
                deletes.iter().filter(|(prefix, _)| prefix.starts_with(&first_round)).collect();
            assert!(
                of_first
                    .iter()
                    .all(|(_, limit)| *limit == Some(rdzv_core::protocol::forget::KEYS_PER_DELETE)),
                "an old round deleted without a bound: {of_first:?}"
            );
            let joins = format!("{first_round}join/");
            let pieces = of_first.iter().filter(|(prefix, _)| *prefix == joins).count();
            // The full pieces, the rest, and one that finds nothing left.
            let expected = N.div_ceil(rdzv_core::protocol::forget::KEYS_PER_DELETE) + 1;
            assert_eq!(pieces, expected, "{of_first:?}");
        });
    }

    /// On etcd a piece is listed, then deleted up to its last listed key: a listed key whose
    /// lease expires in between is not counted, so the piece deletes fewer than its limit.
    /// This layer does that to the first full piece of a round's join keys: it deletes one
    /// of them first, as its expiry would, then the rest of the listed ones.
    #[derive(Debug)]
    struct ExpiresMidPiece {
        inner: Arc<dyn Kv>,
        done: std::sync::atomic::AtomicBool,
    }

    impl Decorator for ExpiresMidPiece {
        fn inner(&self) -> &dyn Kv {
            &*self.inner
        }

        async fn delete_prefix_limited<'a>(
            &'a self,
            prefix: &'a [u8],
            limit: usize,
        ) -> rdzv_core::KvResult<rdzv_core::kv::DeletePrefixResponse> {
            use std::sync::atomic::Ordering;
            let options =
                rdzv_core::kv::RangeOptions { limit: Some(limit), keys_only: true, ..Default::default() };
            let listed = self.inner.range(prefix, options).await?;
            let is_joins = prefix.ends_with(b"/join/");
            if !is_joins || listed.kvs.len() < limit || self.done.swap(true, Ordering::SeqCst) {
                return self.inner.delete_prefix_limited(prefix, limit).await;
            }
            self.inner.delete(&listed.kvs[0].key, DeleteMode::Any).await?;
            self.inner.delete_prefix_limited(prefix, limit - 1).await
        }
    }

    /// Issue 39, defect 5: a piece that came up short (a listed key expired before the delete)
    /// was taken for the end of the prefix, and the record advanced past a round whose keys
    /// were never all deleted: they stayed for the run's life. Every key of the old rounds
    /// must go all the same.
    #[test]
    fn a_piece_cut_short_by_an_expiry_does_not_end_the_deletes() {
        paused(async {
            const N: usize = rdzv_core::protocol::forget::KEYS_PER_DELETE + 44;
            let layer = Arc::new(ExpiresMidPiece { inner: mem(), done: Default::default() });
            let kv: Arc<dyn Kv> = layer.clone();
            let p = params(&run_id("short-piece"), N, N);
            let ws = support::workers(&kv, &p, N).await;
            let versions = three_rounds(&ws).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert!(layer.done.load(std::sync::atomic::Ordering::SeqCst), "no piece was cut short");
            let root = ws[0].handler.keys().root().to_string();
            assert_no_round_left_before(&kv, &root, versions[1], N as u64).await;
        });
    }

    /// Issue 23, defect 6: a key a call writes for itself is registered for clean-up before the
    /// write. When the write takes effect but its answer is lost and the call then ends (here it
    /// is cancelled), nothing of it may stay bound to the still-live session: neither a `setup`
    /// (every other worker would wait on it) nor a join key (it would be frozen into a round as
    /// a ghost, which then stalls for the frozen lease).
    #[test]
    fn a_lost_answer_then_an_ended_call_leaves_no_setup_and_no_ghost_join_key() {
        paused(async {
            // The setup of the first round.
            let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
            let link = FaultyKv::new(kv.clone(), 1);
            let creator = RendezvousHandler::new(link.clone(), worker_params(1, 1, "a")).await.unwrap();
            link.set_fail_after_applying(true);
            link.fail_next(rdzv_core::kv::Op::Put);
            assert!(
                tokio::time::timeout(Duration::from_millis(10), creator.next_rendezvous()).await.is_err()
            );
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
            let ghost = RendezvousHandler::new(link.clone(), worker_params(2, 2, "a")).await.unwrap();
            link.set_fail_after_applying(true);
            // The join key is written by a counted create where the backend has one (memory does).
            assert!(kv.capabilities().counted_create);
            link.fail_next(rdzv_core::kv::Op::CreateCounted);
            assert!(tokio::time::timeout(Duration::from_millis(10), ghost.next_rendezvous()).await.is_err());
            link.clear();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let late = handler(kv.clone(), 2, 2, "c").await;
            let round = tokio::time::timeout(Duration::from_secs(1), late.next_rendezvous()).await;
            let round = round.expect("a ghost join key stalled the round").unwrap();
            let theirs =
                tokio::time::timeout(Duration::from_secs(1), waiting).await.unwrap().unwrap().unwrap();
            assert_eq!(round.version, theirs.version);
            assert!(round.participants.iter().all(|p| p.node != "a"), "{:?}", round.participants);
        });
    }
}

/// A worker not yet in a round survives the loss of its session.
mod sessions {
    use super::*;

    /// A worker that is waiting or joining survives the loss of its session (the backend was
    /// unreachable for longer than the keep-alive TTL): it starts a new one and carries on.
    #[test]
    fn a_worker_not_yet_in_a_round_survives_a_lost_session() {
        paused(async {
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
        paused(async {
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
}

/// Dropped watches are neither a death nor a reason for a round not to form.
mod watches {
    use super::*;

    /// Watches dropped over and over on a live member: nobody is told a member is gone, and when
    /// a member really dies the others are told within its TTL.
    #[test]
    fn dropped_watches_on_a_live_member_are_not_a_death() {
        paused(async {
            let kv = mem();
            let p = params(&run_id("drops-member"), 3, 3);
            let ws = support::workers(&kv, &p, 3).await;
            let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
            let infos: Vec<_> =
                support::rendezvous_all(&handlers).await.into_iter().map(Result::unwrap).collect();
            assert_agreement(&infos, 3, 3);
            let link = ws[1].link.clone();
            let flapping = tokio::spawn(async move {
                for _ in 0..40 {
                    link.drop_open_watches();
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            });
            let watchers: Vec<_> = ws
                .iter()
                .map(|w| {
                    let h = w.handler.clone();
                    tokio::spawn(async move { timeout(Duration::from_secs(10), h.round_broken()).await })
                })
                .collect();
            for (w, t) in ws.iter().zip(watchers) {
                let told = t.await.unwrap();
                assert!(
                    told.is_err(),
                    "{}: told {told:?} while every member is alive",
                    w.handler.participant().node
                );
            }
            flapping.await.unwrap();
            ws[2].kill();
            let killed = Instant::now();
            for w in &ws[..2] {
                let reason = timeout(p.keep_alive_ttl + Duration::from_secs(2), w.handler.round_broken())
                    .await
                    .expect("a real death went unnoticed");
                assert!(matches!(reason, RoundBroken::MemberGone { .. } | RoundBroken::Ended), "{reason:?}");
            }
            assert!(killed.elapsed() <= p.keep_alive_ttl + Duration::from_secs(2));
        });
    }

    /// Watches that keep dropping while a round forms (each watch of every worker ends after `k`
    /// events, for k = 1..3, or every watch is cut every 200 ms): the round still completes,
    /// within the last call plus a few backoffs. With k = 0 (no watch ever delivers an event)
    /// it must still complete before the deadline.
    #[test]
    fn dropped_watches_while_forming_do_not_stop_the_round() {
        let mut failures = Vec::new();
        for k in [Some(1), Some(2), Some(3), None, Some(0)] {
            let bound = if k == Some(0) { Duration::from_secs(29) } else { Duration::from_secs(10) };
            let outcome = paused(async move {
                let kv = mem();
                let p = params(&run_id("drops-forming"), 3, 3);
                let ws = support::workers(&kv, &p, 3).await;
                for w in &ws {
                    w.link.drop_watches_after(k);
                }
                let links: Vec<_> = ws.iter().map(|w| w.link.clone()).collect();
                let cutter = tokio::spawn(async move {
                    for _ in 0..10 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        if k.is_none() {
                            links.iter().for_each(|l| l.drop_open_watches());
                        }
                    }
                });
                let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
                let started = Instant::now();
                let results = support::rendezvous_all(&handlers).await;
                cutter.abort();
                let took = started.elapsed();
                let versions = format!(
                    "{:?}",
                    results.iter().map(|r| r.as_ref().map(|i| i.version)).collect::<Vec<_>>()
                );
                match results.into_iter().collect::<Result<Vec<_>, _>>() {
                    Ok(infos) if took <= bound => {
                        assert_agreement(&infos, 3, 3);
                        Ok(())
                    }
                    _ => Err(format!("k = {k:?}: after {took:?} (bound {bound:?}): {versions:?}")),
                }
            });
            if let Err(e) = outcome {
                failures.push(e);
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// A spare's deadline does not run behind a full round.
mod deadlines {
    use super::*;

    /// A spare waits as long as the round it waits behind is full and intact, whatever its
    /// timeout; when a member leaves, the spare gets a whole timeout again to form the next round.
    #[test]
    fn a_spare_waits_without_a_deadline_then_gets_a_whole_timeout() {
        paused(async {
            let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
            let (a, b) = (handler(kv.clone(), 2, 2, "a").await, handler(kv.clone(), 2, 2, "b").await);
            let (x, y) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
            let first = x.unwrap().version;
            assert_eq!(y.unwrap().version, first);
            let mut p = worker_params(2, 2, "spare");
            p.timeout = Duration::from_secs(3);
            let spare = RendezvousHandler::new(kv.clone(), p).await.unwrap();
            let pending = tokio::spawn(async move { spare.next_rendezvous().await });
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert!(!pending.is_finished(), "the spare's deadline ran behind a full round");
            // b leaves; a re-enters 2 s later (within the spare's fresh 3 s, beyond any old one).
            b.shutdown().await.unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
            let again =
                tokio::time::timeout(Duration::from_secs(5), a.next_rendezvous()).await.unwrap().unwrap();
            let promoted =
                tokio::time::timeout(Duration::from_secs(5), pending).await.unwrap().unwrap().unwrap();
            assert_eq!((again.version, again.rank), (promoted.version, 0), "a keeps its rank");
            assert_eq!(promoted.rank, 1);
            assert!(promoted.version > first);
        });
    }
}

/// A run's outcome, as its close says.
mod outcomes {
    use super::*;
    use rdzv_core::RunOutcome;

    /// Issue 39, defect 2: under torchrun a faster node closes the run as succeeded while a
    /// slower node's workers still run; should they fail, the job failed. `Failed` replaces
    /// `Succeeded`, and nothing replaces `Failed`.
    #[test]
    fn failed_replaces_succeeded_and_is_final() {
        paused(async {
            let kv = mem();
            let (a, b) = (handler(kv.clone(), 1, 2, "a").await, handler(kv.clone(), 1, 2, "b").await);
            assert_eq!(a.run_outcome().await.unwrap(), None, "an open run has no outcome");
            a.set_closed_with(RunOutcome::Succeeded).await.unwrap();
            assert_eq!(b.run_outcome().await.unwrap(), Some(RunOutcome::Succeeded));
            b.set_closed_with(RunOutcome::Failed).await.unwrap();
            assert_eq!(a.run_outcome().await.unwrap(), Some(RunOutcome::Failed));
            a.set_closed_with(RunOutcome::Succeeded).await.unwrap();
            a.set_closed().await.unwrap();
            assert_eq!(b.run_outcome().await.unwrap(), Some(RunOutcome::Failed));
            assert!(matches!(
                b.next_rendezvous().await,
                Err(RendezvousError::Closed { outcome: Some(RunOutcome::Failed), .. })
            ));
        });
    }
}
