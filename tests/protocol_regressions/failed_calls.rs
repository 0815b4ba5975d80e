//! One failed call — before it reached the store, or after it took effect with only its answer lost — never wedges a run or fails a complete round.

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
    assert!(wedged.is_empty(), "{} of 48 single faults broke the run:\n{}", wedged.len(), wedged.join("\n"));
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
        let addr = tokio::time::timeout(Duration::from_secs(10), rb.store.get(rdzv::MASTER_ADDR_KEY)).await;
        assert_eq!(addr.unwrap().unwrap(), master.bootstrap.master_addr.as_bytes());
        let broken = tokio::time::timeout(Duration::from_secs(5), a.round_broken()).await;
        assert!(broken.is_err(), "the round broke: {broken:?}");
    });
}
