//! How to reach an etcd cluster: endpoints, credentials, TLS files and timeouts, from a
//! rendezvous URL (docs/OPTIONS.md) or built by hand.

use std::path::PathBuf;
use std::time::Duration;

use rdzv_core::url::{Endpoint, Secret};
use rdzv_core::{ConfigError, RendezvousUrl};

/// The query options the etcd backend understands (besides the rendezvous parameters).
pub const OPTIONS: &[&str] =
    &["cacert", "cert", "key", "tls_server_name", "connect_timeout", "request_timeout", "max_request_bytes"];

/// etcd's default `--max-request-bytes` (1.5 MiB): the largest request an etcd server
/// accepts unless started with a larger limit. The default of
/// [`EtcdOptions::max_request_bytes`] (URL option `max_request_bytes`).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1_572_864;

/// The largest key rdzv sends to etcd, namespace included (8 KiB). etcd has no key limit of
/// its own besides the request size, but keeps every key in memory, and a write names its
/// key up to five times (compares, write, read-back); rdzv's own keys are far shorter.
pub const MAX_KEY_BYTES: usize = 8 * 1024;

/// What a request needs besides its value (64 KiB): up to five copies of a key of
/// [`MAX_KEY_BYTES`] and the request's framing. The largest value is
/// `max_request_bytes - REQUEST_RESERVE_BYTES`, so that a write with the largest key and
/// value still fits in `max_request_bytes`.
pub const REQUEST_RESERVE_BYTES: usize = 64 * 1024;

// The reserve covers the largest write: five copies of the largest key (with their field
// framing) and the request's own framing.
const _: () = assert!(5 * (MAX_KEY_BYTES + 64) + 512 <= REQUEST_RESERVE_BYTES);

/// The smallest accepted `max_request_bytes` (128 KiB): room for the reserve and a value of
/// at least as much.
pub const MIN_MAX_REQUEST_BYTES: usize = 2 * REQUEST_RESERVE_BYTES;

/// Default port of an etcd endpoint.
pub const DEFAULT_PORT: u16 = 2379;

/// Default [`EtcdOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default [`EtcdOptions::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS settings: the CA that signed the servers' certificates (or the system's CA store),
/// optionally a client certificate and its key (for servers started with
/// `--client-cert-auth`), all PEM files, and the name the servers' certificates are issued
/// to if it is not the host connected to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TlsFiles {
    /// PEM file of the CA certificate(s) to trust (URL option `cacert`); `None` trusts the
    /// system's CA store instead (`/etc/ssl/certs` and the like; `SSL_CERT_FILE` or
    /// `SSL_CERT_DIR` replace it).
    pub ca_cert: Option<PathBuf>,
    /// PEM file of the client certificate (URL option `cert`); requires `client_key`.
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (URL option `key`).
    pub client_key: Option<PathBuf>,
    /// The name the servers' certificates must be issued to (URL option
    /// `tls_server_name`), when it is not the endpoint's host — e.g. certificates for
    /// `etcd.internal` on servers reached by IP address. `None`: the endpoint's host. Also
    /// sent as the TLS server name (SNI).
    pub server_name: Option<String>,
}

/// Everything needed to connect to an etcd cluster. Two [`EtcdKv`](crate::EtcdKv)s built
/// from equal options (in one tokio runtime) share one client and its connections.
///
/// `Debug` never shows the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// The cluster members to talk to (at least one); requests are balanced over them.
    pub endpoints: Vec<Endpoint>,
    /// User name for etcd authentication, if the cluster has auth enabled.
    pub username: Option<String>,
    /// Password for `username`.
    pub password: Option<Secret>,
    /// TLS settings; `None` means plain-text gRPC.
    pub tls: Option<TlsFiles>,
    /// How long establishing a connection (TCP + TLS) may take, and how long the first
    /// contact with the cluster in [`EtcdKv::connect`](crate::EtcdKv::connect) may take.
    pub connect_timeout: Duration,
    /// How long any single request may take before it fails with
    /// [`KvError::Timeout`](rdzv_core::KvError::Timeout).
    pub request_timeout: Duration,
    /// The server's `--max-request-bytes` (default [`DEFAULT_MAX_REQUEST_BYTES`], etcd's
    /// default): values longer than this minus [`REQUEST_RESERVE_BYTES`] are refused with
    /// [`KvError::TooLarge`](rdzv_core::KvError::TooLarge) before anything is sent. Raise it
    /// only together with the server's limit.
    pub max_request_bytes: usize,
}

