//! Dropped watches are neither a death nor a reason for a round not to form.

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
