//! From a URL on the command line to a connected worker or backend.

use std::collections::BTreeMap;
use std::sync::Arc;

use rdzv::core::params::DEFAULT_PREFIX;
use rdzv::core::rendezvous::keys::RunKeys;
use rdzv::core::{Kv, RendezvousUrl};
use rdzv::{Rendezvous, RendezvousError, RendezvousParams};

/// A backend and the run a URL names, without rendezvous parameters (for `status`, `close`).
pub struct RunTarget {
    /// The backend.
    pub kv: Arc<dyn Kv>,
    /// The parsed URL (its `Display` hides the password).
    pub url: RendezvousUrl,
    /// The run's key layout.
    pub keys: RunKeys,
}

impl RunTarget {
    /// Connects the URL's backend; `min_workers` and the like are not needed.
    pub async fn connect(url: &str) -> Result<RunTarget, RendezvousError> {
        let (kv, url) = rdzv::registry().connect_backend(url).await?;
        let keys = RunKeys::new(prefix_of(&url), &url.run_id);
        Ok(RunTarget { kv, url, keys })
    }

    /// The URL's rendezvous parameters, with `min_workers` (and `max_workers`, which
    /// otherwise defaults to min) taken from `default_min`/`default_max` when the URL gives
    /// none, and the run id replaced by `run_id` if given.
    pub fn params(
        &self,
        default_min: usize,
        default_max: usize,
        run_id: Option<&str>,
    ) -> Result<RendezvousParams, RendezvousError> {
        let mut options: BTreeMap<String, String> = self.url.rendezvous_options.clone();
        if !options.contains_key("min_workers") {
            options.insert("min_workers".into(), default_min.to_string());
            if !options.contains_key("max_workers") {
                options.insert("max_workers".into(), default_max.max(default_min).to_string());
            }
        }
        Ok(RendezvousParams::from_options(run_id.unwrap_or(&self.url.run_id), &options)?)
    }
}

/// The key prefix the URL names (option `prefix`), or the default.
pub fn prefix_of(url: &RendezvousUrl) -> &str {
    url.rendezvous_options.get("prefix").map(String::as_str).unwrap_or(DEFAULT_PREFIX)
}

/// Joins as one worker of the run `url` names, with a node id and advertised address of
/// the command line's choosing (they override the URL's `node_id`/`local_addr`).
pub async fn worker(
    url: &str,
    node_id: Option<String>,
    local_addr: Option<String>,
) -> Result<Rendezvous, RendezvousError> {
    let (kv, mut params) = rdzv::registry().connect(url).await?;
    if node_id.is_some() {
        params.node_id = node_id;
    }
    if local_addr.is_some() {
        params.local_addr = local_addr;
    }
    Rendezvous::new(kv, params).await
}
