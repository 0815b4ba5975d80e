//! Deterministic liveness tests of the protocol on the in-memory backend under a paused
//! clock: one test per way a single fault used to wedge or corrupt a run (issue 12). Each
//! says what must happen *after* the fault, within a bound well below the call's deadline —
//! a timeout is never an accepted outcome here.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rdzv::core::{Kv, KvExt, RendezvousError, RendezvousHandler, RendezvousInfo, RoundBroken};
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

/// How long a `frozen` state lives when a member never confirms (round.rs `FROZEN_TTL`).
const FROZEN_TTL: Duration = Duration::from_secs(10);

fn mem() -> Arc<dyn Kv> {
    Arc::new(MemKv::new())
}

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
    assert!(wedged.is_empty(), "{} of 48 single faults broke the run:\n{}", wedged.len(), wedged.join("\n"));
}

/// A bound on the keys under a run (see `props::KEYS_PER_WORKER`): a few per live worker plus
/// the run's own keys, however many rounds passed.
const KEYS_PER_WORKER: u64 = 6;
/// The run's own keys (state, version counter, run lease) and some slack.
const KEYS_CONSTANT: u64 = 10;

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
            let version = ws[0].handler.backend().get(&ws[0].handler.keys().version_counter()).await.unwrap();
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
                ws.iter().for_each(|w| w.link.fail_next("delete_prefix"));
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
        let root = ws[0].handler.keys().root().to_string();
        let options = rdzv::core::RangeOptions { keys_only: true, ..Default::default() };
        let read = kv.range(root.as_bytes(), options).await.unwrap();
        let old: BTreeSet<String> = read
            .kvs
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(&kv.key[root.len()..]).into_owned();
                let version: u64 = key.strip_prefix("rdzv/v_")?.split('/').next()?.parse().ok()?;
                (version + 1 < last).then_some(key)
            })
            .collect();
        let limit = KEYS_PER_WORKER * 3 + KEYS_CONSTANT;
        assert!(
            old.is_empty() && read.count <= limit,
            "{} keys under the run after round {last} (limit {limit}); keys of rounds before {}: {old:?}",
            read.count,
            last - 1
        );
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
        let gone = rdzv::core::Participant::parse(&gone.key, &gone.value).unwrap().node;
        kv.delete(&keys.rank(1, 0), rdzv::core::DeleteMode::Any).await.unwrap();
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

/// `shutdown()` while the worker's own `next_rendezvous` is pending (waiting for a second
/// worker): returns at once, the pending call fails with `Shutdown` at once, and the two
/// workers that come next form a round without it that nobody breaks.
#[test]
fn shutdown_cancels_a_pending_call_promptly() {
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
        let r = timeout(Duration::from_secs(1), pending).await.expect("the pending call went on").unwrap();
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
                        let hold = if has_a { Duration::from_secs(2) } else { 2 * h.params().keep_alive_ttl };
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
                                return Err(format!("round {} without A broke: {reason:?}", info.version));
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
            let versions =
                format!("{:?}", results.iter().map(|r| r.as_ref().map(|i| i.version)).collect::<Vec<_>>());
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
