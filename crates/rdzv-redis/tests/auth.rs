//! Logging in: passwords and ACL users, which never show in errors, and the ACL rules of
//! docs/REDIS.md, which are enough (and less fails clearly).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use rdzv_core::kv::{EventKind, PutOptions, RangeOptions, WatchScope};
use rdzv_core::url::Secret;
use rdzv_core::{Kv, KvError};
use rdzv_redis::RedisKv;
use rdzv_redis::testing::RedisServer;

use support::{connect, next, put, raw, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_acl_users_log_in_and_never_show() {
    let server = RedisServer::start_with_args(&[
        "--requirepass",
        "default-pw",
        "--user",
        "alice",
        "on",
        ">alice-pw",
        "~*",
        "&*",
        "+@all",
    ])
    .expect("redis-server with a password");
    let mut config = server.config("auth");
    config.password = Some(Secret::new("default-pw"));
    let kv = connect(config.clone()).await;
    put(&*kv, b"k", b"v", PutOptions::OVERWRITE).await;

    let mut alice = config.clone();
    alice.username = Some("alice".into());
    alice.password = Some(Secret::new("alice-pw"));
    let kv = connect(alice.clone()).await;
    assert!(within("get", kv.get(b"k")).await.unwrap().kv.is_some());

    alice.password = Some(Secret::new("wrong-secret-pw"));
    let e = within("connect with a wrong password", RedisKv::connect(alice)).await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(!text.contains("wrong-secret-pw") && text.contains(&server.port().to_string()), "{text}");
    let mut nobody = config;
    nobody.password = None;
    let e = within("connect without a password", RedisKv::connect(nobody)).await.unwrap_err();
    assert!(!format!("{e:?}").contains("default-pw"), "{e:?}");
}

/// The ACL rules documented in docs/REDIS.md, for user `user` (password `password`) in
/// namespace `namespace`: the test runs exactly what the documentation says.
fn documented_acl(user: &str, password: &str, namespace: &str) -> Vec<String> {
    let doc = include_str!("../../../docs/REDIS.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER rdzv on >CHANGE-ME "))
        .expect("docs/REDIS.md documents the ACL rules");
    let mut words: Vec<String> = line.split_whitespace().skip(2).map(str::to_string).collect();
    for w in words.iter_mut() {
        match w.as_str() {
            "rdzv" => *w = user.to_string(),
            ">CHANGE-ME" => *w = format!(">{password}"),
            "~{rdzv:rdzv}:*" => *w = format!("~{{rdzv:{namespace}}}:*"),
            _ => {}
        }
    }
    words
}

async fn set_user(conn: &mut redis::aio::MultiplexedConnection, rules: &[String]) {
    let _: () = redis::cmd("ACL").arg("SETUSER").arg(rules).query_async(conn).await.unwrap();
}

