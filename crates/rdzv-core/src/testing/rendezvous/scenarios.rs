//! The rendezvous scenarios (mirroring the reference's test-suite intent), generic over the
//! backend. Each takes a shared backend and uses its own run id; each wait is bounded.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use crate::error::RendezvousError;
use crate::ext::KvExt;
use crate::kv::{DeleteMode, Kv, PutOptions};
use crate::layer::Latency;
use crate::params::RankOrder;
use crate::rendezvous::{Participant, RendezvousHandler, RendezvousInfo, RoundBroken, RoundChanges, State};

use super::{assert_agreement, params, rendezvous_all, run_id, workers};

const LIMIT: Duration = Duration::from_secs(60);

/// One worker, min = max = 1: rank 0 of 1, a version, and its round's Store prefix.
pub async fn single_worker(kv: Arc<dyn Kv>) {
    let p = params(&run_id("single"), 1, 1);
    let h = RendezvousHandler::new(kv, p).await.unwrap();
    let info = timeout(LIMIT, h.next_rendezvous()).await.unwrap().unwrap();
    assert_eq!((info.rank, info.world_size), (0, 1));
    assert!(info.version >= 1);
    assert!(info.store_prefix.ends_with(format!("v_{}/kv/", info.version).as_bytes()));
}

/// Four workers, min = max = 4: one round of four, on which all agree.
pub async fn min_equals_max(kv: Arc<dyn Kv>) {
    let p = params(&run_id("fixed"), 4, 4);
    let ws = workers(&kv, &p, 4).await;
    let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&infos, 4, 4);
    assert_eq!(infos[0].world_size, 4);
}

/// Three workers, min 2, max 4: the round waits for the last call (1 s), takes all three,
/// and does not wait much longer.
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

/// Waits until `n` workers wait for the next round (as `observer` reads it).
async fn until_waiting(observer: &RendezvousHandler, n: usize) {
    timeout(LIMIT, async {
        while observer.waiting().await.unwrap().waiters.len() < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
}

/// Starts `handler`'s `next_rendezvous` in the background and waits until it waits for the
/// next round, so that arrival order is known.
async fn spare(
    handler: &RendezvousHandler,
    observer: &RendezvousHandler,
    waiting_before: usize,
) -> tokio::task::JoinHandle<Result<RendezvousInfo, RendezvousError>> {
    let task = spare_later(handler);
    until_waiting(observer, waiting_before + 1).await;
    task
}

/// The info of the member named `node` among `infos`.
fn of<'a>(infos: &'a [RendezvousInfo], node: &str) -> &'a RendezvousInfo {
    infos.iter().find(|i| i.participants[i.rank].node == node).unwrap()
}

