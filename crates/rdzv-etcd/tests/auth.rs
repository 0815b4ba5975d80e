//! User and password: they work against an etcd with auth enabled, and the password never
//! appears in errors or `Debug` output; errors name the endpoint.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rdzv_core::Registry;
use rdzv_core::kv::PutOptions;
use rdzv_core::url::Secret;
use rdzv_core::{Kv, KvError, RendezvousUrl};
use rdzv_etcd::testing::EtcdServer;
use rdzv_etcd::{EtcdFactory, EtcdKv, EtcdOptions};

const PASSWORD: &str = "pw-Sesame-4711";

fn registry() -> Registry {
    let registry = Registry::new();
    registry.register("etcd", Arc::new(EtcdFactory)).unwrap();
    registry
}

fn assert_hidden(what: &str, text: &str) {
    assert!(!text.contains(PASSWORD), "{what} shows the password: {text}");
    assert!(!text.contains("Sesame"), "{what} shows part of the password: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_work_and_never_show() {
    let server = EtcdServer::start_with_auth(PASSWORD).await.unwrap();
    let url = server.url("job?min_workers=1");
    assert!(url.contains("root:"), "{url}");

    // The right password works, through the URL and through options.
    let (kv, _) = registry().connect(&url).await.unwrap();
    kv.put(b"k", b"v", PutOptions::OVERWRITE).await.unwrap();
    assert_hidden("Debug of the backend", &format!("{kv:?}"));
    let direct = server.try_kv().await.unwrap();
    assert_eq!(direct.get(b"k").await.unwrap().kv.unwrap().value, &b"v"[..]);
    // Watches and leases carry the token too.
    let mut events = direct.watch(b"k", rdzv_core::kv::WatchScope::Key, 1).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut events))
        .await
        .expect("an event")
        .expect("not ended")
        .expect("not an error");
    assert_eq!(event.kv.value, &b"v"[..]);
    let lease = direct.lease_grant(Duration::from_secs(5)).await.unwrap();
    direct.lease_keep_alive(lease).await.unwrap();
    direct.lease_revoke(lease).await.unwrap();
    assert_hidden("Debug of the options", &format!("{:?}", server.options()));
    let parsed = RendezvousUrl::parse(&url).unwrap();
    assert_hidden("Debug of the URL", &format!("{parsed:?}"));

    // A wrong password is refused, clearly, without showing either password.
    let wrong = server.options().with_user("root", Secret::new(format!("{PASSWORD}-wrong")));
    let err = EtcdKv::connect(wrong).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("authentication failed"), "{text}");
    assert!(text.contains(&server.client_url()), "names the endpoint: {text}");
    assert_hidden("the error", &text);
    assert_hidden("Debug of the error", &format!("{err:?}"));

    // No credentials against a server with auth: a clear refusal, not a hang.
    let anonymous = EtcdKv::connect(EtcdOptions::new(vec![server.endpoint()])).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), anonymous.get(b"k"))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(matches!(err, KvError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("credentials"), "{err}");
}

#[tokio::test]
async fn an_unreachable_server_does_not_show_the_password_either() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("etcd://root:{PASSWORD}@127.0.0.1:{port}/job?min_workers=1&connect_timeout=1s");
    let err = registry().connect(&url).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert_hidden("the error", &text);
    assert_hidden("Debug of the error", &format!("{err:?}"));
}

#[test]
fn debug_never_shows_the_password() {
    let options = EtcdOptions::new(vec![rdzv_core::url::Endpoint { host: "h".to_string(), port: 1 }])
        .with_user("root", Secret::new(PASSWORD));
    assert_hidden("Debug of the options", &format!("{options:?}"));
    let _: Option<Arc<dyn Kv>> = None;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_renewed() {
    let server = EtcdServer::builder().auth(PASSWORD).arg("--auth-token-ttl=1").start().await.unwrap();
    let kv = server.try_kv().await.unwrap();
    kv.put(b"k", b"1", PutOptions::OVERWRITE).await.unwrap();
    // A client that does not renew its token, to show that it does expire.
    let options = etcd_client::ConnectOptions::new().with_user("root", PASSWORD);
    let mut plain = etcd_client::Client::connect([server.client_url()], Some(options)).await.unwrap();
    plain.get("k", None).await.unwrap();
    // etcd drops simple tokens after their TTL (checked every few seconds).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let expired = plain.get("k", None).await.expect_err("the token expired");
    assert!(expired.to_string().contains("token"), "{expired}");
    kv.put(b"k", b"2", PutOptions::OVERWRITE).await.expect("the client re-authenticates");
    assert_eq!(kv.get(b"k").await.unwrap().kv.unwrap().value, &b"2"[..]);
}
