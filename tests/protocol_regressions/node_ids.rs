//! One live process per node id, and a process restarted with its old node id.

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
        let again =
            tokio::time::timeout(Duration::from_secs(10), other.next_rendezvous()).await.unwrap().unwrap();
        let mine = tokio::time::timeout(Duration::from_secs(10), pending).await.unwrap().unwrap().unwrap();
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
        let before = rdzv_core::Participant {
            node: "x".into(),
            addr: "host-x".into(),
            pid: gone_pid,
            port: None,
            segment: None,
        };
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
            rounds.iter().all(|r| r.version > version && r.participants.iter().all(|p| p.pid != gone_pid))
        );
    });
}