/// Workers beyond `max` wait as spares: a full, intact round counts none of them as waiting
/// (re-forming for them would only trade one worker for another, for ever); a round re-formed
/// anyway (every member re-enters, as after a worker failure) keeps its members and ranks.
pub async fn spares_wait_behind_a_full_round(kv: Arc<dyn Kv>) {
    let mut p = params(&run_id("spares"), 2, 4);
    // A full round completes at once; it never waits for the last call.
    p.last_call_timeout = Duration::from_secs(20);
    let ws = workers(&kv, &p, 6).await;
    let members: Vec<_> = ws[..4].iter().map(|w| w.handler.clone()).collect();
    let started = Instant::now();
    let first: Vec<_> =
        timeout(LIMIT, rendezvous_all(&members)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&first, 4, 4);
    assert!(started.elapsed() < Duration::from_secs(10), "a full round waited {:?}", started.elapsed());
    assert!(first.iter().all(|i| i.changes.previous_version.is_none()), "{first:#?}");
    let spares = [spare(&ws[4].handler, &members[0], 0).await, spare(&ws[5].handler, &members[0], 1).await];
    let seen = members[0].waiting().await.unwrap();
    let nodes: Vec<&str> = seen.waiters.iter().map(|j| j.node.as_str()).collect();
    assert_eq!((nodes, seen.admissible, seen.members_alive), (vec!["node4", "node5"], 0, 4));
    for h in members.iter().chain([&ws[4].handler]) {
        assert_eq!(h.num_nodes_waiting().await.unwrap(), 0, "spares are not waiting to be admitted");
    }
    // Every member re-enters: the same four form the next round, each at its rank.
    let again: Vec<_> =
        timeout(LIMIT, rendezvous_all(&members)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&again, 4, 4);
    assert!(again[0].version > first[0].version);
    for info in &again {
        let node = &info.participants[info.rank].node;
        assert_eq!(info.rank, of(&first, node).rank, "{node} moved");
        assert_eq!(info.changes.previous_rank, Some(info.rank));
        assert!(info.changes.left.is_empty() && info.changes.joined.is_empty(), "{:?}", info.changes);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(spares.iter().all(|t| !t.is_finished()), "a spare was admitted to a full round");
    until_waiting(&members[0], 2).await;
    for w in &ws[4..] {
        w.handler.shutdown().await.unwrap();
    }
    for t in spares {
        assert!(matches!(timeout(LIMIT, t).await.unwrap().unwrap(), Err(RendezvousError::Shutdown)));
    }
}

/// When a member dies, the spare that arrived first takes its place as soon as the death is
/// seen (a full round does not wait for the last call), even if another spare joins the next
/// round before it, and every survivor keeps its rank.
pub async fn a_spare_takes_a_dead_members_place(kv: Arc<dyn Kv>) {
    let mut p = params(&run_id("promote"), 2, 3);
    p.last_call_timeout = Duration::from_secs(20);
    let ws = workers(&kv, &p, 5).await;
    let members: Vec<_> = ws[..3].iter().map(|w| w.handler.clone()).collect();
    let first: Vec<_> =
        timeout(LIMIT, rendezvous_all(&members)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&first, 3, 3);
    let spares = [spare(&ws[3].handler, &members[0], 0).await, spare(&ws[4].handler, &members[0], 1).await];
    let [promoted, still_spare] = spares;
    // The first spare's link turns slow: it joins the next round after the second spare,
    // which makes that round full, and still takes the place — the freeze waits for it.
    ws[3].link.set_latency(Latency::Fixed(Duration::from_millis(100)));
    let dead_rank = of(&first, "node1").rank;
    let killed_at = Instant::now();
    ws[1].kill();
    let survivors: Vec<_> = [&ws[0], &ws[2]].iter().map(|w| w.handler.clone()).collect();
    for h in &survivors {
        let reason = timeout(LIMIT, h.round_broken()).await.unwrap();
        assert!(matches!(reason, RoundBroken::MemberGone { .. } | RoundBroken::Ended), "{reason:?}");
    }
    let mut next: Vec<_> =
        timeout(LIMIT, rendezvous_all(&survivors)).await.unwrap().into_iter().map(Result::unwrap).collect();
    let newcomer = timeout(LIMIT, promoted).await.unwrap().unwrap().unwrap();
    let took = killed_at.elapsed();
    // Far below the last call (20 s), which a full round does not wait for.
    assert!(took < p.keep_alive_ttl + Duration::from_secs(10), "the spare came in after {took:?}");
    next.push(newcomer.clone());
    assert_agreement(&next, 3, 3);
    assert_eq!(newcomer.participants[newcomer.rank].node, "node3", "the first spare takes the place");
    assert_eq!(newcomer.rank, dead_rank, "the spare fills the hole");
    assert_eq!(
        newcomer.changes,
        RoundChanges {
            previous_version: Some(first[0].version),
            previous_rank: None,
            left: vec![dead_rank].into(),
            joined: vec![dead_rank].into()
        }
    );
    for info in &next[..2] {
        let node = &info.participants[info.rank].node;
        assert_eq!(info.rank, of(&first, node).rank, "survivor {node} moved");
        assert_eq!(info.changes.previous_rank, Some(info.rank));
        assert_eq!((&*info.changes.left, &*info.changes.joined), (&[dead_rank][..], &[dead_rank][..]));
    }
    assert!(!still_spare.is_finished(), "the second spare stays a spare");
    ws[4].handler.shutdown().await.unwrap();
    assert!(matches!(timeout(LIMIT, still_spare).await.unwrap().unwrap(), Err(RendezvousError::Shutdown)));
}

/// A member excluded by its health check leaves at once: the others see it gone without
/// waiting for its TTL, the spare takes its rank, and its exclusion record (reason, address,
/// since when) is there until it is readmitted — or until its worker is gone.
pub async fn an_excluded_member_leaves_at_once_and_its_record_goes_with_it(kv: Arc<dyn Kv>) {
    let mut p = params(&run_id("exclude"), 2, 3);
    p.last_call_timeout = Duration::from_secs(20);
    p.keep_alive_ttl = Duration::from_secs(10);
    let ws = workers(&kv, &p, 4).await;
    let members: Vec<_> = ws[..3].iter().map(|w| w.handler.clone()).collect();
    let first: Vec<_> =
        timeout(LIMIT, rendezvous_all(&members)).await.unwrap().into_iter().map(Result::unwrap).collect();
    let promoted = spare(&ws[3].handler, &members[0], 0).await;
    let sick_rank = of(&first, "node1").rank;
    let excluded_at = Instant::now();
    members[1].exclude("check `x`: exit status 1").await.unwrap();
    let told = members[1].round_broken().await;
    assert_eq!(told, RoundBroken::Unhealthy { reason: "check `x`: exit status 1".into() });
    for survivor in [&members[0], &members[2]] {
        let reason = timeout(LIMIT, survivor.round_broken()).await.unwrap();
        assert!(matches!(reason, RoundBroken::MemberGone { .. } | RoundBroken::Ended), "{reason:?}");
    }
    let seen = excluded_at.elapsed();
    assert!(seen < p.keep_alive_ttl / 2, "the others saw the exclusion after {seen:?}");
    let records = members[0].exclusions().await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (records[0].node_id.as_str(), records[0].reason.as_str()),
        ("node1", "check `x`: exit status 1")
    );
    assert_eq!(records[0].addr, members[1].participant().addr);
    let mut next: Vec<_> = timeout(LIMIT, rendezvous_all(&[members[0].clone(), members[2].clone()]))
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    next.push(timeout(LIMIT, promoted).await.unwrap().unwrap().unwrap());
    assert_agreement(&next, 3, 3);
    assert_eq!(of(&next, "node3").rank, sick_rank, "the spare takes the excluded member's rank");
    assert!(next.iter().all(|i| i.participants.iter().all(|m| m.node != "node1")));
    // Excluded again (the reason updated, the record kept), readmitted, excluded, then gone.
    members[1].exclude("check `x`: exit status 2").await.unwrap();
    assert_eq!(members[0].exclusions().await.unwrap()[0].reason, "check `x`: exit status 2");
    members[1].readmit().await.unwrap();
    assert!(members[0].exclusions().await.unwrap().is_empty());
    members[1].exclude("check `x`: exit status 3").await.unwrap();
    members[1].shutdown().await.unwrap();
    assert!(members[0].exclusions().await.unwrap().is_empty(), "the record outlived its worker");
}

