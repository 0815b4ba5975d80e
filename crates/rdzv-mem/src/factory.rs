//! [`MemFactory`]: the backend factory of `mem://<name>/<run_id>` URLs.

use std::sync::Arc;

use async_trait::async_trait;
use rdzv_core::{BackendFactory, ConfigError, Kv, RendezvousError, RendezvousUrl};

use crate::MemKv;

/// Serves `mem://<name>/<run_id>?…` with the process-wide [`MemKv::named`] store `<name>`,
/// so that every worker of a test or demo in one process that uses the same URL meets in
/// the same store. Takes no options of its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemFactory;

#[async_trait]
impl BackendFactory for MemFactory {
    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    fn default_port(&self) -> Option<u16> {
        None
    }

    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        let [endpoint] = &url.endpoints[..] else {
            return Err(ConfigError::InvalidValue {
                option: "endpoints".into(),
                value: url.endpoints.iter().map(|e| e.host.as_str()).collect::<Vec<_>>().join(","),
                reason: "a mem:// URL names exactly one in-process store, as in mem://mystore/run1".into(),
            }
            .into());
        };
        if endpoint.port != 0 {
            return Err(ConfigError::InvalidValue {
                option: "port".into(),
                value: endpoint.port.to_string(),
                reason: "mem:// stores live in this process and have no port; write mem://<name>/<run_id>"
                    .into(),
            }
            .into());
        }
        Ok(MemKv::named(&endpoint.host))
    }
}