/// Everything rdzv does: writes of every kind, reads, leases and their expiry, a watch, and
/// compaction.
async fn exercise(kv: &dyn Kv) {
    let rev = put(kv, b"/acl/a", b"1", PutOptions::OVERWRITE).await;
    let mut events = within("watch", kv.watch(b"/acl/", WatchScope::Prefix, rev)).await.unwrap();
    assert_eq!(next(&mut events).await.unwrap().revision(), rev);
    let lease = within("grant", kv.lease_grant(Duration::from_millis(600))).await.unwrap();
    put(kv, b"/acl/leased", b"x", PutOptions::OVERWRITE.with_lease(Some(lease))).await;
    within("keep-alive", kv.lease_keep_alive(lease)).await.unwrap();
    assert_eq!(within("increment", kv.increment(b"/acl/n", 2)).await.unwrap(), Some(2));
    let by_create =
        RangeOptions { order: rdzv_core::kv::RangeOrder::ByCreateRevision, ..RangeOptions::default() };
    assert_eq!(within("range", kv.range(b"/acl/", by_create)).await.unwrap().count, 3);
    assert_eq!(within("range", kv.range(b"/acl/le", RangeOptions::default())).await.unwrap().count, 1);
    within("delete", kv.delete(b"/acl/n", rdzv_core::kv::DeleteMode::Any)).await.unwrap();
    // The lease ends by itself: the reaper's expiry shows up in the watch.
    let mut kinds = Vec::new();
    while kinds.len() < 4 {
        kinds.push(next(&mut events).await.unwrap().kind);
    }
    assert_eq!(kinds, [EventKind::Put, EventKind::Put, EventKind::Delete, EventKind::Delete]);
    let short = within("grant", kv.lease_grant(Duration::from_secs(5))).await.unwrap();
    within("revoke", kv.lease_revoke(short)).await.unwrap();
    let last = within("delete_prefix", kv.delete_prefix(b"/acl/")).await.unwrap().revision;
    within("compact", kv.compact(last)).await.unwrap();
    assert!(within("get", kv.get(b"/acl/a")).await.unwrap().kv.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_is_enough_and_less_fails_clearly() {
    // A server of its own, so the script is not already cached by a more powerful user.
    let server = RedisServer::start().expect("redis-server");
    let mut admin = raw(&server).await;
    let ns = RedisServer::fresh_namespace();
    let rules = documented_acl("rdzv-exact", "pw-exact", &ns);
    set_user(&mut admin, &rules).await;
    let mut config = server.config(&ns);
    config.username = Some("rdzv-exact".into());
    config.password = Some(Secret::new("pw-exact"));
    let kv = connect(config.clone()).await;
    exercise(&*kv).await;

    // Without the stream read, watches fail, saying what is missing and where to look.
    let without_xread: Vec<String> = rules.iter().filter(|w| *w != "+xread").cloned().collect();
    assert!(without_xread.len() < rules.len());
    let mut user = without_xread.clone();
    user[0] = "rdzv-no-xread".into();
    set_user(&mut admin, &user).await;
    let mut no_xread = config.clone();
    no_xread.username = Some("rdzv-no-xread".into());
    let kv = connect(no_xread).await;
    let rev = put(&*kv, b"/w/1", b"v", PutOptions::OVERWRITE).await;
    let e = match within("watch", kv.watch(b"/w/", WatchScope::Prefix, rev)).await {
        Err(e) => e,
        // What the feed read before it tails the log may come first.
        Ok(mut events) => loop {
            if let Err(e) = next(&mut events).await {
                break e;
            }
        },
    };
    assert!(!e.is_retryable(), "{e:?}");
    assert!(e.to_string().contains("xread") && e.to_string().contains("docs/REDIS.md"), "{e}");

    // Without access to the namespace's keys, connecting fails the same way.
    let mut user = documented_acl("rdzv-other-keys", "pw-exact", "someone-else");
    user[0] = "rdzv-other-keys".into();
    set_user(&mut admin, &user).await;
    let mut other_keys = config.clone();
    other_keys.username = Some("rdzv-other-keys".into());
    let e = within("connect", RedisKv::connect(other_keys)).await.unwrap_err();
    assert!(!e.is_retryable(), "{e:?}");
    assert!(e.to_string().contains("docs/REDIS.md"), "{e}");

    // Another database needs `select` as well, as documented.
    let mut db1 = config.clone();
    db1.db = 1;
    let e = within("connect to db 1", RedisKv::connect(db1.clone())).await.unwrap_err();
    assert!(e.to_string().contains("docs/REDIS.md"), "{e}");
    let mut user = rules.clone();
    user[0] = "rdzv-db1".into();
    user.push("+select".into());
    set_user(&mut admin, &user).await;
    db1.username = Some("rdzv-db1".into());
    let kv = connect(db1.clone()).await;
    put(&*kv, b"/db1", b"v", PutOptions::OVERWRITE).await;
    db1.db = 100;
    let e = within("connect to db 100", RedisKv::connect(db1)).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)) && e.to_string().contains("database 100"), "{e}");

    // Without one command used inside the script, the operation that needs it fails, named.
    let mut user: Vec<String> = rules.iter().filter(|w| *w != "+xtrim").cloned().collect();
    user[0] = "rdzv-no-xtrim".into();
    set_user(&mut admin, &user).await;
    let mut no_xtrim = config;
    no_xtrim.username = Some("rdzv-no-xtrim".into());
    let kv = connect(no_xtrim).await;
    put(&*kv, b"/t/1", b"v", PutOptions::OVERWRITE).await;
    let rev = put(&*kv, b"/t/2", b"v", PutOptions::OVERWRITE).await;
    let e = kv.compact(rev).await.unwrap_err();
    assert!(e.to_string().contains("xtrim") && e.to_string().contains("docs/REDIS.md"), "{e}");
}
