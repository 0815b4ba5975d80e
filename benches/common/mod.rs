//! What every benchmark shares: the backends to run on (in-memory, a real etcd and a real
//! Redis started here, or the user's server named by `RDZV_BENCH_URL`), the runtime, the
//! knobs that keep a full `cargo bench` short, and the raw-results file that
//! `scripts/plot.py` turns into BENCHMARKS.md.
//!
//! Environment:
//! - `RDZV_BENCH_URL=etcd://host:2379/x` (or `redis://…`, `mem://…`): run on that server
//!   only (keys go under a fresh `/rdzv-bench/…` prefix or run id; nothing else is touched).
//! - `RDZV_BENCH_BACKENDS=mem,etcd,redis`: which built-in backends to run (default: all).
//! - `RDZV_BENCH_OUT=dir`: where the raw JSON-lines results go (default
//!   `target/bench-results`).
//! - `RDZV_BENCH_QUICK=1`: the smallest sizes only (a smoke run).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rdzv_core::Kv;
use rdzv_etcd::testing::EtcdServer;
use rdzv_redis::testing::RedisServer;

/// One backend the benchmarks run on; holds its server, if it started one.
pub enum Backend {
    Mem,
    Etcd(EtcdServer),
    Redis(RedisServer),
    /// The user's server, from `RDZV_BENCH_URL`.
    Url(String),
}

impl Backend {
    /// Short label for reports: `mem`, `etcd`, `redis`, or `url:<scheme>`.
    pub fn label(&self) -> String {
        match self {
            Backend::Mem => "mem".into(),
            Backend::Etcd(_) => "etcd".into(),
            Backend::Redis(_) => "redis".into(),
            Backend::Url(url) => format!("url-{}", url.split("://").next().unwrap_or("?")),
        }
    }

    /// A fresh client (its own namespace on Redis, a new store for memory).
    pub async fn kv(&self) -> Arc<dyn Kv> {
        match self {
            Backend::Mem => Arc::new(rdzv_mem::MemKv::new()),
            Backend::Etcd(server) => server.kv().await,
            Backend::Redis(server) => server.kv().await,
            Backend::Url(url) => {
                rdzv::registry().connect_backend(url).await.map(|(kv, _)| kv).unwrap_or_else(|e| {
                    // Not the URL itself: it may carry a password.
                    panic!("RDZV_BENCH_URL: cannot connect: {e}");
                })
            }
        }
    }

    /// The etcd server started here, if this is one (for its `/metrics`).
    pub fn etcd(&self) -> Option<&EtcdServer> {
        match self {
            Backend::Etcd(server) => Some(server),
            _ => None,
        }
    }
}

/// The backends to run on, servers started. A built-in server that cannot start is reported
/// and skipped (the figures say which backends they cover).
pub async fn backends() -> Vec<Backend> {
    if let Ok(url) = std::env::var("RDZV_BENCH_URL")
        && !url.is_empty()
    {
        return vec![Backend::Url(url)];
    }
    let wanted = std::env::var("RDZV_BENCH_BACKENDS").unwrap_or_else(|_| "mem,etcd,redis".into());
    backends_from(&wanted).await
}

/// The built-in backends named in `wanted` (`mem,etcd,redis`), servers started.
pub async fn backends_from(wanted: &str) -> Vec<Backend> {
    let mut out = Vec::new();
    for name in wanted.split(',').map(str::trim) {
        match name {
            "mem" => out.push(Backend::Mem),
            "etcd" => match EtcdServer::start().await {
                Ok(server) => out.push(Backend::Etcd(server)),
                Err(e) => eprintln!("bench: skipping etcd: {e}"),
            },
            "redis" => match RedisServer::start() {
                Ok(server) => out.push(Backend::Redis(server)),
                Err(e) => eprintln!("bench: skipping redis: {e}"),
            },
            "" => {}
            other => eprintln!("bench: unknown backend `{other}` in RDZV_BENCH_BACKENDS (mem, etcd, redis)"),
        }
    }
    out
}

/// A multi-threaded runtime with as many workers as the machine has cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime")
}

/// Whether only a smoke run is wanted.
pub fn quick() -> bool {
    std::env::var("RDZV_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A criterion configured for a short full run on a small machine.
pub fn criterion() -> criterion::Criterion {
    criterion::Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .without_plots()
        .configure_from_args()
}

/// A unique name for one run/key space.
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{name}-{}-{:x}", std::process::id(), nanos.as_nanos())
}

/// Appends one JSON record to `<out>/<file>.jsonl`.
pub fn record(file: &str, value: serde_json::Value) {
    let dir = out_dir();
    std::fs::create_dir_all(&dir).expect("create the results directory");
    let path = dir.join(format!("{file}.jsonl"));
    let mut f =
        std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("open the results file");
    writeln!(f, "{value}").expect("write a result");
}

/// The results directory.
pub fn out_dir() -> PathBuf {
    match std::env::var("RDZV_BENCH_OUT") {
        Ok(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
            PathBuf::from(target).join("bench-results")
        }
    }
}
