//! A real three-member cluster: requests, a watch and lease refreshes carry on, without gap
//! or duplicate, while members are killed and restarted one at a time (so that, whichever
//! member this process prefers, it is killed once).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use rdzv_core::Kv;
use rdzv_core::kv::{PutOptions, PutOutcome, WatchScope};
use rdzv_etcd::EtcdKv;
use rdzv_etcd::testing::EtcdCluster;

/// Writes `key` until it is written: errors while a member is down or a leader is being
/// elected are retryable. (A retried overwrite of a fresh key is harmless.)
async fn put(kv: &EtcdKv, key: &str) -> i64 {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match kv.put(key.as_bytes(), b"v", PutOptions::OVERWRITE).await {
                Ok(PutOutcome::Written { revision, .. }) => return revision,
                Ok(other) => panic!("not written: {other:?}"),
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("non-retryable error: {e}"),
            }
        }
    })
    .await
    .expect("the cluster keeps accepting writes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_watches_survive_members_going_down_one_at_a_time() {
    let mut cluster = EtcdCluster::start(3).await.expect("a 3-member cluster starts");
    let url = cluster.url("job?min_workers=1");
    assert_eq!(url.matches("127.0.0.1:").count(), 3, "{url}");
    let options = cluster.options().with_request_timeout(Duration::from_secs(3));
    let kv = EtcdKv::connect(options).await.unwrap();
    let first = put(&kv, "c/0").await;
    let mut events = kv.watch(b"c/", WatchScope::Prefix, first).await.unwrap();
    let mut expected = vec!["c/0".to_string()];
    for round in 0..3 {
        cluster.member_mut(round).kill().await.unwrap();
        for i in 0..3 {
            let key = format!("c/{round}-{i}");
            put(&kv, &key).await;
            expected.push(key);
        }
        cluster.member_mut(round).restart().await.unwrap();
    }
    let mut seen = Vec::new();
    let mut last = 0;
    while seen.len() < expected.len() {
        let event = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("the watch delivers")
            .expect("not ended")
            .expect("no error");
        assert!(event.revision() > last, "revision order, no duplicate");
        last = event.revision();
        seen.push(String::from_utf8(event.kv.key).unwrap());
    }
    // Retried writes may show up twice as separate writes; every key must be there, in order.
    seen.dedup();
    assert_eq!(seen, expected);
}

/// `n` leases of `ttl`, granted one after another.
async fn grant(kv: &EtcdKv, n: usize, ttl: Duration) -> Vec<i64> {
    let mut leases = Vec::with_capacity(n);
    for _ in 0..n {
        leases.push(kv.lease_grant(ttl).await.unwrap());
    }
    leases
}

/// Refreshes `leases` in one batch until every one is answered, retrying what may be retried
/// (as the sessions' driver does); each must keep its TTL.
async fn refresh_all(kv: &EtcdKv, leases: &[i64], ttl: Duration) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let answers = kv.lease_keep_alive_many(leases).await;
            if answers.iter().all(Result::is_ok) {
                assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|t| *t == ttl)), "{answers:?}");
                return;
            }
            for failed in answers.iter().filter_map(|a| a.as_ref().err()) {
                assert!(failed.is_retryable(), "non-retryable error: {failed}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the refreshes go through the members still up")
}

/// The sessions' batched refreshes, sent together on a member's shared keep-alive streams,
/// move to another member when theirs is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_lease_refreshes_carry_on_while_members_go_down_one_at_a_time() {
    let mut cluster = EtcdCluster::start(3).await.expect("a 3-member cluster starts");
    let options = cluster.options().with_request_timeout(Duration::from_secs(3));
    let kv = EtcdKv::connect(options).await.unwrap();
    let ttl = Duration::from_secs(60);
    let leases = grant(&kv, 20, ttl).await;
    refresh_all(&kv, &leases, ttl).await;
    for round in 0..3 {
        cluster.member_mut(round).kill().await.unwrap();
        refresh_all(&kv, &leases, ttl).await;
        cluster.member_mut(round).restart().await.unwrap();
    }
}

/// How a test kills a member.
#[derive(Clone, Copy)]
enum Kill {
    /// Awaited: the client's runtime runs meanwhile and may notice first.
    Awaited,
    /// Blocking the (single-threaded) runtime: the client has not noticed when it returns.
    Blocking,
}

/// Each member in turn is killed under a client that just granted the leases, so that,
/// whichever member the client prefers, one of the batches meets it dead; each batch must
/// renew every lease within its one call.
async fn kill_each_member_under_a_batch(how: Kill) {
    let mut cluster = EtcdCluster::start(3).await.expect("a 3-member cluster starts");
    let ttl = Duration::from_secs(60);
    for down in 0..3 {
        let options = cluster.options().with_request_timeout(Duration::from_secs(3));
        let kv = EtcdKv::connect(options).await.unwrap();
        let leases = grant(&kv, 20, ttl).await;
        match how {
            Kill::Awaited => cluster.member_mut(down).kill().await.unwrap(),
            Kill::Blocking => cluster.member_mut(down).kill_blocking().unwrap(),
        }
        let answers = tokio::time::timeout(Duration::from_secs(10), kv.lease_keep_alive_many(&leases))
            .await
            .expect("answered");
        assert!(
            answers.iter().all(|a| a.as_ref().is_ok_and(|t| *t == ttl)),
            "member {down} down: {answers:?}"
        );
        cluster.member_mut(down).restart().await.unwrap();
    }
}

/// A batch whose member is down before any of its refreshes could be sent goes to another
/// member within the same call (none reached a server, so none is sent twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_could_not_be_sent_goes_to_another_member_in_the_same_call() {
    kill_each_member_under_a_batch(Kill::Awaited).await;
}

/// A batch written to a connection whose member was killed before the client noticed (every
/// refresh fails with a broken pipe, and may have reached the server) goes to another member
/// within the same call too: a refresh sent twice only renews its lease twice.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_whose_member_died_unnoticed_goes_to_another_member_in_the_same_call() {
    kill_each_member_under_a_batch(Kill::Blocking).await;
}
