//! Bootstrap info (STORE.md): rank 0 publishes `MASTER_ADDR` and `MASTER_PORT` in the
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

/// Publishes (rank 0) and reads back (everyone) the bootstrap info of a round.
pub(crate) async fn exchange(info: &RendezvousInfo, store: &Store) -> Result<Bootstrap, RendezvousError> {
    if info.rank == 0 {
        let port = free_port().map_err(|e| RendezvousError::State {
            key: MASTER_PORT_KEY.into(),
            reason: format!("no free local port for MASTER_PORT: {e}"),
        })?;
        let addr = &info.participants[0].addr;
        let port = port.to_string();
        store
            .multi_set([(MASTER_ADDR_KEY, addr.as_str()), (MASTER_PORT_KEY, port.as_str())])
            .await
            .map_err(|e| store_error(info, e))?;
    }
    let values =
        store.multi_get([MASTER_ADDR_KEY, MASTER_PORT_KEY]).await.map_err(|e| store_error(info, e))?;
    let master_addr = String::from_utf8_lossy(&values[0]).into_owned();
    let port_text = String::from_utf8_lossy(&values[1]).into_owned();
    let master_port = port_text.parse().map_err(|_| RendezvousError::State {
        key: MASTER_PORT_KEY.into(),
        reason: format!("not a port number: {port_text:?}"),
    })?;
    Ok(Bootstrap { master_addr, master_port })
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
