//! What the Redis backend's tests share: a bound on every wait, a raw connection to the
//! server, a client, and small steps that must succeed.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rdzv_core::Kv;
use rdzv_core::kv::{PutOptions, PutOutcome, WatchStream};
use rdzv_redis::testing::RedisServer;
use rdzv_redis::{RedisConfig, RedisKv};

/// Bound of every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(15);

pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out {what}"))
}

pub async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// `config` (settings for `server`) with its connections going through a fault link to
/// `server` of their own, and the link.
pub fn via_link(server: &RedisServer, mut config: RedisConfig) -> (rdzv_netfault::Link, RedisConfig) {
    let link =
        rdzv_netfault::Link::start([std::net::SocketAddr::from(([127, 0, 0, 1], server.port()))]).unwrap();
    config.endpoint.port = link.endpoints()[0].port();
    (link, config)
}

pub async fn connect(config: RedisConfig) -> Arc<dyn Kv> {
    Arc::new(within("connecting", RedisKv::connect(config)).await.expect("connect"))
}

pub async fn put(kv: &dyn Kv, key: &[u8], value: &[u8], options: PutOptions) -> i64 {
    match within("put", kv.put(key, value, options)).await.expect("put") {
        PutOutcome::Written { revision, .. } => revision,
        other => panic!("not written: {other:?}"),
    }
}

pub async fn next(events: &mut WatchStream) -> rdzv_core::KvResult<rdzv_core::kv::Event> {
    within("waiting for a watch event", events.next()).await.expect("watch ended")
}

/// Retries `op` while the server is coming back (retryable errors), for at most `WAIT`.
pub async fn once_back<T, F, Fut>(mut op: F) -> rdzv_core::KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = rdzv_core::KvResult<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match op().await {
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => return other,
        }
    }
}
