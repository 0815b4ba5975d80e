//! [`EtcdCluster`]: several real `etcd` members forming one cluster, for failover tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdzv_core::Kv;

use super::server::free_port_list;
use super::{EtcdServer, HarnessError};
use crate::config::EtcdOptions;
use crate::kv::EtcdKv;

/// How long a starting cluster may take to elect a leader and answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A plain-text etcd cluster of several members on loopback; each member can be stopped,
/// killed and restarted like an [`EtcdServer`]. Dropping it kills every member.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts `size` members (3 is the usual; at least 1) and waits until the cluster
    /// answers a read through all of them.
    pub async fn start(size: usize) -> Result<EtcdCluster, HarnessError> {
        let size = size.max(1);
        let ports = free_port_list(3 * size)?;
        let mut members = Vec::with_capacity(size);
        for (i, chunk) in ports.chunks(3).enumerate() {
            members.push(EtcdServer::member(format!("rdzv-test-{i}"), [chunk[0], chunk[1], chunk[2]])?);
        }
        let spec =
            members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",");
        for member in &mut members {
            member.initial_cluster = Some(spec.clone());
            member.spawn()?;
        }
        let mut cluster = EtcdCluster { members };
        for member in &mut cluster.members {
            member.wait_ready().await?;
        }
        // Answering a status request does not mean a leader was elected; a read does.
        let kv = cluster.try_kv().await.map_err(|e| HarnessError::new(format!("cannot connect: {e}")))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match kv.get(b"rdzv-test-probe").await {
                Ok(_) => return Ok(cluster),
                Err(e) if Instant::now() >= deadline => {
                    return Err(HarnessError::new(format!("the etcd cluster has no leader: {e}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The members.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    /// Member `index`, to stop, kill or restart it (panics if out of range: a test bug).
    pub fn member_mut(&mut self, index: usize) -> &mut EtcdServer {
        &mut self.members[index]
    }

    /// Connection options naming every member.
    pub fn options(&self) -> EtcdOptions {
        EtcdOptions::new(self.members.iter().map(EtcdServer::endpoint).collect())
    }

    /// A rendezvous URL naming every member: `etcd://127.0.0.1:P1,127.0.0.1:P2,…/<rest>`.
    pub fn url(&self, rest: &str) -> String {
        let hosts = self.members.iter().map(|m| m.endpoint().to_string()).collect::<Vec<_>>().join(",");
        format!("etcd://{hosts}/{}", rest.trim_start_matches('/'))
    }

    /// A connected backend over all members.
    pub async fn try_kv(&self) -> Result<EtcdKv, rdzv_core::KvError> {
        EtcdKv::connect(self.options()).await
    }

    /// A connected backend over all members, as `Arc<dyn Kv>`.
    ///
    /// # Panics
    /// If the cluster does not answer (a test without its server must fail).
    pub async fn kv(&self) -> Arc<dyn Kv> {
        match self.try_kv().await {
            Ok(kv) => Arc::new(kv),
            Err(e) => panic!("cannot connect to the test etcd cluster: {e}"),
        }
    }
}
