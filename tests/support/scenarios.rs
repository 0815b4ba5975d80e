//! The rendezvous scenarios (mirroring the reference's test-suite intent), generic over the
//! backend. Each takes a shared backend and uses its own run id.

use std::sync::Arc;
use std::time::Duration;

use rdzv::core::{Kv, KvExt, PutOptions, RendezvousError, RendezvousHandler, RoundBroken};
use tokio::time::{Instant, timeout};

use super::{assert_agreement, params, rendezvous_all, run_id, workers};

const LIMIT: Duration = Duration::from_secs(60);

pub async fn single_worker(kv: Arc<dyn Kv>) {
    let p = params(&run_id("single"), 1, 1);
    let h = RendezvousHandler::new(kv, p).await.unwrap();
    let info = timeout(LIMIT, h.next_rendezvous()).await.unwrap().unwrap();
    assert_eq!((info.rank, info.world_size), (0, 1));
    assert!(info.version >= 1);
    assert!(info.store_prefix.ends_with(format!("v_{}/kv/", info.version).as_bytes()));
}

pub async fn min_equals_max(kv: Arc<dyn Kv>) {
    let p = params(&run_id("fixed"), 4, 4);
    let ws = workers(&kv, &p, 4).await;
    let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&infos, 4, 4);
    assert_eq!(infos[0].world_size, 4);
}

pub async fn elastic_last_call(kv: Arc<dyn Kv>) {
    let p = params(&run_id("elastic"), 2, 4);
    let ws = workers(&kv, &p, 3).await;
    let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let started = Instant::now();
    let infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&infos, 2, 4);
    assert_eq!(infos[0].world_size, 3, "all three joined before the last call ended");
    // The round waited for the last call (1 s), and not much longer.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "took {took:?}");
}

pub async fn more_than_max_wait(kv: Arc<dyn Kv>) {
    let p = params(&run_id("extra"), 4, 4);
    let ws = workers(&kv, &p, 6).await;
    let first: Vec<_> = ws[..4].iter().map(|w| w.handler.clone()).collect();
    let infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&first)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&infos, 4, 4);
    // Two late workers wait, and are counted.
    let late: Vec<_> = ws[4..].iter().map(|w| w.handler.clone()).collect();
    let late_task = tokio::spawn(async move { rendezvous_all(&late).await });
    let counted = timeout(LIMIT, async {
        loop {
            let n = first[0].num_nodes_waiting().await.unwrap();
            if n == 2 {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(counted, 2);
    // The members re-rendezvous to admit them: a round of 4 out of 6 (max = 4) forms, and two wait again.
    let mut all: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let members = all.drain(..4).collect::<Vec<_>>();
    let again = tokio::spawn(async move { rendezvous_all(&members).await });
    let mut results: Vec<_> = timeout(LIMIT, again).await.unwrap().unwrap();
    let late_results = timeout(Duration::from_secs(5), late_task).await;
    // Exactly 4 of the 6 are in the new round; whoever is not keeps waiting (still running).
    if let Ok(Ok(late)) = late_results {
        results.extend(late);
    }
    let ok: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
    let newest = ok.iter().map(|i| i.version).max().unwrap();
    let round: Vec<_> = ok.into_iter().filter(|i| i.version == newest).collect();
    assert!(newest > infos[0].version);
    assert_agreement(&round, 4, 4);
}

pub async fn member_death_forms_new_round(kv: Arc<dyn Kv>) {
    let p = params(&run_id("death"), 2, 3);
    let ws = workers(&kv, &p, 4).await;
    let first: Vec<_> = ws[..3].iter().map(|w| w.handler.clone()).collect();
    let infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&first)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&infos, 2, 3);
    let v1 = infos[0].version;
    // A fourth worker arrives late and waits.
    let waiter = ws[3].handler.clone();
    let waiting = tokio::spawn(async move { waiter.next_rendezvous().await });
    // Member 2 dies (no goodbye: its lease must expire).
    let killed_at = Instant::now();
    ws[2].kill();
    // The survivors are told within the TTL plus a round trip.
    for w in &ws[..2] {
        let reason = timeout(LIMIT, w.handler.round_broken()).await.unwrap();
        assert!(matches!(reason, RoundBroken::MemberGone { .. } | RoundBroken::Ended), "{reason:?}");
    }
    let told = killed_at.elapsed();
    assert!(told <= p.keep_alive_ttl + Duration::from_secs(3), "told after {told:?}");
    // Survivors and the waiter form the next round.
    let survivors: Vec<_> = ws[..2].iter().map(|w| w.handler.clone()).collect();
    let mut infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&survivors)).await.unwrap().into_iter().map(Result::unwrap).collect();
    infos.push(timeout(LIMIT, waiting).await.unwrap().unwrap().unwrap());
    assert_agreement(&infos, 2, 3);
    assert!(infos[0].version > v1);
    assert_eq!(infos[0].world_size, 3);
    assert!(infos.iter().all(|i| i.participants.iter().all(|p| p.node != "node2")));
}