impl EtcdOptions {
    /// Options for plain-text connections to `endpoints`, without credentials, with the
    /// default timeouts.
    pub fn new(endpoints: Vec<Endpoint>) -> Self {
        EtcdOptions {
            endpoints,
            username: None,
            password: None,
            tls: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }

    /// The same options, logging in as `username` with `password`.
    pub fn with_user(mut self, username: impl Into<String>, password: Secret) -> Self {
        self.username = Some(username.into());
        self.password = Some(password);
        self
    }

    /// The same options, with TLS.
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The same options, with another per-request timeout.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The same options, for a server whose `--max-request-bytes` is `bytes` (at least
    /// [`MIN_MAX_REQUEST_BYTES`]; smaller values are raised to it).
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes.max(MIN_MAX_REQUEST_BYTES);
        self
    }

    /// The largest value a write may carry: `max_request_bytes - REQUEST_RESERVE_BYTES`.
    pub fn max_value_bytes(&self) -> usize {
        self.max_request_bytes.saturating_sub(REQUEST_RESERVE_BYTES)
    }

    /// The same options, with another connect timeout.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Reads the options of a parsed `etcd://` or `etcds://` URL: its endpoints, user and
    /// password, and the query options `cacert`, `cert`, `key`, `tls_server_name` (TLS, only
    /// with `etcds`; without `cacert` the system's CA store is trusted), `connect_timeout` and `request_timeout` (seconds, or a duration
    /// like `500ms`, `10s`) and `max_request_bytes` (bytes). Other query options are ignored here (the registry rejects the
    /// unknown ones before a backend sees them).
    pub fn from_url(url: &RendezvousUrl) -> Result<Self, ConfigError> {
        let tls_wanted = match url.scheme.as_str() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(ConfigError::InvalidUrl(format!(
                    "the etcd backend serves the schemes `etcd` and `etcds`, not `{other}`"
                )));
            }
        };
        if url.endpoints.is_empty() {
            return Err(ConfigError::InvalidUrl(
                "the URL names no etcd endpoint; expected etcd://host:2379/<run_id>".to_string(),
            ));
        }
        if let Some(bad) = url.endpoints.iter().find(|e| e.port == 0) {
            return Err(ConfigError::InvalidUrl(format!(
                "etcd endpoint `{}` has port 0; give a port between 1 and 65535 (etcd's is 2379)",
                bad.host
            )));
        }
        if url.password.is_some() && url.username.is_none() {
            return Err(ConfigError::InvalidUrl(
                "the URL gives a password without a user name; write etcd://user:password@host/…".to_string(),
            ));
        }
        let option = |name: &str| url.options.get(name).map(String::as_str);
        let mut options = EtcdOptions::new(url.endpoints.clone());
        options.username = url.username.clone();
        options.password = url.password.clone();
        if let Some(value) = option("connect_timeout") {
            options.connect_timeout = parse_timeout("connect_timeout", value)?;
        }
        if let Some(value) = option("request_timeout") {
            options.request_timeout = parse_timeout("request_timeout", value)?;
        }
        if let Some(value) = option("max_request_bytes") {
            options.max_request_bytes = parse_max_request_bytes(value)?;
        }
        let (cacert, cert, key) = (option("cacert"), option("cert"), option("key"));
        let server_name = option("tls_server_name");
        if !tls_wanted {
            if let Some((name, value)) =
                [("cacert", cacert), ("cert", cert), ("key", key), ("tls_server_name", server_name)]
                    .into_iter()
                    .find_map(|(n, v)| v.map(|v| (n, v)))
            {
                return Err(ConfigError::InvalidValue {
                    option: name.to_string(),
                    value: value.to_string(),
                    reason: "TLS files need TLS: use the scheme etcds:// (or protocol=https)".to_string(),
                });
            }
            return Ok(options);
        }
        let ca_cert = match cacert {
            Some("") => {
                return Err(ConfigError::InvalidValue {
                    option: "cacert".to_string(),
                    value: String::new(),
                    reason: "give the PEM file of the CA that signed the etcd servers' \
                             certificates, or leave cacert out to trust the system's CA store"
                        .to_string(),
                });
            }
            Some(path) => Some(PathBuf::from(path)),
            None => None,
        };
        let server_name = server_name.map(parse_server_name).transpose()?;
        let (client_cert, client_key) = match (cert, key) {
            (None, None) => (None, None),
            (Some(cert), Some(key)) => (Some(PathBuf::from(cert)), Some(PathBuf::from(key))),
            (Some(cert), None) => {
                return Err(ConfigError::InvalidValue {
                    option: "cert".to_string(),
                    value: cert.to_string(),
                    reason: "a client certificate needs its private key: add key=/path/client.key"
                        .to_string(),
                });
            }
            (None, Some(key)) => {
                return Err(ConfigError::InvalidValue {
                    option: "key".to_string(),
                    value: key.to_string(),
                    reason: "a client key needs its certificate: add cert=/path/client.pem".to_string(),
                });
            }
        };
        options.tls = Some(TlsFiles { ca_cert, client_cert, client_key, server_name });
        Ok(options)
    }

    /// The endpoints, comma-separated, as shown in errors (never with credentials).
    pub fn endpoint_list(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints.iter().map(|e| format!("{scheme}://{e}")).collect::<Vec<_>>().join(",")
    }
}

