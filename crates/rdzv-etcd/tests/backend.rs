//! etcd specifics the conformance suite does not see: compaction of the server, lease expiry
//! decided by the server and observed through a watch, the granted minimum TTL, keep-alive
//! of a lease granted by another client, namespaces, foreign data under our keys, and
//! etcd's count quirk with a creation-revision filter.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use etcd_client::GetOptions;
use futures::StreamExt;
use rdzv_core::kv::{EventKind, PutMode, PutOptions, PutOutcome, RangeOptions, WatchScope};
use rdzv_core::{Kv, KvError};
use rdzv_etcd::testing::{EtcdServer, shared};
use rdzv_etcd::{EtcdKv, MIN_LEASE_TTL};

const WAIT: Duration = Duration::from_secs(15);

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out {what}"))
}

async fn put(kv: &dyn Kv, key: &[u8], value: &[u8]) -> i64 {
    match within("put", kv.put(key, value, PutOptions::OVERWRITE)).await.unwrap() {
        PutOutcome::Written { revision, .. } => revision,
        other => panic!("not written: {other:?}"),
    }
}

async fn ns_kv(ns: &str) -> EtcdKv {
    let server = shared().await.expect("shared etcd");
    server.try_kv().await.expect("connect").with_namespace(ns)
}

#[tokio::test]
async fn compacting_the_server_fails_older_watches_with_compacted() {
    // Its own server: compaction is server-wide.
    let server = EtcdServer::start().await.expect("etcd");
    let kv = server.kv().await;
    let first = put(&*kv, b"c/a", b"1").await;
    put(&*kv, b"c/a", b"2").await;
    let last = put(&*kv, b"c/a", b"3").await;
    within("compact", kv.compact(last)).await.expect("compact");
    // Compacting again at or below is a no-op, not an error.
    within("compact again", kv.compact(first)).await.expect("idempotent");

    let mut events = within("watch", kv.watch(b"c/", WatchScope::Prefix, first))
        .await
        .expect("the watch opens; the compaction is reported in the stream");
    match within("compacted error", events.next()).await {
        Some(Err(KvError::Compacted { requested, oldest })) => {
            assert_eq!(requested, first);
            assert_eq!(oldest, last);
        }
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(within("end", events.next()).await.is_none(), "ends after the error");

    // From the compaction revision on, history is there.
    let mut events = within("watch", kv.watch(b"c/", WatchScope::Prefix, last)).await.unwrap();
    let event = within("event", events.next()).await.unwrap().unwrap();
    assert_eq!(event.revision(), last);
    assert_eq!(event.kv.value, &b"3"[..]);

    // A future revision cannot be compacted.
    let err = within("future", kv.compact(last + 1000)).await.unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
}

#[tokio::test]
async fn lease_expiry_is_seen_through_a_watch() {
    let kv = ns_kv("expiry/").await;
    let lease = within("grant", kv.lease_grant(Duration::from_secs(1))).await.unwrap();
    let written =
        within("put", kv.put(b"member", b"alive", PutOptions::new(PutMode::Create).with_lease(Some(lease))))
            .await
            .unwrap();
    let PutOutcome::Written { revision, .. } = written else {
        panic!("not written: {written:?}");
    };
    let mut events = kv.watch(b"member", WatchScope::Key, revision + 1).await.unwrap();
    let started = tokio::time::Instant::now();
    let event = within("the expiry's delete event", events.next()).await.unwrap().unwrap();
    let waited = started.elapsed();
    assert_eq!(event.kind, EventKind::Delete);
    assert_eq!(event.kv.key, b"member");
    assert!(event.revision() > revision);
    assert_eq!(event.kv.create_revision, 0);
    // etcd grants at least 2 s (its minimum TTL), and checks expiry every 500 ms.
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_secs(6),
        "expired after {waited:?}"
    );
    assert!(within("get", kv.get(b"member")).await.unwrap().kv.is_none());
    let err = within("keep-alive", kv.lease_keep_alive(lease)).await.unwrap_err();
    assert!(matches!(err, KvError::LeaseNotFound(id) if id == lease), "{err:?}");
}

#[tokio::test]
async fn short_ttls_are_rounded_up_to_what_etcd_grants() {
    let kv = ns_kv("ttl/").await;
    assert_eq!(kv.capabilities().min_lease_ttl, Duration::from_secs(2));
    let lease = kv.lease_grant(Duration::from_millis(300)).await.unwrap();
    let ttl = kv.lease_keep_alive(lease).await.unwrap();
    assert_eq!(ttl, Duration::from_secs(2), "etcd's minimum TTL");
    let lease = kv.lease_grant(Duration::from_millis(3500)).await.unwrap();
    assert_eq!(kv.lease_keep_alive(lease).await.unwrap(), Duration::from_secs(4));
    kv.lease_revoke(lease).await.unwrap();
    let err = kv.lease_revoke(lease).await.unwrap_err();
    assert!(matches!(err, KvError::LeaseNotFound(id) if id == lease), "{err:?}");
}