/// An elastic world that shrinks keeps the survivors' ranks where it can: only a rank beyond
/// the new world size moves, into the hole.
pub async fn survivors_keep_their_ranks_when_the_world_shrinks(kv: Arc<dyn Kv>) {
    let p = params(&run_id("shrink"), 2, 4);
    let ws = workers(&kv, &p, 4).await;
    let all: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
    let first: Vec<_> =
        timeout(LIMIT, rendezvous_all(&all)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&first, 4, 4);
    let node_at = |rank: usize| first[0].participants[rank].node.clone();
    let gone = ws.iter().position(|w| w.handler.participant().node == node_at(1)).unwrap();
    ws[gone].handler.shutdown().await.unwrap();
    let survivors: Vec<_> =
        ws.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, w)| w.handler.clone()).collect();
    let next: Vec<_> =
        timeout(LIMIT, rendezvous_all(&survivors)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&next, 2, 4);
    assert_eq!(next[0].world_size, 3);
    let nodes: Vec<String> = next[0].participants.iter().map(|p| p.node.clone()).collect();
    assert_eq!(nodes, [node_at(0), node_at(3), node_at(2)], "only rank 3 moves, into the hole at 1");
    let mover = of(&next, &node_at(3));
    assert_eq!((mover.rank, mover.changes.previous_rank), (1, Some(3)));
    assert_eq!((&*mover.changes.left, &*mover.changes.joined), (&[1][..], &[][..]));
}

