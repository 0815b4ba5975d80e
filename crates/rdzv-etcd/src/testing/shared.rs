//! One lazily started server per test binary, for suites with many small cases (the
//! conformance suite): each case works in a fresh namespace of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use rdzv_core::Kv;
use tokio::sync::OnceCell;

use super::{EtcdServer, HarnessError};

static SHARED: LazyLock<OnceCell<EtcdServer>> = LazyLock::new(OnceCell::new);
static NAMESPACES: AtomicU64 = AtomicU64::new(0);

/// The test binary's shared plain-text server, started on first use. It is never stopped
/// by the tests (do not restart it: other cases use it); it ends, and its data directory is
/// removed, when the test process exits.
pub async fn shared() -> Result<&'static EtcdServer, HarnessError> {
    SHARED.get_or_try_init(EtcdServer::start).await
}

/// A backend on the [`shared`] server whose keys live in a namespace no other call gets
/// (`rdzv-test/<n>/`), so that cases running side by side do not see each other's keys.
/// Revisions are the server's, shared by all cases.
///
/// # Panics
/// If the shared server cannot be started or reached: a test without its server must fail,
/// and the message says why (e.g. how to install etcd).
pub async fn fresh_namespace() -> Arc<dyn Kv> {
    let server = match shared().await {
        Ok(server) => server,
        Err(e) => panic!("cannot start the shared test etcd: {e}"),
    };
    let kv = match server.try_kv().await {
        Ok(kv) => kv,
        Err(e) => panic!("cannot connect to the shared test etcd: {e}"),
    };
    let n = NAMESPACES.fetch_add(1, Ordering::Relaxed);
    Arc::new(kv.with_namespace(format!("rdzv-test/{n}/")))
}
