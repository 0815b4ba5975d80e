//! TLS: the server's CA trusted and another refused, client certificates presented and
//! their absence explained.

#![allow(clippy::unwrap_used)]

mod support;

use rdzv_core::kv::PutOptions;
use rdzv_core::{BackendFactory, KvError, RendezvousUrl};
use rdzv_redis::testing::RedisServer;
use rdzv_redis::{RedisFactory, RedisKv};

use support::{connect, put, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connects_with_the_ca_and_refuses_another() {
    let server = RedisServer::start_tls().expect("redis-server with TLS");
    let config = server.tls_config("tls").expect("tls server");
    let kv = connect(config.clone()).await;
    let rev = put(&*kv, b"k", b"over tls", PutOptions::OVERWRITE).await;
    let got = within("get", kv.get(b"k")).await.unwrap();
    assert_eq!((got.revision, got.kv.unwrap().value.to_vec()), (rev, b"over tls".to_vec()));

    let other = tempfile::tempdir().unwrap();
    let wrong = rdzv_redis::testing::TlsFiles::generate(other.path()).unwrap();
    let mut bad = config.clone();
    bad.cacert = Some(wrong.ca);
    let e = within("connect with the wrong CA", RedisKv::connect(bad)).await.unwrap_err();
    assert!(e.to_string().contains(&format!(":{}", server.tls_port().unwrap())), "{e}");

    let mut missing = config;
    missing.cacert = Some(other.path().join("nope.pem"));
    let e = within("connect with a missing CA file", RedisKv::connect(missing)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)) && e.to_string().contains("nope.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates_are_presented_and_their_absence_explained() {
    let server = RedisServer::start_tls_with_client_auth().expect("redis-server with TLS client auth");
    let ns = RedisServer::fresh_namespace();
    let config = server.tls_client_config(&ns).expect("tls server");
    let kv = connect(config.clone()).await;
    let rev = put(&*kv, b"k", b"with a client certificate", PutOptions::OVERWRITE).await;
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().mod_revision, rev);

    // From a URL, with the same option names as etcd's.
    let files = server.tls_files().unwrap();
    let url = server
        .tls_url(
            "job",
            &format!(
                "namespace={ns}&cert={}&key={}",
                files.client_cert.display(),
                files.client_key.display()
            ),
        )
        .unwrap();
    let kv =
        within("connect", RedisFactory.connect(&RendezvousUrl::parse(&url).unwrap())).await.expect("connect");
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().mod_revision, rev);

    // Without one, the server refuses: the error says so and names the options.
    let mut without = config.clone();
    without.cert = None;
    without.key = None;
    let e = within("connect without a client certificate", RedisKv::connect(without)).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, KvError::InvalidArgument(_)), "not retryable: {e:?}");
    assert!(text.contains("client certificate") && text.contains("cert=") && text.contains("key="), "{text}");
    assert!(text.contains(&format!(":{}", server.tls_port().unwrap())), "{text}");

    // A certificate from another CA is refused too; a key file that is not PEM is named.
    let other = tempfile::tempdir().unwrap();
    let stranger = rdzv_redis::testing::TlsFiles::generate(other.path()).unwrap();
    let mut foreign = config.clone();
    foreign.cert = Some(stranger.client_cert);
    foreign.key = Some(stranger.client_key);
    let e = within("connect with a foreign client certificate", RedisKv::connect(foreign)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("refused the client certificate"), "{e}");
    let mut not_pem = config;
    let junk = other.path().join("junk.key");
    std::fs::write(&junk, "not a key").unwrap();
    not_pem.key = Some(junk);
    let e = within("connect with a bad key file", RedisKv::connect(not_pem)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)) && e.to_string().contains("junk.key"), "{e}");
}