/// With `rank_order=natural`, newcomers take ranks by address, then node id, digits compared
/// as numbers.
pub async fn natural_rank_order(kv: Arc<dyn Kv>) {
    let mut p = params(&run_id("natural"), 3, 3);
    p.rank_order = RankOrder::Natural;
    let mut handlers = Vec::new();
    for node in ["node66", "node7", "node10"] {
        let mut p = p.clone();
        p.node_id = Some(node.into());
        p.local_addr = Some("host".into());
        handlers.push(RendezvousHandler::new(kv.clone(), p).await.unwrap());
    }
    let infos: Vec<_> =
        timeout(LIMIT, rendezvous_all(&handlers)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&infos, 3, 3);
    let nodes: Vec<&str> = infos[0].participants.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes, ["node7", "node10", "node66"]);
}

/// Workers that name segments (s1, s2, s1, s2) hold consecutive ranks per segment. When a
/// member dies, the spare of its segment takes its rank, though a spare of the other segment
/// waited longer, and nothing else moves.
pub async fn segments_hold_consecutive_ranks_and_fill_their_own_holes(kv: Arc<dyn Kv>) {
    let mut p = params(&run_id("segments"), 4, 4);
    p.last_call_timeout = Duration::from_secs(20);
    let mut ws = Vec::new();
    for (i, segment) in ["s1", "s2", "s1", "s2", "s1", "s2"].into_iter().enumerate() {
        let mut p = p.clone();
        p.node_id = Some(format!("node{i}"));
        p.segment = Some(segment.into());
        ws.push(super::Worker::new(&kv, p, i as u64).await);
    }
    let members: Vec<_> = ws[..4].iter().map(|w| w.handler.clone()).collect();
    let first: Vec<_> =
        timeout(LIMIT, rendezvous_all(&members)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&first, 4, 4);
    let by_rank = |info: &RendezvousInfo| -> Vec<String> {
        info.participants.iter().map(|p| p.segment.clone().unwrap_or_default()).collect()
    };
    let segments = by_rank(&first[0]);
    assert!(
        segments[0] == segments[1] && segments[2] == segments[3] && segments[1] != segments[2],
        "{segments:?}"
    );
    // The spare of the other segment than rank 0's waits first; then the one of rank 0's.
    let dead = first[0].participants[0].node.clone();
    let (own, other) = if segments[0] == "s1" { (4, 5) } else { (5, 4) };
    let other_spare = spare(&ws[other].handler, &members[0], 0).await;
    let own_spare = spare(&ws[own].handler, &members[0], 1).await;
    let dead_worker: usize = dead.strip_prefix("node").and_then(|i| i.parse().ok()).unwrap();
    ws[dead_worker].kill();
    let survivors: Vec<_> = ws[..4]
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != dead_worker)
        .map(|(_, w)| w.handler.clone())
        .collect();
    let mut next: Vec<_> =
        timeout(LIMIT, rendezvous_all(&survivors)).await.unwrap().into_iter().map(Result::unwrap).collect();
    let newcomer = timeout(LIMIT, own_spare).await.unwrap().unwrap().unwrap();
    next.push(newcomer.clone());
    assert_agreement(&next, 4, 4);
    assert_eq!((newcomer.rank, newcomer.participants[0].node.as_str()), (0, format!("node{own}").as_str()));
    assert_eq!(by_rank(&newcomer), segments, "the segments keep their ranks");
    for info in &next[..3] {
        let node = &info.participants[info.rank].node;
        assert_eq!(info.rank, of(&first, node).rank, "survivor {node} moved");
    }
    assert!(!other_spare.is_finished(), "the spare of the other segment stays a spare");
    ws[other].handler.shutdown().await.unwrap();
    assert!(matches!(timeout(LIMIT, other_spare).await.unwrap().unwrap(), Err(RendezvousError::Shutdown)));
}

