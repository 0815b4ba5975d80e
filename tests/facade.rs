//! The facade: `connect` by URL with the built-in registry, the round's Store and the
//! bootstrap info, `open_store`, and clear errors for bad URLs.
#![allow(clippy::unwrap_used)]

use rdzv::{ConfigError, RendezvousError};

#[tokio::test]
async fn a_round_hands_out_store_and_bootstrap() {
    let url = "mem://facade/boot?min_workers=3&last_call_timeout=1s";
    let workers = [
        rdzv::connect(url).await.unwrap(),
        rdzv::connect(url).await.unwrap(),
        rdzv::connect(url).await.unwrap(),
    ];
    let rounds = futures::future::try_join_all(workers.iter().map(|w| w.next_rendezvous())).await.unwrap();
    let master = &rounds[0].info.participants[0];
    for r in &rounds {
        assert_eq!(r.bootstrap.master_addr, master.addr);
        assert_eq!(Some(r.bootstrap.master_port), master.port);
        assert_ne!(r.bootstrap.master_port, 0);
    }
    // Rank 0 published them for c10d-style readers, in the round's own Store.
    let store = &rounds[0].store;
    assert_eq!(store.get(rdzv::MASTER_ADDR_KEY).await.unwrap(), master.addr.as_bytes());
    assert_eq!(
        store.get(rdzv::MASTER_PORT_KEY).await.unwrap(),
        rounds[0].bootstrap.master_port.to_string().as_bytes()
    );
    // All members share that Store.
    rounds[1].store.set("k", b"v").await.unwrap();
    assert_eq!(rounds[2].store.get("k").await.unwrap(), b"v");
    workers[0].set_closed().await.unwrap();
}

#[tokio::test]
async fn open_store_needs_no_rendezvous_options() {
    let a = rdzv::open_store("mem://facade/stores").await.unwrap();
    let b = rdzv::open_store("mem://facade/stores").await.unwrap();
    a.set("x", b"1").await.unwrap();
    assert_eq!(b.get("x").await.unwrap(), b"1");
    let other = rdzv::open_store("mem://facade/other-run").await.unwrap();
    assert!(!other.check(["x"]).await.unwrap());
}

#[tokio::test]
async fn bad_urls_are_one_clear_config_error() {
    let cases = [
        ("ftp://h/run?min_workers=1", "unknown URL scheme `ftp`"),
        ("mem://x/run", "missing required option `min_workers`"),
        ("mem://x/run?min_workers=2&max_workers=1", "max_workers"),
        ("mem://x/run?min_workers=0", "min_workers"),
        ("mem://x/run?min_workers=1&colour=red", "unknown option `colour`"),
        ("etcd://h:99999/run?min_workers=1", "99999"),
        ("mem://x/?min_workers=1", "run id"),
        ("mem://x/run?min_workers=1&timeout=soon", "timeout"),
    ];
    for (url, expected) in cases {
        match rdzv::connect(url).await {
            Err(RendezvousError::Config(e)) => {
                let text = e.to_string();
                assert!(text.contains(expected), "{url}: {text}");
                assert!(!text.contains('\n'), "{url}: one sentence, got {text}");
            }
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn passwords_never_show() {
    let e = rdzv::connect("etcd://user:hunter2@127.0.0.1:1/run?min_workers=1&connect_timeout=1s")
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
    let e = rdzv::connect("etcd://user:hunter2@127.0.0.1:1/run?min_workers=1&bogus=1").await.unwrap_err();
    assert!(matches!(e, RendezvousError::Config(ConfigError::UnknownOption { .. })), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("hunter2"));
}

#[tokio::test]
async fn every_builtin_scheme_is_registered() {
    let schemes = rdzv::registry().schemes();
    for s in ["mem", "etcd", "etcds", "redis", "rediss"] {
        assert!(schemes.iter().any(|x| x == s), "{s} missing from {schemes:?}");
    }
}

/// Every worker of a round is in this call at once (98,304 tasks in a large in-process
/// round), so its state is paid that many times: running a health gate's checks takes about
/// 5 KiB more, which a call without a gate must not carry (it did: 8.6 KiB a call); nor the
/// rarely taken paths (a member list's pieces, the run lease, withdrawing after a failure),
/// which held it at 3,608 bytes. 2,280 bytes measured: with tokio's task around it, it fits
/// an allocation of 2.5 KiB instead of 3.75.
#[tokio::test]
async fn a_call_without_a_health_gate_carries_none_of_its_state() {
    let worker = rdzv::connect("mem://facade/footprint?min_workers=3").await.unwrap();
    let call = worker.next_rendezvous();
    let size = std::mem::size_of_val(&call);
    assert!(size <= 2400, "a call waiting for its round holds {size} bytes");
}
