//! A test harness that runs **real** `etcd` servers (docs/TESTING.md): each on free loopback
//! ports with a temporary data directory, plain or with TLS and a client certificate
//! generated at test time, optionally with authentication; it waits until the server
//! answers, can stop and restart it for outage tests, reads its `/metrics`, and kills it
//! when dropped — also when the test panics, and (through a watchdog shell that ends etcd
//! when the test process' pipe closes) when the test process dies.
//!
//! ```no_run
//! # async fn demo() -> Result<(), rdzv_etcd::testing::HarnessError> {
//! use rdzv_etcd::testing::EtcdServer;
//!
//! let server = EtcdServer::start().await?;
//! let url = server.url("job1?min_workers=2"); // etcd://127.0.0.1:PORT/job1?min_workers=2
//! let kv = server.kv().await;                 // Arc<dyn Kv>
//! let before = server.proposals_committed().await?;
//! # let _ = (url, kv, before);
//! # Ok(()) }
//! ```
//!
//! Also: [`EtcdServer::builder`] (TLS, auth and extra etcd flags together),
//! [`EtcdCluster`] (several members of one cluster, for failover tests), [`shared`] (one
//! server per test binary, started on first use) and [`fresh_namespace`] (a backend on it
//! whose keys no other caller sees).
//!
//! The `etcd` binary comes from `$ETCD_BIN`, else from `PATH`. Without it every start fails
//! with a message saying how to install it (`scripts/setup.sh`); a test never passes
//! silently without a server.

mod certs;
mod cluster;
mod metrics;
mod server;
mod shared;

pub use certs::TlsMaterial;
pub use cluster::EtcdCluster;
pub use metrics::{PROPOSALS_COMMITTED, metric_value};
pub use server::{EtcdServer, EtcdServerBuilder};
pub use shared::{fresh_namespace, shared};

/// Why the harness could not provide a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarnessError(String);

impl HarnessError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        HarnessError(message.into())
    }
}

impl std::fmt::Display for HarnessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HarnessError {}