/// A client of `server` connected by the caller, sharing nothing with the harness's.
async fn separately_connected(server: &EtcdServer) -> EtcdKv {
    let client = etcd_client::Client::connect([server.client_url()], None).await.unwrap();
    EtcdKv::from_client(client, server.client_url())
}

#[tokio::test]
async fn keep_alive_of_a_lease_granted_by_another_client_reports_its_ttl() {
    let server = shared().await.unwrap();
    let granter = server.try_kv().await.unwrap();
    let lease = granter.lease_grant(Duration::from_secs(7)).await.unwrap();
    // A separately connected client knows nothing about that lease.
    let other = separately_connected(server).await;
    assert!(!other.shares_client_with(&granter));
    assert_eq!(other.lease_keep_alive(lease).await.unwrap(), Duration::from_secs(7));
    other.lease_revoke(lease).await.unwrap();
    let err = granter.lease_keep_alive(lease).await.unwrap_err();
    assert!(matches!(err, KvError::LeaseNotFound(_)), "{err:?}");
}

/// A refresh reuses the keep-alive stream the last one left open (the connection's shared
/// streams, `lease_streams.rs`; a lease's own stream, `keep_alive.rs`, for a client the
/// caller connected): each answer on it is its own refresh's, and a lease gone meanwhile —
/// revoked by another client, or expired — is reported as not found on that stream too.
#[tokio::test]
async fn refreshes_on_a_kept_stream_answer_each_refresh_and_see_a_lease_go() {
    let server = shared().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let other = separately_connected(server).await;
    let revoked = kv.lease_grant(Duration::from_secs(7)).await.unwrap();
    let expiring = kv.lease_grant(MIN_LEASE_TTL).await.unwrap();
    for _ in 0..3 {
        assert_eq!(kv.lease_keep_alive(revoked).await.unwrap(), Duration::from_secs(7));
        let both = kv.lease_keep_alive_many(&[revoked, expiring]).await;
        assert!(both.iter().all(Result::is_ok), "{both:?}");
    }
    other.lease_revoke(revoked).await.unwrap();
    let err = kv.lease_keep_alive(revoked).await.unwrap_err();
    assert!(matches!(err, KvError::LeaseNotFound(l) if l == revoked), "{err:?}");
    tokio::time::sleep(MIN_LEASE_TTL + Duration::from_secs(1)).await;
    let err = kv.lease_keep_alive(expiring).await.unwrap_err();
    assert!(matches!(err, KvError::LeaseNotFound(l) if l == expiring), "{err:?}");
}

/// Many leases' refreshes share a few keep-alive streams, pipelined (`lease_streams.rs`):
/// each refresh gets its own lease's answer (every lease here has a TTL of its own), and
/// leases revoked among them are not found while the others on the same streams go on.
#[tokio::test]
async fn many_leases_refreshed_on_shared_streams_each_get_their_own_answer() {
    let server = shared().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    let other = separately_connected(server).await;
    let ttls: Vec<u64> = (0..200).map(|i| 20 + i).collect();
    let mut leases = Vec::new();
    for &ttl in &ttls {
        leases.push(kv.lease_grant(Duration::from_secs(ttl)).await.unwrap());
    }
    for _ in 0..3 {
        let answers = within("refreshes", kv.lease_keep_alive_many(&leases)).await;
        for (answer, &ttl) in answers.iter().zip(&ttls) {
            assert_eq!(answer.as_ref().unwrap(), &Duration::from_secs(ttl));
        }
    }
    let revoked: Vec<_> = leases.iter().copied().step_by(7).collect();
    for &lease in &revoked {
        other.lease_revoke(lease).await.unwrap();
    }
    // All at once, each on its own task: the streams carry many requests in flight.
    let refreshes = leases.iter().map(|&lease| {
        let kv = kv.clone();
        tokio::spawn(async move { kv.lease_keep_alive(lease).await })
    });
    let answers = within("refreshes", futures::future::join_all(refreshes)).await;
    let alone: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    // And all in one batch, every request sent before an answer is read.
    let batched = within("refreshes", kv.lease_keep_alive_many(&leases)).await;
    for answers in [alone, batched] {
        for ((answer, &lease), &ttl) in answers.into_iter().zip(&leases).zip(&ttls) {
            match answer {
                Err(KvError::LeaseNotFound(id)) => assert!(revoked.contains(&lease) && id == lease),
                Ok(got) => {
                    assert!(!revoked.contains(&lease) && got == Duration::from_secs(ttl), "{lease}: {got:?}")
                }
                Err(e) => panic!("{lease}: {e:?}"),
            }
        }
    }
    for lease in leases.into_iter().filter(|l| !revoked.contains(l)) {
        kv.lease_revoke(lease).await.unwrap();
    }
}

