//! [`EtcdFactory`]: builds the etcd backend from a rendezvous URL (`etcd://` or `etcds://`).

use std::sync::Arc;

use async_trait::async_trait;
use rdzv_core::{BackendFactory, Kv, RendezvousError, RendezvousUrl};

use crate::client::ConnectError;
use crate::config::{DEFAULT_PORT, EtcdOptions, OPTIONS};
use crate::kv::EtcdKv;

/// The [`BackendFactory`] of the schemes `etcd` and `etcds`: options `cacert`, `cert`,
/// `key`, `tls_server_name`, `connect_timeout`, `request_timeout`, `max_request_bytes`; default port 2379. Every connect with the
/// same settings (in one tokio runtime) shares one client.
#[derive(Clone, Copy, Debug, Default)]
pub struct EtcdFactory;

#[async_trait]
impl BackendFactory for EtcdFactory {
    fn options(&self) -> &'static [&'static str] {
        OPTIONS
    }

    fn default_port(&self) -> Option<u16> {
        Some(DEFAULT_PORT)
    }

    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        let options = EtcdOptions::from_url(url)?;
        match EtcdKv::open(&options).await {
            Ok(kv) => Ok(Arc::new(kv)),
            Err(ConnectError::Config(e)) => Err(RendezvousError::Config(e)),
            // Unreachable is retryable (`Unavailable`); anything else (authentication…) is
            // reported as a backend error.
            Err(ConnectError::Kv(e)) => Err(RendezvousError::from(e)),
        }
    }
}
