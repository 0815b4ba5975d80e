//! [`EtcdCluster`]: several real `etcd` members forming one cluster, for failover tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdzv_core::Kv;

use super::server::{START_ATTEMPTS, claim_ports, port_was_taken};
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
        // A free port can be taken between choosing and binding it (by a test running
        // beside this one); start the whole cluster again on new ports then.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match EtcdCluster::start_on_free_ports(size.max(1)).await {
                Err(e) if attempts < START_ATTEMPTS && port_was_taken(&e) => {}
                done => return done,
            }
        }
    }

    async fn start_on_free_ports(size: usize) -> Result<EtcdCluster, HarnessError> {
        let mut claims = claim_ports(3 * size)?.into_iter();
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            let mut member = EtcdServer::member(format!("rdzv-test-{i}"), [0; 3])?;
            member.use_ports(claims.by_ref().take(3).collect());
            members.push(member);
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

    /// The index of the member that leads the cluster now, as the running members see it
    /// (asked in turn; the first that knows a leader answers). Fails while there is none.
    pub async fn leader(&self) -> Result<usize, HarnessError> {
        let mut last = String::from("no member is running");
        for member in self.members.iter().filter(|m| m.is_running()) {
            let status = async {
                let options = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
                let client = etcd_client::Client::connect([member.client_url()], Some(options)).await?;
                client.maintenance_client().status().await
            };
            match tokio::time::timeout(Duration::from_secs(2), status).await {
                Ok(Ok(status)) if status.leader() != 0 => {
                    let leader = status.leader();
                    // Each member's own id is in the header of its own answer.
                    for (index, candidate) in self.members.iter().enumerate().filter(|(_, m)| m.is_running())
                    {
                        if candidate.member_id().await == Some(leader) {
                            return Ok(index);
                        }
                    }
                    last = format!("the leader {leader:x} is not a running member");
                }
                Ok(Ok(_)) => last = "no leader elected".to_string(),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "status request timed out".to_string(),
            }
        }
        Err(HarnessError::new(format!("cannot find the cluster's leader: {last}")))
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
