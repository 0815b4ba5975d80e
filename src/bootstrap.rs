//! Bootstrap info (docs/STORE.md): rank 0 publishes `MASTER_ADDR` and `MASTER_PORT` in the
//! round's Store; every member reads them back. This is what a launcher exports to the
//! training processes.

use rdzv_core::{RendezvousError, RendezvousInfo};
use rdzv_store::{Store, StoreError};

/// Store key of the master's address.
pub const MASTER_ADDR_KEY: &str = "MASTER_ADDR";
/// Store key of the master's port.
pub const MASTER_PORT_KEY: &str = "MASTER_PORT";

/// Where the processes of a round meet for their collectives: rank 0's address and a port
/// that was free on its machine when the round formed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// Rank 0's advertised address (`local_addr`, or its host name).
    pub master_addr: String,
    /// A port that was free on rank 0's machine.
    pub master_port: u16,
}

/// The bootstrap info of a round: rank 0's address and the free port it found when it
/// joined, both in the round's participant list, so no member needs a further read. Rank 0
/// also publishes them as `MASTER_ADDR`/`MASTER_PORT` in the round's Store, for
/// c10d-style consumers.
pub(crate) async fn exchange(info: &RendezvousInfo, store: &Store) -> Result<Bootstrap, RendezvousError> {
    let master = &info.participants[0];
    let master_port = match master.port {
        Some(port) => port,
        // Rank 0 runs an older version that did not offer a port: it publishes one.
        None if info.rank == 0 => free_port().map_err(|e| RendezvousError::State {
            key: MASTER_PORT_KEY.into(),
            reason: format!("no free local port for MASTER_PORT: {e}"),
        })?,
        None => {
            let port = store.get(MASTER_PORT_KEY).await.map_err(|e| store_error(info, e))?;
            let text = String::from_utf8_lossy(&port).into_owned();
            text.parse().map_err(|_| RendezvousError::State {
                key: MASTER_PORT_KEY.into(),
                reason: format!("not a port number: {text:?}"),
            })?
        }
    };
    let bootstrap = Bootstrap { master_addr: master.addr.clone(), master_port };
    if info.rank == 0 {
        let port = master_port.to_string();
        store
            .multi_set([(MASTER_ADDR_KEY, bootstrap.master_addr.as_str()), (MASTER_PORT_KEY, port.as_str())])
            .await
            .map_err(|e| store_error(info, e))?;
    }
    Ok(bootstrap)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("0.0.0.0", 0))?.local_addr()?.port())
}

fn store_error(info: &RendezvousInfo, e: StoreError) -> RendezvousError {
    match e {
        StoreError::Timeout { after, .. } => RendezvousError::Timeout {
            run_id: info.run_id.clone(),
            phase: format!("waiting for rank 0 to publish {MASTER_ADDR_KEY}/{MASTER_PORT_KEY}"),
            after,
        },
        StoreError::Backend(e) => e.into(),
        other => RendezvousError::State { key: MASTER_ADDR_KEY.into(), reason: other.to_string() },
    }
}
