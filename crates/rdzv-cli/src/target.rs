//! From a URL on the command line to a connected worker or backend.

use std::sync::Arc;

use rdzv::{ConfigError, Rendezvous, RendezvousError, RendezvousParams};
use rdzv_core::Kv;
use rdzv_core::protocol::RunKeys;
use rdzv_core::url::RunAddress;

/// A backend and the run a URL names, without rendezvous parameters (for `status`, `close`,
/// and the in-process workers of `bench` and `demo`).
pub struct RunTarget {
    /// The backend.
    pub kv: Arc<dyn Kv>,
    /// The run's address (its URL's `Display` hides the password).
    pub address: RunAddress,
    /// The run's key layout.
    pub keys: RunKeys,
}

impl RunTarget {
    /// Connects the URL's backend; `min_workers` and the like are not needed.
    pub async fn connect(url: &str) -> Result<RunTarget, RendezvousError> {
        let (kv, address) = rdzv::registry().connect_backend(url).await?;
        let keys = address.keys();
        Ok(RunTarget { kv, address, keys })
    }

    /// The URL's rendezvous parameters for the run `run_id` (default: the URL's), sized
    /// `default_min ..= default_max` when the URL gives no `min_workers` (see
    /// [`RunAddress::params_or`]).
    pub fn params(
        &self,
        default_min: usize,
        default_max: usize,
        run_id: Option<&str>,
    ) -> Result<RendezvousParams, RendezvousError> {
        let mut address = self.address.clone();
        if let Some(run_id) = run_id {
            address.run_id = run_id.to_string();
        }
        Ok(address.params_or(default_min, default_max)?)
    }
}

/// Joins as one worker of the run `url` names, with a node id and advertised address of
/// the command line's choosing (they override the URL's `node_id`/`local_addr`).
pub async fn worker(
    url: &str,
    node_id: Option<String>,
    local_addr: Option<String>,
) -> Result<Rendezvous, RendezvousError> {
    worker_on(url, node_id, local_addr, |_| Ok(()), |kv| kv).await
}

/// [`worker`], with the parameters as `adjust` leaves them (the command line's flags over
/// the URL's options), on the backend as `wrap` returns it (e.g. with its operations
/// counted).
pub async fn worker_on(
    url: &str,
    node_id: Option<String>,
    local_addr: Option<String>,
    adjust: impl FnOnce(&mut RendezvousParams) -> Result<(), ConfigError>,
    wrap: impl FnOnce(Arc<dyn Kv>) -> Arc<dyn Kv>,
) -> Result<Rendezvous, RendezvousError> {
    let (kv, mut params) = rdzv::registry().connect(url).await?;
    adjust(&mut params)?;
    let kv = wrap(kv);
    if node_id.is_some() {
        params.node_id = node_id;
    }
    if local_addr.is_some() {
        params.local_addr = local_addr;
    }
    Rendezvous::new(kv, params).await
}
