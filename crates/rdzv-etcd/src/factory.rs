//! [`EtcdFactory`]: builds the etcd backend from a rendezvous URL (`etcd://` or `etcds://`).

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use rdzv_core::{BackendFactory, ConfigError, Kv, RendezvousError, RendezvousUrl};

use crate::client::ConnectError;
use crate::config::{DEFAULT_PORT, EtcdOptions, OPTIONS};
use crate::kv::EtcdKv;

/// The [`BackendFactory`] of the schemes `etcd` and `etcds`: options `cacert`, `cert`,
/// `key`, `tls_server_name`, `connect_timeout`, `request_timeout`, `max_request_bytes`, and
/// `protocol` (`https` turns `etcd://` into `etcds://`, PyTorch's spelling); default port
/// 2379. Every connect with the same settings (in one tokio runtime) shares one client.
#[derive(Clone, Copy, Debug, Default)]
pub struct EtcdFactory;

/// The option that chooses TLS by name (`http`, `https`) instead of by scheme.
const PROTOCOL: &str = "protocol";

#[async_trait]
impl BackendFactory for EtcdFactory {
    fn options(&self) -> &'static [&'static str] {
        // `protocol` is consumed by `interpret` before the options are checked; it is listed
        // so that an unknown option's error names it among the known ones.
        static ALL: OnceLock<Vec<&'static str>> = OnceLock::new();
        ALL.get_or_init(|| OPTIONS.iter().copied().chain([PROTOCOL]).collect())
    }

    fn default_port(&self) -> Option<u16> {
        Some(DEFAULT_PORT)
    }

    /// `protocol=https` turns `etcd` into `etcds` (TLS); `protocol=http` changes nothing on
    /// `etcd` and is an error on `etcds` (always TLS). The option is consumed.
    fn interpret(&self, url: &mut RendezvousUrl) -> Result<(), ConfigError> {
        if !matches!(url.scheme.as_str(), "etcd" | "etcds") {
            return Ok(());
        }
        let Some(value) = url.options.remove(PROTOCOL) else { return Ok(()) };
        match (value.to_ascii_lowercase().as_str(), url.scheme.as_str()) {
            ("https", _) => url.scheme = "etcds".to_string(),
            ("http", "etcd") => {}
            _ => {
                let tls_only =
                    if url.scheme == "etcds" { " (`etcds` is always TLS, so only `https`)" } else { "" };
                return Err(ConfigError::InvalidValue {
                    option: PROTOCOL.to_string(),
                    value,
                    reason: format!("expected `http` or `https`{tls_only}"),
                });
            }
        }
        Ok(())
    }

    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        let options = EtcdOptions::from_url(url)?;
        match EtcdKv::open(&options).await {
            Ok(kv) => Ok(Arc::new(kv)),
            Err(ConnectError::Config(e)) => Err(RendezvousError::Config(e)),
            // Unreachable is retryable (`Unavailable`); anything else (authentication…) is
            // reported as a backend error.
            Err(ConnectError::Kv(e)) => Err(RendezvousError::connecting(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rdzv_core::url::Endpoint;
    use rdzv_core::{ConfigError, Registry};

    use super::*;

    fn registry() -> Registry {
        let registry = Registry::new();
        registry.register("etcd", Arc::new(EtcdFactory)).unwrap();
        registry.register("etcds", Arc::new(EtcdFactory)).unwrap();
        registry
    }

    fn parse(url: &str) -> RendezvousUrl {
        registry().parse_address(url).unwrap_or_else(|e| panic!("`{url}` should parse: {e}")).url
    }

    fn parse_err(url: &str) -> ConfigError {
        match registry().parse_address(url) {
            Err(RendezvousError::Config(e)) => e,
            other => panic!("`{url}` should be a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn default_port_is_2379() {
        for url in ["etcd://h/r", "etcds://h/r", "ETCD://h/r"] {
            assert_eq!(parse(url).endpoints, [Endpoint { host: "h".into(), port: 2379 }], "{url}");
        }
        let url = parse("etcd://h1:1,h2,[::1]:3/r?endpoints=h4:4,h5,h1:1");
        let ports: Vec<u16> = url.endpoints.iter().map(|e| e.port).collect();
        assert_eq!(ports, [1, 2379, 3, 4, 2379]);
        assert_eq!(parse("etcd://h/r").to_string(), "etcd://h:2379/r");
    }

    #[test]
    fn protocol_https_means_tls() {
        let url = parse("etcd://h/r?protocol=https");
        assert_eq!(url.scheme, "etcds");
        assert!(!url.options.contains_key("protocol"), "consumed: {:?}", url.options);
        assert_eq!(parse("etcd://h/r?protocol=HTTP").scheme, "etcd");
        assert_eq!(parse("etcds://h/r?protocol=https").scheme, "etcds");
        for (url, tls_only) in [("etcd://h/r?protocol=ftp", false), ("etcds://h/r?protocol=http", true)] {
            match parse_err(url) {
                ConfigError::InvalidValue { option, reason, .. } => {
                    assert_eq!(option, "protocol", "{url}");
                    assert_eq!(reason.contains("always TLS"), tls_only, "{url}: {reason}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_err("etcd://h/r?protocol=https&protocol=https"),
            ConfigError::InvalidUrl(m) if m.contains("more than once")
        ));
    }

    #[test]
    fn protocol_https_needs_the_etcds_scheme_registered() {
        let registry = Registry::new();
        registry.register("etcd", Arc::new(EtcdFactory)).unwrap();
        match registry.parse_address("etcd://h/r?protocol=https") {
            Err(RendezvousError::Config(ConfigError::UnknownScheme { scheme, .. })) => {
                assert_eq!(scheme, "etcds")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_options_list_protocol_and_the_etcd_options() {
        match parse_err("etcd://h/r?db=1") {
            ConfigError::UnknownOption { option, known } => {
                assert_eq!(option, "db");
                for name in ["protocol", "cacert", "max_request_bytes", "min_workers", "password_file"] {
                    assert!(known.contains(name), "{name} missing from {known}");
                }
            }
            other => panic!("{other:?}"),
        }
    }
}
