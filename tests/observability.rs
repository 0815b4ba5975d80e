//! What a worker reports of itself (docs/OBSERVABILITY.md): its events, in order and with the
//! fields documented, and the metrics that count them and its backend's operations. Memory
//! backend, paused clock.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdzv_core::events::{Event, EventKind, LostReason};
use rdzv_core::layer::FaultyKv;
use rdzv_core::metrics::Metrics;
use rdzv_core::testing::rendezvous::{params, rendezvous_all, run_id, workers};
use rdzv_core::{Kv, RendezvousHandler, RunOutcome};
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(120);

/// The events `worker` reports from now on.
fn record(worker: &RendezvousHandler) -> Arc<Mutex<Vec<Event>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let into = seen.clone();
    worker.on_event(move |e| into.lock().unwrap().push(e.clone()));
    seen
}

fn names(events: &Mutex<Vec<Event>>) -> Vec<&'static str> {
    events.lock().unwrap().iter().map(|e| e.kind.name()).collect()
}

/// The value of the series `series` (name and labels, as encoded) in `text`.
fn value(text: &str, series: &str) -> f64 {
    let line = text.lines().find(|l| l.split(' ').next() == Some(series));
    line.and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// Two members form a round with a spare behind it; one dies; the spare takes its place; the
/// run is closed. Each worker tells its own part of it, in order.
#[tokio::test(start_paused = true)]
async fn each_worker_reports_its_part_of_the_story_in_order() {
    let kv: Arc<dyn Kv> = Arc::new(rdzv_mem::MemKv::new());
    let run = run_id("events");
    let p = params(&run, 2, 2);
    let ws = workers(&kv, &p, 3).await;
    let seen: Vec<_> = ws.iter().map(|w| record(&w.handler)).collect();
    let dying = Metrics::new();
    dying.attach(&ws[1].handler);

    let first: Vec<_> = timeout(LIMIT, rendezvous_all(&[ws[0].handler.clone(), ws[1].handler.clone()]))
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let spare = ws[2].handler.clone();
    let promoted = tokio::spawn(async move { spare.next_rendezvous().await });
    while ws[0].handler.waiting().await.unwrap().waiters.is_empty() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dead_rank = first[1].rank;
    ws[1].kill();
    timeout(LIMIT, ws[0].handler.round_broken()).await.unwrap();
    let second = timeout(LIMIT, ws[0].handler.next_rendezvous()).await.unwrap().unwrap();
    let newcomer = timeout(LIMIT, promoted).await.unwrap().unwrap().unwrap();
    assert_eq!(newcomer.rank, dead_rank);
    // The dead member learns it is one, once its lease runs out.
    timeout(LIMIT, ws[1].handler.round_broken()).await.unwrap();
    ws[0].handler.set_closed_with(RunOutcome::Succeeded).await.unwrap();
    timeout(LIMIT, ws[2].handler.round_broken()).await.unwrap();
    tokio::task::yield_now().await;

    // The survivor: its round, the member it lost, the next round, the close.
    assert_eq!(names(&seen[0]), ["round_formed", "member_lost", "round_formed", "run_closed"]);
    let survivor = seen[0].lock().unwrap().clone();
    match &survivor[1].kind {
        EventKind::MemberLost { version, reason: LostReason::MemberGone, rank, member, after_seconds } => {
            assert_eq!(*version, first[0].version);
            assert_eq!((*rank, member.as_deref()), (Some(dead_rank), Some("node1")));
            assert!(*after_seconds >= p.keep_alive_ttl.as_secs_f64(), "seen after {after_seconds} s");
        }
        EventKind::MemberLost { reason: LostReason::Ended, rank: None, member: None, .. } => {}
        other => panic!("{other:?}"),
    }
    match &survivor[2].kind {
        EventKind::RoundFormed { version, previous_version, previous_rank, left, joined, .. } => {
            assert_eq!((*version, *previous_version), (second.version, Some(first[0].version)));
            assert_eq!(*previous_rank, Some(second.rank));
            assert_eq!((&**left, &**joined), (&[dead_rank][..], &[dead_rank][..]));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        survivor[3].kind,
        EventKind::RunClosed { outcome: Some(RunOutcome::Succeeded), by_this_worker: true }
    );

    // The dead member: its refreshes fail until its lease is lost.
    let dead = names(&seen[1]);
    assert_eq!(dead[0], "round_formed");
    assert!(
        dead[1..dead.len() - 1].iter().all(|n| *n == "lease_refresh_failed") && dead.len() > 2,
        "{dead:?}"
    );
    let last = seen[1].lock().unwrap().last().unwrap().kind.clone();
    assert!(
        matches!(&last, EventKind::MemberLost { reason: LostReason::LeaseLost, rank: Some(r), member: Some(m), .. } if *r == dead_rank && m == "node1"),
        "{last:?}"
    );
    let text = dying.encode();
    assert_eq!(value(&text, "rdzv_lease_refresh_failures_total"), (dead.len() - 2) as f64, "{text}");
    assert_eq!(value(&text, r#"rdzv_members_lost_total{reason="lease_lost"}"#), 1.0);
    assert_eq!(value(&text, r#"rdzv_members_lost_total{reason="member_gone"}"#), 0.0);

    // The spare: promoted into the dead member's place, then sees the run closed by another.
    assert_eq!(names(&seen[2]), ["round_formed", "spare_promoted", "run_closed"]);
    let spare = seen[2].lock().unwrap().clone();
    assert_eq!(
        spare[1].kind,
        EventKind::SparePromoted {
            version: newcomer.version,
            rank: dead_rank,
            waited_behind: first[0].version
        }
    );
    assert_eq!(spare[2].kind, EventKind::RunClosed { outcome: None, by_this_worker: false });

    // Every event is stamped with its worker, and is one JSON line.
    for (i, events) in seen.iter().enumerate() {
        for event in events.lock().unwrap().iter() {
            let v: serde_json::Value = serde_json::from_str(&event.json_line()).unwrap();
            assert_eq!(
                (v["run_id"].as_str(), v["node"].as_str()),
                (Some(run.as_str()), Some(&*format!("node{i}")))
            );
            assert!(v["time"].as_str().unwrap().ends_with('Z'), "{v}");
        }
    }
}

/// Metrics count the rounds, their duration, the members, and every backend operation by
/// kind and result.
#[tokio::test(start_paused = true)]
async fn metrics_count_rounds_and_backend_operations() {
    let kv: Arc<dyn Kv> = Arc::new(rdzv_mem::MemKv::new());
    let metrics = Metrics::new();
    let faulty = FaultyKv::new(kv.clone(), 7);
    let instrumented = metrics.instrument(faulty.clone());
    let p = params(&run_id("metrics"), 2, 2);
    let mut handlers = Vec::new();
    for node in ["a", "b"] {
        let mut p = p.clone();
        p.node_id = Some(node.into());
        let handler = RendezvousHandler::new(instrumented.clone(), p).await.unwrap();
        metrics.attach(&handler);
        handlers.push(handler);
    }
    for round in timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap() {
        round.unwrap();
    }
    faulty.fail_next(rdzv_core::kv::Op::Get);
    assert!(instrumented.get(b"x").await.is_err());

    let text = metrics.encode();
    assert_eq!(value(&text, "rdzv_rounds_formed_total"), 2.0, "{text}");
    assert_eq!(value(&text, "rdzv_rendezvous_duration_seconds_count"), 2.0);
    assert_eq!(value(&text, "rdzv_round_members"), 2.0);
    assert_eq!(value(&text, "rdzv_round_version"), 1.0);
    assert_eq!(value(&text, &format!(r#"rdzv_worker_info{{run_id="{}",node="a"}}"#, p.run_id)), 1.0);
    assert_eq!(value(&text, r#"rdzv_backend_operations_total{op="get",result="error"}"#), 1.0);
    // Two sessions, and the run lease.
    assert!(value(&text, r#"rdzv_backend_operations_total{op="lease_grant",result="ok"}"#) >= 3.0);
    assert!(value(&text, r#"rdzv_backend_operations_total{op="put",result="ok"}"#) >= 2.0);
    assert!(value(&text, r#"rdzv_backend_operation_duration_seconds_count{op="watch"}"#) >= 1.0);
    assert_eq!(
        value(&text, r#"rdzv_restarts_total{cause="admit_waiting"}"#),
        0.0,
        "every cause shows from the start"
    );
    handlers[0].set_closed().await.unwrap();
}

/// A worker that names its segment is described with it in its metrics and events; one that
/// does not has no segment label at all (checked above).
#[tokio::test(start_paused = true)]
async fn a_workers_segment_is_in_its_description() {
    let kv: Arc<dyn Kv> = Arc::new(rdzv_mem::MemKv::new());
    let metrics = Metrics::new();
    let mut p = params(&run_id("segment"), 1, 1);
    p.node_id = Some("a".into());
    p.segment = Some("rack-7".into());
    let handler = RendezvousHandler::new(kv, p.clone()).await.unwrap();
    metrics.attach(&handler);
    let seen = record(&handler);
    timeout(LIMIT, handler.next_rendezvous()).await.unwrap().unwrap();

    let text = metrics.encode();
    let series = format!(r#"rdzv_worker_info{{run_id="{}",node="a",segment="rack-7"}}"#, p.run_id);
    assert_eq!(value(&text, &series), 1.0, "{text}");
    let events = seen.lock().unwrap().clone();
    assert!(!events.is_empty());
    for event in events.iter() {
        assert_eq!(event.segment.as_deref(), Some("rack-7"), "{event:?}");
        assert!(event.json_line().contains(r#""segment":"rack-7""#), "{}", event.json_line());
    }
    handler.set_closed().await.unwrap();
}
