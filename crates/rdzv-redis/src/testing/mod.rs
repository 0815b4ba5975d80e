//! The test harness (feature `testing`): real `redis-server` processes on free loopback
//! ports, without persistence, stopped and restarted at will, and killed when the test
//! process ends, their temporary directories with them.
//!
//! ```no_run
//! # async fn demo() {
//! use rdzv_redis::testing::RedisServer;
//! let server = RedisServer::start().expect("redis-server");
//! let kv = server.kv().await; // a client in a fresh namespace
//! # drop(kv);
//! # }
//! ```

mod server;
mod tls;

use std::sync::OnceLock;

pub use server::{HarnessError, RedisServer};
pub use tls::TlsFiles;

/// One server shared by all tests of a test binary, started on first use; tests isolate
/// themselves by namespace ([`RedisServer::kv`]). Panics (failing the test) with the reason
/// if the server cannot be started — a missing `redis-server` is never a silent pass.
pub fn shared() -> &'static RedisServer {
    static SHARED: OnceLock<Result<RedisServer, String>> = OnceLock::new();
    match SHARED.get_or_init(|| RedisServer::start().map_err(|e| e.0)) {
        Ok(server) => server,
        Err(e) => panic!("{e}"),
    }
}
