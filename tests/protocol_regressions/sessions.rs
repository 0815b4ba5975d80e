//! A worker not yet in a round survives the loss of its session.

use super::*;

/// A worker that is waiting or joining survives the loss of its session (the backend was
/// unreachable for longer than the keep-alive TTL): it starts a new one and carries on.
#[test]
fn a_worker_not_yet_in_a_round_survives_a_lost_session() {
    paused(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let links: Vec<_> = (0..2).map(|i| FaultyKv::new(kv.clone(), i)).collect();
        let mut pending = Vec::new();
        for (i, link) in links.iter().enumerate() {
            let h = handler(link.clone(), 3, 3, &format!("w{i}")).await;
            pending.push(tokio::spawn(async move { h.next_rendezvous().await }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // An outage of 6 s, three keep-alive TTLs: both sessions expire on the server.
        for link in &links {
            link.set_failure_probability(1.0);
            link.drop_open_watches();
        }
        tokio::time::sleep(Duration::from_secs(6)).await;
        for link in &links {
            link.clear();
        }
        let third = handler(kv.clone(), 3, 3, "w2").await;
        let r3 = tokio::time::timeout(Duration::from_secs(10), third.next_rendezvous())
            .await
            .expect("the round did not complete after the outage")
            .unwrap();
        for p in pending {
            let r = p.await.unwrap().unwrap();
            assert_eq!(r.version, r3.version);
        }
    });
}

/// A put under a session lease that expired surfaces as `LeaseLost`-style recovery, never as
/// a raw backend error: here the whole call still completes.
#[test]
fn a_worker_whose_lease_expired_unnoticed_still_completes() {
    paused(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let link = FaultyKv::new(kv.clone(), 3);
        let a = handler(link.clone(), 1, 1, "a").await;
        // The lease expires on the server while the worker's refreshes fail; the next call
        // must not fail with a backend "lease not found" error.
        link.set_failure_probability(1.0);
        tokio::time::sleep(Duration::from_secs(5)).await;
        link.clear();
        let r = tokio::time::timeout(Duration::from_secs(10), a.next_rendezvous()).await.unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
}
