//! The health gate of the facade's workers (docs/PROTOCOL.md "Health gates"), in one process
//! on the in-memory backend, with real shell commands as checks: each node's check fails
//! while a file named after it exists. Real time, short intervals.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rdzv::{HealthParams, Rendezvous, RendezvousError, RendezvousParams, Round, RoundBroken};
use rdzv_core::Kv;
use rdzv_core::events::EventKind;
use tokio::time::{Instant, sleep, timeout};

const INTERVAL: Duration = Duration::from_millis(300);
const FAILURES: u32 = 2;
const LIMIT: Duration = Duration::from_secs(30);

/// Where each node's sickness is switched on and off.
struct Ward(tempfile::TempDir);

impl Ward {
    fn new() -> Ward {
        Ward(tempfile::tempdir().unwrap())
    }

    fn flag(&self, node: &str) -> PathBuf {
        self.0.path().join(format!("sick-{node}"))
    }

    fn sicken(&self, node: &str) {
        std::fs::write(self.flag(node), "").unwrap();
    }

    fn heal(&self, node: &str) {
        std::fs::remove_file(self.flag(node)).unwrap();
    }
}

fn params(run: &str, node: &str, max: usize, ward: &Ward) -> RendezvousParams {
    let mut p = RendezvousParams::new(run, 2, max).unwrap();
    p.node_id = Some(node.into());
    p.timeout = LIMIT;
    p.last_call_timeout = Duration::from_millis(500);
    p.keep_alive_ttl = Duration::from_secs(3);
    let check = format!("test ! -e {} || {{ echo '{node} is sick'; exit 1; }}", ward.flag(node).display());
    let mut health = HealthParams::new(check);
    health.interval = INTERVAL;
    health.failures = FAILURES;
    health.timeout = Duration::from_secs(5);
    p.health = Some(health);
    p
}

async fn worker(kv: &Arc<dyn Kv>, run: &str, node: &str, max: usize, ward: &Ward) -> Rendezvous {
    Rendezvous::new(kv.clone(), params(run, node, max, ward)).await.unwrap()
}

fn join(w: &Rendezvous) -> tokio::task::JoinHandle<Result<Round, RendezvousError>> {
    let w = w.clone();
    tokio::spawn(async move { w.next_rendezvous().await })
}

