//! One client per process (and runtime) and connection settings: many handlers, one
//! connection; a client whose runtime is gone is replaced, not reused.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rdzv_core::Kv;
use rdzv_core::Registry;
use rdzv_core::url::Secret;
use rdzv_etcd::testing::{EtcdServer, shared};
use rdzv_etcd::{EtcdFactory, EtcdKv};

fn registry() -> Registry {
    let registry = Registry::new();
    registry.register("etcd", Arc::new(EtcdFactory)).unwrap();
    registry
}

/// Established TCP connections of this machine to `port` (our side: remote port = `port`).
fn connections_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default()
        + &std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    let wanted = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[2].ends_with(&wanted) && fields[3] == "01"
        })
        .count()
}

#[tokio::test]
async fn connects_with_equal_settings_share_one_client() {
    let server = shared().await.unwrap();
    let a = server.try_kv().await.unwrap();
    let b = server.try_kv().await.unwrap();
    assert!(a.shares_client_with(&b));
    // The request timeout is per handle, not per connection.
    let c = EtcdKv::connect(server.options().with_request_timeout(Duration::from_secs(3))).await.unwrap();
    assert!(a.shares_client_with(&c));
    // Other credentials are another client (this server has no auth, so they work).
    let d = EtcdKv::connect(server.options().with_user("someone", Secret::new("x"))).await;
    if let Ok(d) = d {
        assert!(!a.shares_client_with(&d));
    }
    assert!(EtcdKv::cached_clients() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_handlers_use_one_connection() {
    let server = EtcdServer::start().await.unwrap();
    let url = server.url("job?min_workers=1");
    let registry = registry();
    let mut handlers: Vec<Arc<dyn Kv>> = Vec::new();
    for _ in 0..1000 {
        let (kv, _) = registry.connect(&url).await.unwrap();
        handlers.push(kv);
    }
    let reads = handlers.iter().map(|kv| kv.get(b"k"));
    for read in futures::future::join_all(reads).await {
        read.unwrap();
    }
    let connections = connections_to(server.endpoint().port);
    assert!((1..=2).contains(&connections), "1000 handlers hold {connections} connections to etcd");
}

#[test]
fn a_client_is_not_reused_after_its_runtime_is_gone() {
    let first = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let options = first.block_on(async {
        let server = shared().await.unwrap();
        let kv = server.try_kv().await.unwrap();
        kv.get(b"k").await.unwrap();
        server.options()
    });
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    second.block_on(async {
        let kv = EtcdKv::connect(options).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), kv.get(b"k"))
            .await
            .expect("the client of a dead runtime is not handed out")
            .unwrap();
    });
}