#[tokio::test]
async fn namespaces_isolate_keys_ranges_and_watches() {
    let a = ns_kv("iso-a/").await;
    let b = ns_kv("iso-b/").await;
    let rev = put(&a, b"k", b"from a").await;
    put(&b, b"k", b"from b").await;
    assert_eq!(a.get(b"k").await.unwrap().kv.unwrap().value, &b"from a"[..]);
    let all = a.range(b"", RangeOptions::default()).await.unwrap();
    assert_eq!(all.count, 1);
    assert_eq!(all.kvs[0].key, b"k", "keys come back without the namespace");
    let mut events = a.watch(b"", WatchScope::Prefix, rev).await.unwrap();
    let event = within("event", events.next()).await.unwrap().unwrap();
    assert_eq!(event.kv.key, b"k");
    assert_eq!(event.kv.value, &b"from a"[..]);
    put(&b, b"k2", b"b again").await;
    let next = put(&a, b"k2", b"a again").await;
    let event = within("event", events.next()).await.unwrap().unwrap();
    assert_eq!(event.revision(), next, "b's writes are not seen by a's watch");
    // The raw keys carry the namespace.
    let raw = a.client().await.unwrap().kv_client().get("iso-a/k", None).await.unwrap();
    assert_eq!(raw.kvs().len(), 1);
}

#[tokio::test]
async fn foreign_and_binary_data_under_our_keys_is_returned_as_is() {
    let kv = ns_kv("foreign/").await;
    let mut raw = kv.client().await.unwrap().kv_client();
    raw.put("foreign/state", vec![0xff, 0x00, 0xfe], None).await.unwrap();
    let got = kv.get(b"state").await.unwrap().kv.unwrap();
    assert_eq!(got.value, vec![0xff, 0x00, 0xfe]);
    // A swap on the revision another client wrote learns the current value.
    let outcome =
        kv.put(b"state", b"ours", PutOptions::new(PutMode::Update(got.mod_revision - 1))).await.unwrap();
    match outcome {
        PutOutcome::Conflict { current: Some(current) } => {
            assert_eq!(current.value, vec![0xff, 0x00, 0xfe])
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn etcd_counts_before_the_creation_revision_filter_so_we_count_ourselves() {
    let kv = ns_kv("count/").await;
    let first = put(&kv, b"p/1", b"v").await;
    let second = put(&kv, b"p/2", b"v").await;
    put(&kv, b"p/3", b"v").await;
    // What etcd itself answers: the count ignores max_create_revision.
    let raw = kv
        .client()
        .await
        .unwrap()
        .kv_client()
        .get(
            "count/p/",
            Some(GetOptions::new().with_prefix().with_count_only().with_max_create_revision(first)),
        )
        .await
        .unwrap();
    assert_eq!(raw.count(), 3, "etcd's own count is unfiltered");
    // Ours is right, with and without count_only, limit and values.
    for (count_only, keys_only, limit) in [
        (true, false, None),
        (false, true, None),
        (false, false, None),
        (false, false, Some(1)),
        (false, true, Some(1)),
    ] {
        let options = RangeOptions {
            max_create_revision: Some(second),
            count_only,
            keys_only,
            limit,
            ..RangeOptions::default()
        };
        let got = kv.range(b"p/", options).await.unwrap();
        assert_eq!(got.count, 2, "{options:?}");
        let expected = if count_only { 0 } else { limit.unwrap_or(2) };
        assert_eq!(got.kvs.len(), expected, "{options:?}");
        if !count_only && !keys_only {
            assert!(got.kvs.iter().all(|kv| kv.value == b"v"[..]));
        }
        if keys_only {
            assert!(got.kvs.iter().all(|kv| kv.value.is_empty()));
        }
    }
    let none = kv
        .range(b"p/", RangeOptions { max_create_revision: Some(0), ..RangeOptions::default() })
        .await
        .unwrap();
    assert_eq!(none.count, 0);
    assert!(none.revision >= second);
}

#[tokio::test]
async fn an_empty_key_is_an_invalid_argument() {
    let kv = ns_kv("").await;
    let err = kv.put(b"", b"v", PutOptions::OVERWRITE).await.unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
    let err = kv.delete_prefix(b"").await.unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
}

#[tokio::test]
async fn many_values_of_a_mebibyte_replay_through_one_watch() {
    let kv: Arc<dyn Kv> = Arc::new(ns_kv("big/").await);
    let value = vec![7u8; 1024 * 1024];
    let mut first = 0;
    for i in 0..6 {
        let rev = put(&*kv, format!("v{i}").as_bytes(), &value).await;
        if i == 0 {
            first = rev;
        }
    }
    // Six 1 MiB events exceed tonic's default 4 MiB message limit if sent together.
    let mut events = kv.watch(b"v", WatchScope::Prefix, first).await.unwrap();
    for i in 0..6 {
        let event = within("big event", events.next()).await.unwrap().unwrap();
        assert_eq!(event.kv.key, format!("v{i}").as_bytes());
        assert_eq!(event.kv.value.len(), value.len());
    }
    let all = kv.range(b"v", RangeOptions::default()).await.unwrap();
    assert_eq!(all.kvs.len(), 6);
}
