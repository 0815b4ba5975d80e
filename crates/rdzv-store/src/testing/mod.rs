//! The Store test suite, written once and run against every backend (feature `testing`).
//!
//! Each case is a plain `async fn(Store)` in [`cases`]; it gets a Store on a fresh, unique
//! root (so cases can share one server) with a 20 s timeout. [`store_suite!`](crate::store_suite)
//! turns every case into a `#[test]` on a backend:
//!
//! ```
//! use std::sync::Arc;
//! use rdzv_core::Kv;
//!
//! rdzv_store::store_suite!(async { Arc::new(rdzv_mem::MemKv::new()) as Arc<dyn Kv> });
//! # fn main() {}
//! ```
//!
//! The builder is an async expression, evaluated once per case inside that case's runtime,
//! whose output is an `Arc<dyn Kv>`, or a pair `(Arc<dyn Kv>, guard)` whose `guard` (a
//! server handle, a temporary directory…) is dropped when the case ends. Each test runs on
//! its own multi-threaded tokio runtime and fails if its case takes longer than
//! [`CASE_TIMEOUT`].

#![allow(clippy::unwrap_used)]

pub mod cases;
mod suite;

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdzv_core::Kv;

use crate::Store;

/// The longest a case may take; past it, the test fails.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest a suite's builder may take to produce its backend (starting a server).
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(120);

/// The timeout of the Store handed to each case.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(20);

/// What a suite's builder produces: a backend, and optionally something to keep alive
/// until the case ends.
pub trait Backend {
    /// The backend, and the value to drop after the case.
    fn into_parts(self) -> (Arc<dyn Kv>, Box<dyn Any + Send>);
}

impl Backend for Arc<dyn Kv> {
    fn into_parts(self) -> (Arc<dyn Kv>, Box<dyn Any + Send>) {
        (self, Box::new(()))
    }
}

impl<G: Send + 'static> Backend for (Arc<dyn Kv>, G) {
    fn into_parts(self) -> (Arc<dyn Kv>, Box<dyn Any + Send>) {
        (self.0, Box::new(self.1))
    }
}

/// Runs one case: builds a multi-threaded runtime, the backend (within [`BUILD_TIMEOUT`])
/// and a Store on a fresh root, runs `case` within [`CASE_TIMEOUT`], then deletes the
/// root's keys. Panics (failing the test) on any failure. Used by
/// [`store_suite!`](crate::store_suite).
pub fn run_case<B, Build, Case>(name: &str, build: impl FnOnce() -> Build, case: impl FnOnce(Store) -> Case)
where
    B: Backend,
    Build: Future<Output = B>,
    Case: Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the case");
    runtime.block_on(async {
        let backend = tokio::time::timeout(BUILD_TIMEOUT, build())
            .await
            .unwrap_or_else(|_| panic!("{name}: the backend was not ready within {BUILD_TIMEOUT:?}"));
        let (kv, guard) = backend.into_parts();
        let root = unique_root(name);
        let store = Store::new(kv.clone(), root.clone()).with_timeout(STORE_TIMEOUT);
        tokio::time::timeout(CASE_TIMEOUT, case(store))
            .await
            .unwrap_or_else(|_| panic!("{name}: the case did not finish within {CASE_TIMEOUT:?}"));
        // Leave a shared server as we found it; a failure here is not the case's fault.
        let _ = tokio::time::timeout(Duration::from_secs(10), kv.delete_prefix(&root)).await;
        drop(guard);
    });
}

/// A root no other case (of this or another process) uses.
fn unique_root(name: &str) -> Vec<u8> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("rdzv-store-test/{name}/{:x}-{nanos:x}-{n}/", std::process::id()).into_bytes()
}
