//! Bootstrap info (docs/STORE.md): rank 0 publishes `MASTER_ADDR` and `MASTER_PORT` in the
//! round's Store; every member reads them back. This is what a launcher exports to the
//! training processes.

use std::time::Duration;

use rdzv_core::{RendezvousError, RendezvousHandler, RendezvousInfo};
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
///
/// Rank 0's publication is bounded by `store`'s timeout (what is left of the call's
/// deadline). If it fails, the round is still returned — it is complete and healthy, and an
/// error would make the caller re-rendezvous and break it for everyone — and rank 0 keeps
/// publishing in the background until it succeeds or the round is over.
pub(crate) async fn exchange(
    info: &RendezvousInfo,
    store: &Store,
    handler: &RendezvousHandler,
) -> Result<Bootstrap, RendezvousError> {
    let master = &info.participants[0];
    let master_port = match master.port {
        Some(port) => port,
        // Rank 0 runs an older version that did not offer a port: it publishes one.
        None if info.rank == 0 => rdzv_core::protocol::free_port().map_err(|e| RendezvousError::State {
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
    if info.rank == 0
        && let Err(e) = publish(store, &bootstrap).await
    {
        tracing::warn!(
            error = %e,
            version = info.version,
            "could not publish {MASTER_ADDR_KEY}/{MASTER_PORT_KEY} in the round's Store yet; retrying in the background"
        );
        let (store, bootstrap, handler) = (store.clone(), bootstrap.clone(), handler.clone());
        tokio::spawn(async move {
            let retry = async {
                let mut delays = backon::BackoffBuilder::build(
                    backon::ExponentialBuilder::default()
                        .with_min_delay(Duration::from_millis(100))
                        .with_max_delay(Duration::from_secs(5))
                        .with_jitter()
                        .without_max_times(),
                );
                loop {
                    tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))).await;
                    match publish(&store, &bootstrap).await {
                        Ok(()) => return,
                        Err(e) => tracing::debug!(error = %e, "publishing the bootstrap keys failed again"),
                    }
                }
            };
            tokio::select! {
                _ = retry => {}
                _ = handler.round_broken() => {}
            }
        });
    }
    Ok(bootstrap)
}

async fn publish(store: &Store, bootstrap: &Bootstrap) -> Result<(), StoreError> {
    let port = bootstrap.master_port.to_string();
    store
        .multi_set([(MASTER_ADDR_KEY, bootstrap.master_addr.as_str()), (MASTER_PORT_KEY, port.as_str())])
        .await
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
