//! Size limits against a real etcd: a key or value over the limit is refused before
//! anything is sent (no proposal reaches the server) with `TooLarge` naming the limit; the
//! largest allowed write — largest key, largest value, the mode that names the key most
//! often — passes etcd's own default limit; and a raised server limit is usable through the
//! `max_request_bytes` option.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdzv_core::Registry;
use rdzv_core::kv::{PutMode, PutOptions, PutOutcome, RangeOptions, WatchScope};
use rdzv_core::{Kv, KvError};
use rdzv_etcd::testing::EtcdServer;
use rdzv_etcd::{DEFAULT_MAX_REQUEST_BYTES, EtcdFactory, MAX_KEY_BYTES, REQUEST_RESERVE_BYTES};

const WAIT: Duration = Duration::from_secs(15);

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out {what}"))
}

fn assert_too_large(err: &KvError, expected_what: &str, expected_size: usize, expected_limit: usize) {
    match err {
        KvError::TooLarge { backend, what, size, limit, .. } => {
            assert_eq!(*backend, "etcd");
            assert!(what.contains(expected_what), "{what}");
            assert_eq!((*size, *limit), (expected_size, expected_limit), "{err}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(err.to_string().contains(&expected_limit.to_string()), "names the limit: {err}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn over_the_limits_is_refused_before_sending_and_the_largest_write_passes() {
    let server = EtcdServer::start().await.unwrap();
    let kv = server.try_kv().await.unwrap().with_namespace("ns/");
    let limit = DEFAULT_MAX_REQUEST_BYTES - REQUEST_RESERVE_BYTES;
    assert_eq!(kv.max_value_bytes(), limit);

    // One byte over: refused at once, and the server never saw it.
    let before = server.proposals_committed().await.unwrap();
    let started = Instant::now();
    let err = kv.put(b"k", &vec![1u8; limit + 1], PutOptions::OVERWRITE).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1), "fails fast: {:?}", started.elapsed());
    assert_too_large(&err, "value", limit + 1, limit);
    assert!(
        err.to_string().contains("--max-request-bytes") && err.to_string().contains("max_request_bytes"),
        "{err}"
    );
    // A key of MAX_KEY_BYTES + 1 (namespace included), whatever the operation.
    let long_key = vec![b'k'; MAX_KEY_BYTES + 1 - "ns/".len()];
    let key_errors = [
        kv.put(&long_key, b"v", PutOptions::OVERWRITE).await.map(|_| ()).unwrap_err(),
        kv.get(&long_key).await.map(|_| ()).unwrap_err(),
        kv.delete(&long_key, rdzv_core::kv::DeleteMode::Any).await.map(|_| ()).unwrap_err(),
        kv.range(&long_key, RangeOptions::default()).await.map(|_| ()).unwrap_err(),
        kv.watch(&long_key, WatchScope::Prefix, 1).await.map(|_| ()).unwrap_err(),
    ];
    for err in &key_errors {
        assert_too_large(err, "key", MAX_KEY_BYTES + 1, MAX_KEY_BYTES);
        assert!(err.to_string().contains("fixed") && !err.to_string().contains("option"), "{err}");
    }
    let after = server.proposals_committed().await.unwrap();
    assert_eq!(before, after, "nothing reached the server");

    // The largest key and value, in the mode that names the key five times, fit etcd's
    // default --max-request-bytes.
    let key = vec![b'k'; MAX_KEY_BYTES - "ns/".len()];
    let value = vec![2u8; limit];
    let created = match within("create", kv.put(&key, &value, PutOptions::new(PutMode::Create))).await {
        Ok(PutOutcome::Written { revision, .. }) => revision,
        other => panic!("the largest create passes: {other:?}"),
    };
    let updated = within("update", kv.put(&key, &value, PutOptions::new(PutMode::Update(created)))).await;
    assert!(matches!(updated, Ok(PutOutcome::Written { .. })), "the largest update passes: {updated:?}");
    let read = within("get", kv.get(&key)).await.unwrap().kv.unwrap();
    assert_eq!(read.value.len(), limit);
}

#[tokio::test]
async fn a_raised_server_limit_is_usable_through_the_option() {
    let raised = 4 * 1024 * 1024;
    let server = EtcdServer::builder().arg(format!("--max-request-bytes={raised}")).start().await.unwrap();
    let registry = Registry::new();
    registry.register("etcd", Arc::new(EtcdFactory)).unwrap();
    let value = vec![3u8; 3 * 1024 * 1024];

    // With etcd's default assumed, 3 MiB is refused here, before sending.
    let (kv, _) = registry.connect(&server.url("job?min_workers=1")).await.unwrap();
    let err = kv.put(b"big", &value, PutOptions::OVERWRITE).await.unwrap_err();
    assert_too_large(&err, "value", value.len(), DEFAULT_MAX_REQUEST_BYTES - REQUEST_RESERVE_BYTES);

    // With the server's limit given, it goes through.
    let url = server.url(&format!("job?min_workers=1&max_request_bytes={raised}"));
    let (kv, _) = registry.connect(&url).await.unwrap();
    within("put 3 MiB", kv.put(b"big", &value, PutOptions::OVERWRITE)).await.unwrap();
    assert_eq!(within("get", kv.get(b"big")).await.unwrap().kv.unwrap().value.len(), value.len());
}

#[tokio::test]
async fn an_option_above_the_servers_limit_gets_the_servers_refusal_with_a_hint() {
    let server = EtcdServer::start().await.unwrap();
    // Claiming 4 MiB against a server of etcd's default: etcd refuses, and the error says
    // which option to check.
    let kv = server.try_kv().await.unwrap().with_max_request_bytes(4 * 1024 * 1024);
    let err = within("put", kv.put(b"big", &vec![4u8; 2 * 1024 * 1024], PutOptions::OVERWRITE)).await;
    let err = err.unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("max_request_bytes"), "{err}");
    let _: Option<Arc<dyn Kv>> = None;
}
