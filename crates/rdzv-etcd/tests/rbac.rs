//! The minimum etcd role rdzv needs (docs/ETCD.md, "RBAC"), against a real etcd with
//! authentication on: a user whose only role grants read and write on the keys under the
//! rendezvous prefix completes a rendezvous and uses the round's Store keys (writes with a
//! lease, reads, ranges, watches, deletes, keep-alive and revoke); a user with read but no
//! write permission, or with no role, fails at once with a clear permission error — not a
//! hang, not "unavailable".

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Permission};
use futures::StreamExt;
use rdzv_core::Registry;
use rdzv_core::kv::{PutOptions, RangeOptions, WatchScope};
use rdzv_core::{Kv, KvError, RendezvousError, RendezvousHandler, RendezvousParams};
use rdzv_etcd::EtcdFactory;
use rdzv_etcd::testing::EtcdServer;

const ROOT_PASSWORD: &str = "root-pw-4711";
const PASSWORD: &str = "worker-pw-0815";
const PREFIX: &str = "/rdzv-rbac";
const WAIT: Duration = Duration::from_secs(20);

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out {what} (a hang)"))
}

/// Creates role `role` with `permission` on the keys under `PREFIX/`, and user `user` with
/// that role only (no role when `permission` is `None`).
async fn add_user(admin: &mut Client, user: &str, role: &str, permission: Option<Permission>) {
    admin.user_add(user, PASSWORD, None).await.unwrap();
    if let Some(permission) = permission {
        admin.role_add(role).await.unwrap();
        admin.role_grant_permission(role, permission).await.unwrap();
        admin.user_grant_role(user, role).await.unwrap();
    }
}

async fn server_with_users() -> EtcdServer {
    let server = EtcdServer::start_with_auth(ROOT_PASSWORD).await.unwrap();
    let options = ConnectOptions::new().with_user("root", ROOT_PASSWORD);
    let mut admin = Client::connect([server.client_url()], Some(options)).await.unwrap();
    // The documented role: read and write on every key under the prefix.
    let keys = format!("{PREFIX}/");
    add_user(&mut admin, "worker", "rdzv", Some(Permission::read_write(keys.clone()).with_prefix())).await;
    add_user(&mut admin, "reader", "rdzv-read", Some(Permission::read(keys).with_prefix())).await;
    add_user(&mut admin, "nobody", "", None).await;
    server
}

async fn connect(server: &EtcdServer, user: &str, run: &str) -> (Arc<dyn Kv>, RendezvousParams) {
    let registry = Registry::new();
    registry.register("etcd", Arc::new(EtcdFactory)).unwrap();
    let url = format!(
        "etcd://{user}:{PASSWORD}@127.0.0.1:{}/{run}?min_workers=2&max_workers=2&prefix={PREFIX}\
         &last_call_timeout=1s&keep_alive_ttl=3s&timeout=60s",
        server.endpoint().port
    );
    within("connect", registry.connect(&url)).await.expect("authentication works for every user")
}

fn assert_permission_denied(err: &KvError) {
    assert!(matches!(err, KvError::Backend { .. }), "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.contains("permission denied") && text.contains("roles"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_role_is_enough_and_less_fails_clearly() {
    let server = server_with_users().await;

    // --- The documented role: a full round of two, and the Store's operations.
    let (kv, params) = connect(&server, "worker", "job").await;
    let mut handlers = Vec::new();
    for node in ["a", "b"] {
        let mut p = params.clone();
        p.node_id = Some(node.to_string());
        handlers.push(within("join", RendezvousHandler::new(kv.clone(), p)).await.unwrap());
    }
    let (first, second) = within(
        "rendezvous",
        futures::future::join(handlers[0].next_rendezvous(), handlers[1].next_rendezvous()),
    )
    .await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!((first.world_size, second.world_size), (2, 2));
    assert_eq!(first.rank + second.rank, 1, "ranks 0 and 1");
    assert!(first.store_prefix.starts_with(PREFIX.as_bytes()));

    // The Store of the round: lease-bound and plain writes, reads, ranges, watches, deletes.
    let store = first.store_prefix.clone();
    let key = |name: &str| [store.as_slice(), name.as_bytes()].concat();
    let lease = kv.lease_grant(Duration::from_secs(5)).await.unwrap();
    kv.put(&key("leased"), b"1", PutOptions::OVERWRITE.with_lease(Some(lease))).await.unwrap();
    kv.put(&key("plain"), b"2", PutOptions::OVERWRITE).await.unwrap();
    assert_eq!(kv.get(&key("plain")).await.unwrap().kv.unwrap().value, &b"2"[..]);
    let listed = kv.range(&store, RangeOptions::default()).await.unwrap();
    assert_eq!(listed.count, 2);
    let mut events = kv.watch(&store, WatchScope::Prefix, listed.revision).await.unwrap();
    assert!(within("watch event", events.next()).await.unwrap().is_ok());
    kv.lease_keep_alive(lease).await.unwrap();
    kv.lease_revoke(lease).await.unwrap();
    kv.delete(&key("plain"), rdzv_core::kv::DeleteMode::Any).await.unwrap();
    assert_eq!(kv.range(&store, RangeOptions::default()).await.unwrap().count, 0);
    within("close", handlers[0].set_closed()).await.unwrap();
    for handler in &handlers {
        within("shutdown", handler.shutdown()).await.unwrap();
    }

    // --- Read permission only: joining fails at once with a permission error.
    let (kv, mut params) = connect(&server, "reader", "job2").await;
    params.node_id = Some("r".to_string());
    let started = Instant::now();
    let result = async {
        let handler = RendezvousHandler::new(kv.clone(), params).await?;
        handler.next_rendezvous().await
    };
    match within("a refused rendezvous", result).await {
        Err(RendezvousError::Backend(err)) => assert_permission_denied(&err),
        other => panic!("expected a permission error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "fails at once: {:?}", started.elapsed());
    // Reading is allowed, writing is not.
    kv.get(format!("{PREFIX}/x").as_bytes()).await.unwrap();
    let err = kv.put(format!("{PREFIX}/x").as_bytes(), b"v", PutOptions::OVERWRITE).await.unwrap_err();
    assert_permission_denied(&err);

    // --- No role at all: even reading the prefix is refused, clearly.
    let (kv, _) = connect(&server, "nobody", "job3").await;
    let err = kv.get(format!("{PREFIX}/x").as_bytes()).await.unwrap_err();
    assert_permission_denied(&err);
    let err = kv.range(format!("{PREFIX}/").as_bytes(), RangeOptions::default()).await.unwrap_err();
    assert_permission_denied(&err);
}
