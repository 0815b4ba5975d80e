//! [`RedisFactory`]: builds a [`RedisKv`] from a `redis://` or `rediss://` URL.

use std::sync::Arc;

use async_trait::async_trait;
use rdzv_core::{BackendFactory, Kv, KvError, RendezvousError, RendezvousUrl};

use crate::config::{DEFAULT_PORT, OPTIONS, RedisConfig};
use crate::kv::RedisKv;

/// The backend factory for the `redis` and `rediss` schemes (registered by the `rdzv`
/// facade). Options: `db`, `cacert`, `cert`, `key`, `connect_timeout`, `request_timeout`, `namespace`,
/// `history`, `history_bytes` (see [`RedisConfig`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct RedisFactory;

#[async_trait]
impl BackendFactory for RedisFactory {
    fn options(&self) -> &'static [&'static str] {
        OPTIONS
    }

    fn default_port(&self) -> Option<u16> {
        Some(DEFAULT_PORT)
    }

    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        let config = RedisConfig::from_url(url)?;
        match RedisKv::connect(config).await {
            Ok(kv) => Ok(Arc::new(kv)),
            Err(KvError::InvalidArgument(reason)) => {
                Err(RendezvousError::Config(rdzv_core::ConfigError::InvalidUrl(reason)))
            }
            Err(e) => Err(e.into()),
        }
    }
}