pub async fn close_while_waiting(kv: Arc<dyn Kv>) {
    let p = params(&run_id("close"), 3, 3);
    let ws = workers(&kv, &p, 2).await;
    let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let waiting = tokio::spawn(async move { rendezvous_all(&handlers).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closer = RendezvousHandler::new(kv.clone(), p.clone()).await.unwrap();
    closer.set_closed().await.unwrap();
    for r in timeout(LIMIT, waiting).await.unwrap().unwrap() {
        assert!(matches!(r, Err(RendezvousError::Closed { .. })), "{r:?}");
    }
    assert!(closer.is_closed().await.unwrap());
    // And every later call fails at once.
    let late = RendezvousHandler::new(kv, p).await.unwrap();
    assert!(matches!(late.next_rendezvous().await, Err(RendezvousError::Closed { .. })));
}

pub async fn timeout_when_too_few(kv: Arc<dyn Kv>) {
    let mut p = params(&run_id("few"), 3, 3);
    p.timeout = Duration::from_secs(2);
    let h = RendezvousHandler::new(kv, p).await.unwrap();
    let started = Instant::now();
    let r = timeout(LIMIT, h.next_rendezvous()).await.unwrap();
    assert!(matches!(r, Err(RendezvousError::Timeout { .. })), "{r:?}");
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(2) && took <= Duration::from_secs(3), "took {took:?}");
}

pub async fn corrupt_state_is_a_state_error(kv: Arc<dyn Kv>) {
    for garbage in [
        &b"not json"[..],
        br#"{"status":"final","version":"x"}"#,
        br#"{"status":"frozen","version":1,"participants":[]}"#,
    ] {
        let p = params(&run_id("corrupt"), 1, 1);
        let h = RendezvousHandler::new(kv.clone(), p).await.unwrap();
        let key = h.keys().state();
        kv.put(&key, garbage, PutOptions::OVERWRITE).await.unwrap();
        match timeout(LIMIT, h.next_rendezvous()).await.unwrap() {
            Err(RendezvousError::State { key: k, .. }) => assert_eq!(k.as_bytes(), key.as_slice()),
            other => panic!("{garbage:?}: expected a state error, got {other:?}"),
        }
        assert!(matches!(h.num_nodes_waiting().await, Err(RendezvousError::State { .. })));
    }
}

pub async fn state_deleted_underfoot_recovers(kv: Arc<dyn Kv>) {
    let p = params(&run_id("underfoot"), 2, 2);
    let ws = workers(&kv, &p, 2).await;
    // The first worker joins and waits; the state is deleted under it; then the second comes.
    let first = ws[0].handler.clone();
    let t = tokio::spawn(async move { first.next_rendezvous().await });
    let state_key = ws[0].handler.keys().state();
    timeout(LIMIT, kv.wait_for_key(&state_key, Instant::now() + LIMIT)).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    kv.delete(&state_key, rdzv::core::DeleteMode::Any).await.unwrap();
    let second = ws[1].handler.clone();
    let r2 = timeout(LIMIT, second.next_rendezvous()).await.unwrap().unwrap();
    let r1 = timeout(LIMIT, t).await.unwrap().unwrap().unwrap();
    assert_agreement(&[r1, r2], 2, 2);
}

pub async fn leave_is_fast_and_not_close(kv: Arc<dyn Kv>) {
    let p = params(&run_id("leave"), 2, 2);
    let ws = workers(&kv, &p, 2).await;
    let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&infos, 2, 2);
    let left_at = Instant::now();
    ws[1].handler.shutdown().await.unwrap();
    let reason = timeout(LIMIT, ws[0].handler.round_broken()).await.unwrap();
    assert!(matches!(reason, RoundBroken::MemberGone { .. }), "{reason:?}");
    // Told in a round trip, not a TTL.
    assert!(left_at.elapsed() < p.keep_alive_ttl, "took {:?}", left_at.elapsed());
    assert!(!ws[0].handler.is_closed().await.unwrap(), "shutdown must not close the run");
    assert!(matches!(ws[1].handler.next_rendezvous().await, Err(RendezvousError::Shutdown)));
}