/// Whole segments of two (`segment_size=2`): a first round of s1, s2, s1, s2 holds each
/// segment in a block of two ranks. A lone worker of s3 waits without counting as waiting (it
/// completes no segment, so the members do not re-form for it); a second one completes s3,
/// and the next round takes them in a block of their own while the others keep their ranks.
/// Then a member of s1 dies with no spare of s1: its segment leaves whole (the survivor of s1
/// waits as a spare) and the world shrinks to the two other segments.
pub async fn whole_segments_keep_their_blocks(kv: Arc<dyn Kv>) {
    let mut p = params(&run_id("whole"), 4, 6);
    p.last_call_timeout = Duration::from_secs(1);
    p.segment_size = Some(2);
    let mut ws = Vec::new();
    for (i, segment) in ["s1", "s2", "s1", "s2", "s3", "s3"].into_iter().enumerate() {
        let mut p = p.clone();
        p.node_id = Some(format!("node{i}"));
        p.segment = Some(segment.into());
        ws.push(super::Worker::new(&kv, p, i as u64).await);
    }
    let by_rank = |info: &RendezvousInfo| -> Vec<String> {
        info.participants.iter().map(|p| p.segment.clone().unwrap_or_default()).collect()
    };
    let whole = |segments: &[String]| segments.chunks(2).all(|block| block[0] == block[1]);
    let members: Vec<_> = ws[..4].iter().map(|w| w.handler.clone()).collect();
    let first: Vec<_> =
        timeout(LIMIT, rendezvous_all(&members)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&first, 4, 4);
    assert!(whole(&by_rank(&first[0])), "{:?}", by_rank(&first[0]));
    let lone = spare(&ws[4].handler, &members[0], 0).await;
    for h in &members {
        assert_eq!(h.num_nodes_waiting().await.unwrap(), 0, "a lone worker of s3 completes no segment");
    }
    let pair = spare(&ws[5].handler, &members[0], 1).await;
    assert_eq!(members[0].num_nodes_waiting().await.unwrap(), 2, "two of s3 complete a segment");
    let mut second: Vec<_> =
        timeout(LIMIT, rendezvous_all(&members)).await.unwrap().into_iter().map(Result::unwrap).collect();
    for task in [lone, pair] {
        second.push(timeout(LIMIT, task).await.unwrap().unwrap().unwrap());
    }
    assert_agreement(&second, 6, 6);
    assert_eq!(by_rank(&second[0])[4..], ["s3", "s3"]);
    for info in &second[..4] {
        let node = &info.participants[info.rank].node;
        assert_eq!(info.rank, of(&first, node).rank, "{node} moved");
    }
    // node0 (s1) dies; node2, the other of s1, re-enters with the others but waits.
    ws[0].kill();
    let s1_survivor = spare_later(&ws[2].handler);
    let others: Vec<_> = [1, 3, 4, 5].iter().map(|&i| ws[i].handler.clone()).collect();
    let third: Vec<_> =
        timeout(LIMIT, rendezvous_all(&others)).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_agreement(&third, 4, 4);
    let segments = by_rank(&third[0]);
    assert!(whole(&segments) && !segments.contains(&"s1".to_string()), "{segments:?}");
    let s1_block = of(&second, "node0").rank / 2;
    for info in &third {
        let node = &info.participants[info.rank].node;
        let before = of(&second, node).rank;
        // A block below the new world size stays; one beyond it moves into s1's.
        let expected = if before < 4 { before } else { s1_block * 2 + before % 2 };
        assert_eq!(info.rank, expected, "{node}: rank {before} before");
    }
    assert!(!s1_survivor.is_finished(), "the survivor of an incomplete segment waits as a spare");
    ws[2].handler.shutdown().await.unwrap();
    assert!(matches!(timeout(LIMIT, s1_survivor).await.unwrap().unwrap(), Err(RendezvousError::Shutdown)));
}

