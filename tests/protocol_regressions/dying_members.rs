//! A member that dies just before its round turns final is noticed by the others.

use super::*;

/// Defect 3: a member whose keep-alive key vanishes after the last confirmer counted it but
/// before `final` is written is still reported by `round_broken`, to both members.
#[test]
fn the_monitor_sees_a_member_that_died_just_before_final() {
    paused(async {
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
