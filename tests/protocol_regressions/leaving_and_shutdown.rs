//! A worker that leaves or shuts down is never handed back its round, and a pending call ends at once.

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
        let result = tokio::time::timeout(Duration::from_secs(1), pending).await.expect("call still pending");
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