/// Starts `handler`'s `next_rendezvous` in the background.
fn spare_later(
    handler: &RendezvousHandler,
) -> tokio::task::JoinHandle<Result<RendezvousInfo, RendezvousError>> {
    let h = handler.clone();
    tokio::spawn(async move { h.next_rendezvous().await })
}

/// A member dies (its link cut, no goodbye): the survivors are told within the TTL and a
/// round trip, and form the next round with the worker that was waiting, without it.
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

/// Closing the run fails every waiting call with `Closed`, and every later call at once.
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

/// Too few workers: the call fails with `Timeout` at its deadline (2 s), not much later.
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

/// A state value that does not parse fails the call (and `num_nodes_waiting`) with a `State`
/// error naming the key.
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

/// The state deleted under a waiting worker: it and the next worker still form a round.
pub async fn state_deleted_underfoot_recovers(kv: Arc<dyn Kv>) {
    let p = params(&run_id("underfoot"), 2, 2);
    let ws = workers(&kv, &p, 2).await;
    // The first worker joins and waits; the state is deleted under it; then the second comes.
    let first = ws[0].handler.clone();
    let t = tokio::spawn(async move { first.next_rendezvous().await });
    let state_key = ws[0].handler.keys().state();
    timeout(LIMIT, kv.wait_for_key(&state_key, Instant::now() + LIMIT)).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    kv.delete(&state_key, DeleteMode::Any).await.unwrap();
    let second = ws[1].handler.clone();
    let r2 = timeout(LIMIT, second.next_rendezvous()).await.unwrap().unwrap();
    let r1 = timeout(LIMIT, t).await.unwrap().unwrap().unwrap();
    assert_agreement(&[r1, r2], 2, 2);
}

/// A member that shuts down is seen gone within a round trip, not a TTL; shutting down does
/// not close the run, and the handler refuses later calls.
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

/// Every member re-entering (as an agent restarting its workers does) forms a new round at
/// once, without waiting for a lease to expire.
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

/// Extra data stored for a round reaches a reader already waiting for it; a key never stored
/// times out at the reader's deadline.
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

/// A round frozen with a ghost (a worker that joined and died before confirming) stalls only
/// until the frozen lease expires; then the live workers form a round without it.
pub async fn confirmation_stall_recovers(kv: Arc<dyn Kv>) {
    let p = params(&run_id("stall"), 2, 2);
    let ws = workers(&kv, &p, 2).await;
    // A joins round v and waits for a second worker.
    let a = ws[0].handler.clone();
    let a_task = tokio::spawn(async move { a.next_rendezvous().await });
    let state_key = ws[0].handler.keys().state();
    let joinable =
        timeout(LIMIT, kv.wait_for_key(&state_key, Instant::now() + LIMIT)).await.unwrap().unwrap();
    let version = match State::parse(&joinable.key, &joinable.value).unwrap() {
        State::Setup => {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = kv.get(&state_key).await.unwrap().kv.unwrap();
            State::parse(&now.key, &now.value).unwrap().version().unwrap()
        }
        s => s.version().unwrap(),
    };
    // A ghost joins (a process that died right after joining, its key not yet expired)…
    let ghost =
        Participant { node: "ghost".into(), addr: "nowhere".into(), pid: 1, port: None, segment: None };
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
            single_worker, min_equals_max, elastic_last_call, spares_wait_behind_a_full_round,
            a_spare_takes_a_dead_members_place, an_excluded_member_leaves_at_once_and_its_record_goes_with_it,
            survivors_keep_their_ranks_when_the_world_shrinks,
            natural_rank_order, segments_hold_consecutive_ranks_and_fill_their_own_holes,
            whole_segments_keep_their_blocks,
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
                $crate::testing::rendezvous::scenarios::$case(kv).await;
            }
        )*
    };
}
