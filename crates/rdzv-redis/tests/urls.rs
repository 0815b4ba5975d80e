//! Connecting from a URL: the factory's options reach the server, plain and over TLS.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;

use rdzv_core::kv::PutOptions;
use rdzv_core::url::{Endpoint, Secret};
use rdzv_core::{BackendFactory, RendezvousUrl};
use rdzv_redis::RedisFactory;
use rdzv_redis::testing::{RedisServer, shared};

use support::{put, raw, within};

fn url(server: &RedisServer, options: &[(&str, &str)]) -> RendezvousUrl {
    RendezvousUrl {
        scheme: "redis".into(),
        endpoints: vec![Endpoint { host: "127.0.0.1".into(), port: server.port() }],
        username: None,
        password: None,
        run_id: "job".into(),
        options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        rendezvous_options: BTreeMap::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn factory_connects_from_a_url() {
    let server = shared();
    let ns = RedisServer::fresh_namespace();
    let factory = RedisFactory;
    assert_eq!(factory.default_port(), Some(6379));
    assert!(factory.options().contains(&"db"));
    let kv = within("connect", factory.connect(&url(server, &[("namespace", &ns), ("db", "2")])))
        .await
        .expect("connect");
    assert_eq!(kv.name(), "redis");
    let rev = put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;
    // The data went to database 2.
    let mut conn = raw(server).await;
    let _: () = redis::cmd("SELECT").arg(2).query_async(&mut conn).await.unwrap();
    let stored: Option<String> =
        redis::cmd("GET").arg(format!("{{rdzv:{ns}}}:rev")).query_async(&mut conn).await.unwrap();
    assert_eq!(stored, Some(rev.to_string()));

    let e = factory.connect(&url(server, &[("bogus", "1")])).await.unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
    // A user the server does not know (over RESP3 the default user, which needs no password
    // here, would take any).
    let mut with_password = url(server, &[("namespace", &ns)]);
    with_password.username = Some("nobody".into());
    with_password.password = Some(Secret::new("sekrit-pw"));
    let e = within("connect with a password", factory.connect(&with_password)).await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(!text.contains("sekrit-pw"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parsed_urls_reach_the_server_plain_and_tls() {
    let server = RedisServer::start_tls().expect("redis-server with TLS");
    let ns = RedisServer::fresh_namespace();
    let plain = RendezvousUrl::parse(&server.url("job", &format!("namespace={ns}&db=1&min_workers=2")))
        .expect("plain URL parses");
    let kv = within("connect", RedisFactory.connect(&plain)).await.expect("plain connect");
    let rev = put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;
    let tls = RendezvousUrl::parse(&server.tls_url("job", &format!("namespace={ns}&db=1")).unwrap())
        .expect("TLS URL parses");
    let kv = within("connect", RedisFactory.connect(&tls)).await.expect("TLS connect");
    // Same server, database and namespace over TLS: the same data.
    assert_eq!(within("get", kv.get(b"k")).await.unwrap().kv.unwrap().mod_revision, rev);
}
