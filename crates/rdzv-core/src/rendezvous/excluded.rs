//! The nodes kept out of the run by their health check (docs/PROTOCOL.md "Health gates"):
//! each unhealthy node records why under `rdzv/excluded/<node>`, bound to its own session, so
//! that the record goes with the node. Nobody waits on these keys: they only tell `rdzv
//! status` and the operator who is out, and why.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{KvError, RendezvousError};
use crate::kv::{Kv, LeaseId, PutOptions, RangeOptions};

use super::keys::RunKeys;

/// A node's record that its health check failed: it joins no round until the check passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exclusion {
    /// The node.
    pub node_id: String,
    /// The address it advertises.
    pub addr: String,
    /// Why it is out: the failed check's own words (exit status, last lines of its output).
    pub reason: String,
    /// Since when (RFC 3339, UTC, to the second), unchanged while it stays out.
    pub since: String,
}

impl Exclusion {
    /// A record of `node_id` at `addr` being out for `reason` since `since`.
    pub fn new(node_id: &str, addr: &str, reason: &str, since: SystemTime) -> Exclusion {
        Exclusion {
            node_id: node_id.to_string(),
            addr: addr.to_string(),
            reason: reason.to_string(),
            since: humantime::format_rfc3339_seconds(since).to_string(),
        }
    }

    /// Writes this record under `keys`, bound to `session` (an existing record of the node
    /// is replaced: its reason may have changed).
    pub(crate) async fn write(&self, kv: &dyn Kv, keys: &RunKeys, session: LeaseId) -> Result<(), KvError> {
        let value = serde_json::to_vec(self).unwrap_or_default();
        let options = PutOptions { lease: Some(session), ..PutOptions::OVERWRITE };
        kv.put(&keys.excluded(&self.node_id), &value, options).await.map(|_| ())
    }

    /// Every node excluded from the run under `keys`, by node id. A record that does not
    /// parse is shown with its raw value as the reason rather than hidden.
    pub async fn read_all(kv: &dyn Kv, keys: &RunKeys) -> Result<Vec<Exclusion>, RendezvousError> {
        let prefix = keys.excluded_nodes();
        let found = kv.range(&prefix, RangeOptions::default()).await?;
        let mut excluded: Vec<Exclusion> = found
            .kvs
            .iter()
            .map(|kv| {
                serde_json::from_slice(&kv.value).unwrap_or_else(|_| Exclusion {
                    node_id: String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned(),
                    addr: String::new(),
                    reason: format!("(unreadable record: {})", String::from_utf8_lossy(&kv.value)),
                    since: String::new(),
                })
            })
            .collect();
        excluded.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        Ok(excluded)
    }
}