/// Checks `tls_server_name`: a DNS name or an IP address, as certificates name servers.
fn parse_server_name(value: &str) -> Result<String, ConfigError> {
    match rustls::pki_types::ServerName::try_from(value) {
        Ok(_) => Ok(value.to_string()),
        Err(e) => Err(ConfigError::InvalidValue {
            option: "tls_server_name".to_string(),
            value: value.to_string(),
            reason: format!("{e}: give the DNS name (or IP address) the servers' certificates are issued to"),
        }),
    }
}

/// Parses `max_request_bytes`: a whole number of bytes, like etcd's flag.
fn parse_max_request_bytes(value: &str) -> Result<usize, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidValue {
        option: "max_request_bytes".to_string(),
        value: value.to_string(),
        reason,
    };
    let bytes: usize = value.parse().map_err(|_| {
        invalid(format!(
            "expected a whole number of bytes, the server's --max-request-bytes (etcd's default \
             is {DEFAULT_MAX_REQUEST_BYTES})"
        ))
    })?;
    if bytes < MIN_MAX_REQUEST_BYTES {
        return Err(invalid(format!(
            "at least {MIN_MAX_REQUEST_BYTES} bytes: {REQUEST_RESERVE_BYTES} are reserved for keys \
             and framing"
        )));
    }
    // gRPC message sizes are 32-bit signed.
    if bytes > i32::MAX as usize {
        return Err(invalid(format!("at most {} bytes (gRPC's message size limit)", i32::MAX)));
    }
    Ok(bytes)
}

