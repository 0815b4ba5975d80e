//! Opening connections: the shared auto-reconnecting one for requests, and dedicated ones
//! for watches (a blocking stream read must not stall the shared connection).

use std::time::Duration;

use rdzv_core::{KvError, KvResult};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo,
};
use rustls::AlertDescription;

use crate::config::RedisConfig;
use crate::error::{NAME, from_redis};

/// A `redis::Client` for `config` (TLS with the configured CA for `rediss://`). It speaks
/// RESP3, so that a connection tells its manager when it breaks (see [`manager`]).
pub(crate) fn client(config: &RedisConfig) -> KvResult<Client> {
    let endpoint = config.endpoint_display();
    let mut redis_info =
        RedisConnectionInfo::default().set_db(config.db).set_protocol(ProtocolVersion::RESP3);
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
    let root_cert =
        config.cacert.as_deref().map(|path| read_pem("cacert", "CA certificate", path)).transpose()?;
    let mut certificates = redis::TlsCertificates::new();
    if let Some(root_cert) = root_cert {
        certificates = certificates.root_cert(root_cert);
    }
    if let (Some(cert), Some(key)) = (&config.cert, &config.key) {
        certificates = certificates.client_tls_config(redis::ClientTlsConfig::new(
            read_pem("cert", "client certificate", cert)?,
            read_pem("key", "client key", key)?,
        ));
    }
    Client::build_with_tls(info, certificates)
        .map_err(|e| KvError::InvalidArgument(format!("TLS setup for {endpoint} failed: {e}")))
}

/// A PEM file named by option `option`; errors name the option and say what is wrong.
fn read_pem(option: &str, what: &str, path: &std::path::Path) -> KvResult<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| {
        KvError::InvalidArgument(format!(
            "cannot read the {what} `{}` (option {option}): {e}",
            path.display()
        ))
    })?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(KvError::InvalidArgument(format!(
            "the {what} `{}` (option {option}) is not PEM (no `-----BEGIN` line)",
            path.display()
        )));
    }
    Ok(bytes)
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
///
/// Over RESP3 (see [`client`]) the connection tells its manager when it breaks, and the
/// manager reconnects at once, before the next request: over RESP2 it learned of a broken
/// connection only from the next request, which failed for nothing (a write, or the lease
/// grant of a new handler). Our script's replies, and the stream replies the `redis` crate
/// parses, read the same in both protocols.
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
        Ok(Err(e)) => Err(connect_error(e, config)),
        Err(_) => Err(unreachable(&endpoint, deadline)),
    }
}

/// A failed connection attempt as a [`KvError`]. A TLS server that rejects the client's
/// certificate (or wants one that was not given) is a configuration problem that retrying
/// cannot fix: it is reported as such, saying which option to set.
fn connect_error(e: redis::RedisError, config: &RedisConfig) -> KvError {
    let endpoint = config.endpoint_display();
    let alert = tls_alert(&e);
    let shown =
        |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    match (alert, &config.cert) {
        (Some(AlertDescription::CertificateRequired), None) => KvError::InvalidArgument(format!(
            "the Redis server at {endpoint} requires a client certificate (tls-auth-clients) and none \
             was given: add cert=<client.pem>&key=<client.key> to the URL (PEM files of a \
             certificate signed by a CA the server trusts)"
        )),
        (
            Some(
                a @ (AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::DecryptError
                | AlertDescription::AccessDenied
                | AlertDescription::CertificateRequired),
            ),
            Some(_),
        ) => KvError::InvalidArgument(format!(
            "the Redis server at {endpoint} refused the client certificate `{}` (option cert, \
             TLS alert {a:?}): give a valid certificate signed by a CA in the server's \
             tls-ca-cert-file, with its own key (option key, `{}`)",
            shown(&config.cert),
            shown(&config.key),
        )),
        // Of the commands that set up a connection, only SELECT can fail with a plain
        // response error (a refused AUTH has a kind of its own); `redis` keeps its text only.
        _ if config.db != 0
            && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
        {
            KvError::InvalidArgument(format!(
                "the Redis server at {endpoint} refused to switch to database {} (option db): {e}; \
                 check that the database exists (the server's `databases` setting) and that the \
                 Redis user may run SELECT (`+select`, see docs/REDIS.md)",
                config.db
            ))
        }
        _ => from_redis(e, &endpoint, "connecting", config.connect_timeout),
    }
}

/// The TLS alert the server sent, if the connection ended on one (found by type in the
/// error's sources, never by its wording).
fn tls_alert(e: &(dyn std::error::Error + 'static)) -> Option<AlertDescription> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut current = Some(e);
    while let Some(e) = current {
        if let Some(rustls::Error::AlertReceived(alert)) = e.downcast_ref::<rustls::Error>() {
            return Some(*alert);
        }
        // `redis` keeps I/O errors behind an `Arc`, and tokio-rustls keeps rustls' error
        // inside an `io::Error`: look through both.
        if let Some(inner) = e.downcast_ref::<Shared>() {
            current = Some(&**inner);
            continue;
        }
        if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            current = Some(inner);
            continue;
        }
        current = e.source();
    }
    None
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
        Ok(Err(e)) => Err(connect_error(e, config)),
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
