//! Opening connections: the shared auto-reconnecting one for requests, and dedicated ones
//! for watches (a blocking stream read must not stall the shared connection).

use std::time::Duration;

use rdzv_core::{KvError, KvResult};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use crate::config::RedisConfig;
use crate::error::{NAME, from_redis};

/// A `redis::Client` for `config` (TLS with the configured CA for `rediss://`).
pub(crate) fn client(config: &RedisConfig) -> KvResult<Client> {
    let endpoint = config.endpoint_display();
    let mut redis_info = RedisConnectionInfo::default().set_db(config.db);
    if let Some(user) = &config.username {
        redis_info = redis_info.set_username(user);
    }
    if let Some(password) = &config.password {
        redis_info = redis_info.set_password(password.expose());
    }
    let host = config.endpoint.host.clone();
    let port = config.endpoint.port;
    let addr = if config.tls {
        ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None }
    } else {
        ConnectionAddr::Tcp(host, port)
    };
    let info = addr
        .into_connection_info()
        .map_err(|e| from_redis(e, &endpoint, "configuring the connection", config.connect_timeout))?
        .set_redis_settings(redis_info);
    if !config.tls {
        return Client::open(info)
            .map_err(|e| from_redis(e, &endpoint, "configuring the connection", config.connect_timeout));
    }
    install_crypto_provider();
    let root_cert = match &config.cacert {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            KvError::InvalidArgument(format!(
                "cannot read the CA certificate `{}` (option cacert): {e}",
                path.display()
            ))
        })?),
        None => None,
    };
    Client::build_with_tls(info, redis::TlsCertificates { client_tls: None, root_cert })
        .map_err(|e| KvError::InvalidArgument(format!("TLS setup for {endpoint} failed: {e}")))
}

/// `redis`'s rustls needs a process-wide crypto provider; install ring's unless the
/// application already chose one (then that one is used).
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The shared connection: reconnects in the background after a failure. It never resends
/// a request by itself, so a mutation is never applied twice behind our back.
pub(crate) async fn manager(client: &Client, config: &RedisConfig) -> KvResult<ConnectionManager> {
    let endpoint = config.endpoint_display();
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.request_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(500));
    let deadline = config.connect_timeout + Duration::from_secs(1);
    match tokio::time::timeout(deadline, client.get_connection_manager_with_config(manager_config)).await {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(from_redis(e, &endpoint, "connecting", config.connect_timeout)),
        Err(_) => Err(unreachable(&endpoint, deadline)),
    }
}

/// A connection of its own, for one watch's blocking reads (`block` is the longest one).
pub(crate) async fn dedicated(
    client: &Client,
    config: &RedisConfig,
    block: Duration,
) -> KvResult<MultiplexedConnection> {
    let endpoint = config.endpoint_display();
    let conn_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.request_timeout + block));
    let deadline = config.connect_timeout + Duration::from_secs(1);
    match tokio::time::timeout(deadline, client.get_multiplexed_async_connection_with_config(&conn_config))
        .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(from_redis(e, &endpoint, "connecting", config.connect_timeout)),
        Err(_) => Err(unreachable(&endpoint, deadline)),
    }
}

fn unreachable(endpoint: &str, after: Duration) -> KvError {
    KvError::Unavailable {
        backend: NAME,
        endpoint: endpoint.to_string(),
        message: format!("no connection within {after:?}"),
        source: None,
    }
}