/// Parses a timeout like every duration option (plain seconds or `500ms`, `10s`, `1m`);
/// zero is refused because it would fail every request.
fn parse_timeout(option: &str, value: &str) -> Result<Duration, ConfigError> {
    let duration = rdzv_core::params::parse_duration(option, value)?;
    if duration.is_zero() {
        return Err(ConfigError::InvalidValue {
            option: option.to_string(),
            value: value.to_string(),
            reason: "a timeout must be longer than zero".to_string(),
        });
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use super::*;

    fn url(scheme: &str, options: &[(&str, &str)]) -> RendezvousUrl {
        RendezvousUrl {
            scheme: scheme.to_string(),
            endpoints: vec![Endpoint { host: "127.0.0.1".to_string(), port: 2379 }],
            username: None,
            password: None,
            run_id: "job".to_string(),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            rendezvous_options: BTreeMap::new(),
        }
    }

    #[test]
    fn plain_url_gives_defaults() {
        let options = EtcdOptions::from_url(&url("etcd", &[])).unwrap();
        assert_eq!(options.tls, None);
        assert_eq!(options.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(options.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        assert_eq!(options.endpoint_list(), "http://127.0.0.1:2379");
    }

    #[test]
    fn timeouts_parse_in_both_forms() {
        let options =
            EtcdOptions::from_url(&url("etcd", &[("connect_timeout", "1.5"), ("request_timeout", "250ms")]))
                .unwrap();
        assert_eq!(options.connect_timeout, Duration::from_millis(1500));
        assert_eq!(options.request_timeout, Duration::from_millis(250));
        for bad in ["", "0", "abc", "-1", "1.2.3"] {
            let err = EtcdOptions::from_url(&url("etcd", &[("request_timeout", bad)])).unwrap_err();
            assert!(err.to_string().contains("request_timeout"), "{err}");
        }
    }

    #[test]
    fn tls_needs_etcds_and_trusts_the_system_store_without_a_ca() {
        for option in ["cacert", "tls_server_name"] {
            let err = EtcdOptions::from_url(&url("etcd", &[(option, "x")])).unwrap_err();
            assert!(err.to_string().contains("etcds"), "{err}");
        }
        let options = EtcdOptions::from_url(&url("etcds", &[])).unwrap();
        assert_eq!(options.tls, Some(TlsFiles::default()), "no CA: the system's store");
        let err = EtcdOptions::from_url(&url("etcds", &[("cacert", "")])).unwrap_err();
        assert!(err.to_string().contains("system's CA store"), "{err}");
        let err = EtcdOptions::from_url(&url("etcds", &[("cacert", "/ca"), ("cert", "/c")])).unwrap_err();
        assert!(err.to_string().contains("key="), "{err}");
        let options = EtcdOptions::from_url(&url(
            "etcds",
            &[("cacert", "/ca"), ("cert", "/c"), ("key", "/k"), ("tls_server_name", "etcd.internal")],
        ))
        .unwrap();
        let tls = options.tls.clone().unwrap();
        assert_eq!(tls.ca_cert, Some(PathBuf::from("/ca")));
        assert_eq!(tls.client_key, Some(PathBuf::from("/k")));
        assert_eq!(tls.server_name.as_deref(), Some("etcd.internal"));
        assert_eq!(options.endpoint_list(), "https://127.0.0.1:2379");
        for bad in ["", "not a name", "etcd..internal"] {
            let err = EtcdOptions::from_url(&url("etcds", &[("tls_server_name", bad)])).unwrap_err();
            assert!(err.to_string().contains("tls_server_name"), "{bad}: {err}");
        }
    }

    #[test]
    fn max_request_bytes_defaults_to_etcds_and_can_be_raised() {
        let options = EtcdOptions::from_url(&url("etcd", &[])).unwrap();
        assert_eq!(options.max_request_bytes, 1_572_864);
        assert_eq!(options.max_value_bytes(), 1_572_864 - 65_536);
        let options = EtcdOptions::from_url(&url("etcd", &[("max_request_bytes", "4194304")])).unwrap();
        assert_eq!(options.max_request_bytes, 4_194_304);
        for bad in ["", "1.5MiB", "-1", "1000", "99999999999"] {
            let err = EtcdOptions::from_url(&url("etcd", &[("max_request_bytes", bad)])).unwrap_err();
            assert!(err.to_string().contains("max_request_bytes"), "{err}");
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let mut u = url("etcd", &[]);
        u.username = Some("root".to_string());
        u.password = Some(Secret::new("hunter2-secret"));
        let options = EtcdOptions::from_url(&u).unwrap();
        let shown = format!("{options:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("root"), "{shown}");
    }

    #[test]
    fn other_schemes_are_refused() {
        let err = EtcdOptions::from_url(&url("redis", &[])).unwrap_err();
        assert!(err.to_string().contains("redis"), "{err}");
    }
}