pub async fn reentry_leaves_at_once(kv: Arc<dyn Kv>) {
    let p = params(&run_id("reentry"), 2, 2);
    let ws = workers(&kv, &p, 2).await;
    let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let first: Vec<_> =
        timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap().into_iter().map(Result::unwrap).collect();
    // Everyone re-enters (as an agent restarting its workers would): a new round forms without
    // waiting for any lease to expire.
    let started = Instant::now();
    let second: Vec<_> =
        timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&second, 2, 2);
    assert!(second[0].version > first[0].version);
    assert!(started.elapsed() < p.keep_alive_ttl, "re-rendezvous took {:?}", started.elapsed());
}

pub async fn extra_data_round_trips_and_times_out(kv: Arc<dyn Kv>) {
    let p = params(&run_id("extra-data"), 1, 1);
    let h = RendezvousHandler::new(kv, p).await.unwrap();
    let info = h.next_rendezvous().await.unwrap();
    let reader = h.clone();
    let v = info.version;
    let read = tokio::spawn(async move { reader.load_extra_data(v, "addr", Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.store_extra_data(v, "addr", b"10.0.0.1:29500").await.unwrap();
    assert_eq!(read.await.unwrap().unwrap(), b"10.0.0.1:29500");
    let started = Instant::now();
    let missing = h.load_extra_data(v, "missing", Duration::from_millis(500)).await;
    assert!(matches!(missing, Err(RendezvousError::Timeout { .. })), "{missing:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

pub async fn confirmation_stall_recovers(kv: Arc<dyn Kv>) {
    let p = params(&run_id("stall"), 2, 2);
    let ws = workers(&kv, &p, 2).await;
    // A joins round v and waits for a second worker.
    let a = ws[0].handler.clone();
    let a_task = tokio::spawn(async move { a.next_rendezvous().await });
    let state_key = ws[0].handler.keys().state();
    let joinable =
        timeout(LIMIT, kv.wait_for_key(&state_key, Instant::now() + LIMIT)).await.unwrap().unwrap();
    let version = match rdzv::core::State::parse(&joinable.key, &joinable.value).unwrap() {
        rdzv::core::State::Setup => {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = kv.get(&state_key).await.unwrap().kv.unwrap();
            rdzv::core::State::parse(&now.key, &now.value).unwrap().version().unwrap()
        }
        s => s.version().unwrap(),
    };
    // A ghost joins (a process that died right after joining, its key not yet expired)…
    let ghost = rdzv::core::Participant { node: "ghost".into(), addr: "nowhere".into(), pid: 1, port: None };
    let ghost_key = ws[0].handler.keys().join(version, "ghost");
    kv.put(&ghost_key, &ghost.to_bytes(), PutOptions::OVERWRITE).await.unwrap();
    // …so the round freezes with A and the ghost, and B comes too late for it.
    let started = Instant::now();
    let b = ws[1].handler.clone();
    let b_task = tokio::spawn(async move { b.next_rendezvous().await });
    // The ghost never confirms: the frozen state's lease expires and everyone starts over.
    let ra = timeout(LIMIT, a_task).await.unwrap().unwrap().unwrap();
    let rb = timeout(LIMIT, b_task).await.unwrap().unwrap().unwrap();
    assert_agreement(&[ra.clone(), rb], 2, 2);
    assert!(ra.version > version, "the stalled round {version} must not complete");
    assert!(ra.participants.iter().all(|p| p.node != "ghost"));
    assert!(started.elapsed() >= Duration::from_secs(9), "recovered after {:?}", started.elapsed());
}

/// Runs every scenario as its own `#[tokio::test]` with the attribute given (the clock and
/// runtime the backend needs), given an async builder of the backend evaluated once per
/// case. Invoke it in a module of its own: the tests are named after the scenarios.
#[macro_export]
macro_rules! rendezvous_scenarios {
    (#[$attr:meta]; $builder:expr) => {
        $crate::rendezvous_scenarios!(@cases $attr; $builder;
            single_worker, min_equals_max, elastic_last_call, more_than_max_wait,
            member_death_forms_new_round, close_while_waiting, timeout_when_too_few,
            corrupt_state_is_a_state_error, state_deleted_underfoot_recovers,
            leave_is_fast_and_not_close, reentry_leaves_at_once, extra_data_round_trips_and_times_out,
            confirmation_stall_recovers);
    };
    (@cases $attr:meta; $builder:expr; $($case:ident),*) => {
        $(
            #[$attr]
            async fn $case() {
                let kv = $builder.await;
                $crate::support::scenarios::$case(kv).await;
            }
        )*
    };
}