/// The events of `w`, as they come.
fn record(w: &Rendezvous) -> Arc<std::sync::Mutex<Vec<EventKind>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let into = seen.clone();
    w.on_event(move |e| into.lock().unwrap().push(e.kind.clone()));
    seen
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    timeout(LIMIT, async {
        while !done().await {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

fn node(round: &Round) -> &str {
    &round.info.participants[round.info.rank].node
}

/// A node whose check fails stays out, visibly and without counting as waiting, even with
/// the world below `min`; once its check passes it joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_node_is_never_admitted_and_joins_once_it_recovers() {
    let kv: Arc<dyn Kv> = Arc::new(rdzv::mem::MemKv::new());
    let ward = Ward::new();
    ward.sicken("b");
    let a = worker(&kv, "gate", "a", 2, &ward).await;
    let b = worker(&kv, "gate", "b", 2, &ward).await;
    let b_events = record(&b);
    let (ja, jb) = (join(&a), join(&b));
    until("b's exclusion record", async || a.exclusions().await.unwrap().len() == 1).await;
    let excluded = &a.exclusions().await.unwrap()[0];
    assert_eq!(excluded.node_id, "b");
    assert!(excluded.reason.contains("exit status 1: b is sick"), "{excluded:?}");
    assert!(!excluded.since.is_empty());
    sleep(5 * INTERVAL).await;
    assert!(!ja.is_finished() && !jb.is_finished(), "a round formed with the unhealthy node");
    let waiting = a.waiting().await.unwrap();
    assert!(waiting.waiters.iter().all(|j| j.node != "b"), "{waiting:?}");
    ward.heal("b");
    let (ra, rb) =
        timeout(LIMIT, async { (ja.await.unwrap().unwrap(), jb.await.unwrap().unwrap()) }).await.unwrap();
    assert_eq!((ra.info.world_size, rb.info.world_size), (2, 2));
    assert!(a.exclusions().await.unwrap().is_empty(), "the record outlived the exclusion");
    let names: Vec<&'static str> = b_events.lock().unwrap().iter().map(EventKind::name).collect();
    let excluded_at = names.iter().position(|n| *n == "excluded").expect("excluded reported");
    let readmitted_at = names.iter().position(|n| *n == "readmitted").expect("readmitted reported");
    assert!(
        excluded_at < readmitted_at && names.iter().filter(|n| **n == "excluded").count() == 1,
        "{names:?}"
    );
    a.set_closed().await.unwrap();
}

/// A member that turns bad leaves after `failures` checks in a row; the others see it gone at
/// once (no TTL wait), and the spare takes its rank while the survivors keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_turns_bad_is_drained_and_a_spare_takes_its_rank() {
    let kv: Arc<dyn Kv> = Arc::new(rdzv::mem::MemKv::new());
    let ward = Ward::new();
    let members = [
        worker(&kv, "drain", "a", 3, &ward).await,
        worker(&kv, "drain", "b", 3, &ward).await,
        worker(&kv, "drain", "c", 3, &ward).await,
    ];
    let first = futures::future::try_join_all(members.iter().map(Rendezvous::next_rendezvous)).await.unwrap();
    let spare = worker(&kv, "drain", "s", 3, &ward).await;
    let promoted = join(&spare);
    until("the spare waiting", async || members[0].waiting().await.unwrap().waiters.len() == 1).await;
    let b_events = record(&members[1]);
    let b_rank = first.iter().find(|r| node(r) == "b").unwrap().info.rank;
    let sick_at = Instant::now();
    ward.sicken("b");
    let reason = timeout(LIMIT, members[1].round_broken()).await.unwrap();
    assert!(
        matches!(&reason, RoundBroken::Unhealthy { reason } if reason.contains("b is sick")),
        "{reason:?}"
    );
    for survivor in [&members[0], &members[2]] {
        let reason = timeout(LIMIT, survivor.round_broken()).await.unwrap();
        assert!(matches!(reason, RoundBroken::MemberGone { .. } | RoundBroken::Ended), "{reason:?}");
    }
    let seen = sick_at.elapsed();
    let bound = INTERVAL * (FAILURES + 1) + Duration::from_secs(2);
    assert!(seen < bound, "the survivors saw the drain after {seen:?} (bound {bound:?}; the TTL is 3 s)");
    let again = futures::future::try_join_all([&members[0], &members[2]].map(Rendezvous::next_rendezvous))
        .await
        .unwrap();
    let newcomer = timeout(LIMIT, promoted).await.unwrap().unwrap().unwrap();
    assert_eq!(newcomer.info.rank, b_rank, "the spare takes the drained member's rank");
    for round in &again {
        let before = first.iter().find(|r| node(r) == node(round)).unwrap();
        assert_eq!(round.info.rank, before.info.rank, "survivor {} moved", node(round));
    }
    let excluded = members[0].exclusions().await.unwrap();
    assert_eq!(excluded.iter().map(|e| e.node_id.as_str()).collect::<Vec<_>>(), ["b"]);
    let names: Vec<&'static str> = b_events.lock().unwrap().iter().map(EventKind::name).collect();
    assert_eq!(names, ["health_check_failed", "health_check_failed", "drained", "excluded"]);
    members[1].shutdown().await.unwrap();
    assert!(members[0].exclusions().await.unwrap().is_empty(), "the record outlived its node");
    members[0].set_closed().await.unwrap();
}

/// A spare whose check fails withdraws: when a member then dies, the healthy spare behind it
/// is promoted, not the sick one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_that_turns_bad_is_not_promoted() {
    let kv: Arc<dyn Kv> = Arc::new(rdzv::mem::MemKv::new());
    let ward = Ward::new();
    let members = [worker(&kv, "spare", "a", 2, &ward).await, worker(&kv, "spare", "b", 2, &ward).await];
    futures::future::try_join_all(members.iter().map(Rendezvous::next_rendezvous)).await.unwrap();
    let first_spare = worker(&kv, "spare", "s1", 2, &ward).await;
    let waits_first = join(&first_spare);
    until("s1 waiting", async || members[0].waiting().await.unwrap().waiters.len() == 1).await;
    let second_spare = worker(&kv, "spare", "s2", 2, &ward).await;
    let waits_second = join(&second_spare);
    until("s2 waiting", async || members[0].waiting().await.unwrap().waiters.len() == 2).await;
    ward.sicken("s1");
    until("s1 withdrawn and excluded", async || {
        let waiting = members[0].waiting().await.unwrap();
        waiting.waiters.len() == 1 && members[0].exclusions().await.unwrap().len() == 1
    })
    .await;
    members[1].shutdown().await.unwrap();
    members[0].next_rendezvous().await.unwrap();
    let promoted = timeout(LIMIT, waits_second).await.unwrap().unwrap().unwrap();
    assert_eq!(node(&promoted), "s2");
    assert!(!waits_first.is_finished(), "the sick spare was promoted");
    first_spare.shutdown().await.unwrap();
    let ended = timeout(LIMIT, waits_first).await.unwrap().unwrap();
    assert!(matches!(ended, Err(RendezvousError::Shutdown)), "{ended:?}");
    members[0].set_closed().await.unwrap();
}

/// A check that cannot run at all the first time is a bad command line, said at once; a run
/// closed while a node is out ends its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_check_is_an_error_and_a_close_ends_the_wait() {
    let kv: Arc<dyn Kv> = Arc::new(rdzv::mem::MemKv::new());
    let ward = Ward::new();
    let mut p = params("bad", "x", 2, &ward);
    p.health.as_mut().unwrap().checks = vec!["rdzv-no-such-check --now".into()];
    let bad = Rendezvous::new(kv.clone(), p).await.unwrap();
    match timeout(LIMIT, bad.next_rendezvous()).await.unwrap() {
        Err(RendezvousError::Config(e)) => {
            let text = e.to_string();
            assert!(text.contains("health_check") && text.contains("not found"), "{text}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    let mut p = params("bad", "y", 2, &ward);
    p.health.as_mut().unwrap().checks = vec!["builtin:gpus".into()];
    assert!(matches!(Rendezvous::new(kv.clone(), p).await, Err(RendezvousError::Config(_))));

    ward.sicken("z");
    let out = worker(&kv, "closing", "z", 2, &ward).await;
    let waits = join(&out);
    until("z excluded", async || out.exclusions().await.unwrap().len() == 1).await;
    out.set_closed().await.unwrap();
    let ended = timeout(LIMIT, waits).await.unwrap().unwrap();
    assert!(matches!(ended, Err(RendezvousError::Closed { .. })), "{ended:?}");
    assert!(Path::new(&ward.flag("z")).exists());
}
