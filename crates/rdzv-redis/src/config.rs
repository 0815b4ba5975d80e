//! How to reach a Redis server and where our keys live, from a rendezvous URL or built by
//! hand.

use std::path::PathBuf;
use std::time::Duration;

use rdzv_core::params::parse_duration;
use rdzv_core::url::{Endpoint, Secret};
use rdzv_core::{ConfigError, RendezvousUrl};

/// Default Redis port.
pub const DEFAULT_PORT: u16 = 6379;

/// Default namespace: all keys live under the hash tag `{rdzv:rdzv}`.
pub const DEFAULT_NAMESPACE: &str = "rdzv";

/// The URL query options the Redis backend understands.
pub const OPTIONS: &[&str] = &[
    "db",
    "cacert",
    "cert",
    "key",
    "connect_timeout",
    "request_timeout",
    "namespace",
    "history",
    "history_bytes",
];

/// Default bound of the event log in bytes (`history_bytes=`).
pub const DEFAULT_HISTORY_BYTES: u64 = 64 << 20;

/// Connection and layout settings of a [`RedisKv`](crate::RedisKv).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    /// The server.
    pub endpoint: Endpoint,
    /// ACL user name, if any.
    pub username: Option<String>,
    /// Password, if any (never shown).
    pub password: Option<Secret>,
    /// Database number (`db=`, default 0).
    pub db: i64,
    /// Connect with TLS (`rediss://`).
    pub tls: bool,
    /// PEM file of the CA that signed the server's certificate (`cacert=`); `None`: the
    /// system's trust store.
    pub cacert: Option<PathBuf>,
    /// PEM file of the client certificate presented to the server (`cert=`, with `key`), for
    /// servers that verify clients (`tls-auth-clients yes`, Redis' default with TLS on).
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (`key=`, with `cert`).
    pub key: Option<PathBuf>,
    /// Bound on establishing a connection (`connect_timeout=`, default 5 s).
    pub connect_timeout: Duration,
    /// Bound on every request (`request_timeout=`, default 10 s).
    pub request_timeout: Duration,
    /// Namespace of the keys (`namespace=`, default `rdzv`): every key lives under the hash
    /// tag `{rdzv:<namespace>}`; clients in different namespaces never see each other.
    pub namespace: String,
    /// Revisions of watch history kept (`history=`, default 1 000 000); older ones are
    /// compacted away, once the log is over this by a sixteenth (so up to `history`/16
    /// more are kept in between).
    pub history: u64,
    /// Bytes of events the log keeps (`history_bytes=`, default 64 MiB; suffixes `KiB`,
    /// `MiB`, `GiB` accepted): the oldest revisions are compacted away beyond it, whatever
    /// `history` says. Each event counts its key and value plus 64 bytes; the newest
    /// revision is always kept, and trimming waits until the log is over this by a
    /// sixteenth, so the log holds at most `history_bytes` × 17/16 plus that revision's
    /// events.
    pub history_bytes: u64,
}

impl RedisConfig {
    /// Settings for a plain-TCP server at `host:port` with every other value at its default.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        RedisConfig {
            endpoint: Endpoint { host: host.into(), port },
            username: None,
            password: None,
            db: 0,
            tls: false,
            cacert: None,
            cert: None,
            key: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            namespace: DEFAULT_NAMESPACE.to_string(),
            history: 1_000_000,
            history_bytes: DEFAULT_HISTORY_BYTES,
        }
    }

    /// The same settings in namespace `namespace`.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Settings from a parsed `redis://` or `rediss://` URL. Errors name the bad option:
    /// several endpoints (Redis takes one), a bad `db`, duration, `history` or namespace,
    /// an option the backend does not know.
    pub fn from_url(url: &RendezvousUrl) -> Result<Self, ConfigError> {
        let tls = match url.scheme.as_str() {
            "redis" => false,
            "rediss" => true,
            other => {
                return Err(ConfigError::InvalidUrl(format!(
                    "the Redis backend serves `redis://` and `rediss://`, not `{other}://`"
                )));
            }
        };
        let endpoint = match url.endpoints.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(ConfigError::InvalidUrl(
                    "a Redis URL needs a host, e.g. `redis://127.0.0.1:6379/<run_id>`".into(),
                ));
            }
            many => {
                return Err(ConfigError::InvalidValue {
                    option: "endpoints".into(),
                    value: many.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                    reason: "the Redis backend connects to exactly one server".into(),
                });
            }
        };
        let mut config = RedisConfig::new(endpoint.host, endpoint.port);
        config.tls = tls;
        config.username = url.username.clone().filter(|u| !u.is_empty());
        config.password = url.password.clone();
        for (name, value) in &url.options {
            match name.as_str() {
                "db" => config.db = parse_db(value)?,
                "cacert" => config.cacert = Some(PathBuf::from(value)),
                "cert" => config.cert = Some(PathBuf::from(value)),
                "key" => config.key = Some(PathBuf::from(value)),
                "connect_timeout" => config.connect_timeout = positive(name, value)?,
                "request_timeout" => config.request_timeout = positive(name, value)?,
                "namespace" => config.namespace = value.clone(),
                "history" => config.history = parse_history(value)?,
                "history_bytes" => config.history_bytes = parse_bytes(name, value)?,
                other => {
                    return Err(ConfigError::UnknownOption {
                        option: other.to_string(),
                        known: OPTIONS.join(", "),
                    });
                }
            }
        }
        for option in ["cacert", "cert", "key"] {
            if let (Some(value), false) = (url.options.get(option), config.tls) {
                return Err(ConfigError::InvalidValue {
                    option: option.into(),
                    value: value.clone(),
                    reason: "certificates need TLS: use `rediss://`".into(),
                });
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the values a user can get wrong when building the config by hand.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (&self.cert, &self.key) {
            (Some(_), Some(_)) | (None, None) => {}
            (Some(cert), None) => {
                return Err(ConfigError::InvalidValue {
                    option: "cert".into(),
                    value: cert.display().to_string(),
                    reason: "a client certificate needs its private key (option `key`)".into(),
                });
            }
            (None, Some(key)) => {
                return Err(ConfigError::InvalidValue {
                    option: "key".into(),
                    value: key.display().to_string(),
                    reason: "a private key needs its client certificate (option `cert`)".into(),
                });
            }
        }
        if !self.tls && (self.cacert.is_some() || self.cert.is_some()) {
            return Err(ConfigError::InvalidValue {
                option: if self.cacert.is_some() { "cacert" } else { "cert" }.into(),
                value: self
                    .cacert
                    .as_ref()
                    .or(self.cert.as_ref())
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                reason: "certificates need TLS: use `rediss://` (or set `tls`)".into(),
            });
        }
        if self.namespace.is_empty()
            || self.namespace.chars().any(|c| matches!(c, '{' | '}') || c.is_control())
        {
            return Err(ConfigError::InvalidValue {
                option: "namespace".into(),
                value: self.namespace.clone(),
                reason: "expected a non-empty name without `{`, `}` or control characters".into(),
            });
        }
        if self.history_bytes == 0 {
            return Err(ConfigError::InvalidValue {
                option: "history_bytes".into(),
                value: "0".into(),
                reason: "the event log needs room for at least one event".into(),
            });
        }
        if self.history == 0 {
            return Err(ConfigError::InvalidValue {
                option: "history".into(),
                value: "0".into(),
                reason: "at least one revision of history must be kept".into(),
            });
        }
        Ok(())
    }

    /// The prefix of every Redis key of this namespace: `{rdzv:<namespace>}:`.
    pub fn key_base(&self) -> String {
        format!("{{rdzv:{}}}:", self.namespace)
    }

    /// The endpoint as shown in errors (never with credentials).
    pub fn endpoint_display(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{}/{}", self.endpoint, self.db)
    }
}

fn parse_db(value: &str) -> Result<i64, ConfigError> {
    value.parse::<i64>().ok().filter(|db| *db >= 0).ok_or_else(|| ConfigError::InvalidValue {
        option: "db".into(),
        value: value.into(),
        reason: "expected a database number, 0 or more".into(),
    })
}

fn parse_history(value: &str) -> Result<u64, ConfigError> {
    value.parse::<u64>().ok().filter(|h| *h > 0 && *h <= 1 << 40).ok_or_else(|| ConfigError::InvalidValue {
        option: "history".into(),
        value: value.into(),
        reason: "expected a number of revisions, at least 1".into(),
    })
}

/// A byte count: digits, optionally followed by `KiB`, `MiB` or `GiB`.
fn parse_bytes(option: &str, value: &str) -> Result<u64, ConfigError> {
    let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit: u64 = match &value[digits.len()..] {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|n| *n > 0 && *n <= 1 << 50)
        .ok_or_else(|| ConfigError::InvalidValue {
            option: option.into(),
            value: value.into(),
            reason: "expected a size in bytes above zero, e.g. `67108864` or `64MiB`".into(),
        })
}

fn positive(option: &str, value: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration(option, value)?;
    if d.is_zero() {
        return Err(ConfigError::InvalidValue {
            option: option.into(),
            value: value.into(),
            reason: "must be longer than zero".into(),
        });
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use super::*;

    fn url(scheme: &str, options: &[(&str, &str)]) -> RendezvousUrl {
        RendezvousUrl {
            scheme: scheme.into(),
            endpoints: vec![Endpoint { host: "h".into(), port: 7000 }],
            username: Some("u".into()),
            password: Some(Secret::new("hunter2")),
            run_id: "job".into(),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            rendezvous_options: BTreeMap::new(),
        }
    }

    #[test]
    fn options_are_read() {
        let c = RedisConfig::from_url(&url(
            "rediss",
            &[
                ("db", "3"),
                ("cacert", "/ca.pem"),
                ("connect_timeout", "2s"),
                ("namespace", "t1"),
                ("history", "10"),
                ("history_bytes", "2MiB"),
            ],
        ))
        .unwrap();
        assert!(c.tls);
        assert_eq!(c.db, 3);
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.key_base(), "{rdzv:t1}:");
        assert_eq!(c.history, 10);
        assert_eq!(c.history_bytes, 2 << 20);
        assert_eq!(c.endpoint_display(), "rediss://h:7000/3");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn bad_options_are_named() {
        for (opts, name) in [
            (&[("db", "-1")][..], "db"),
            (&[("history", "0")][..], "history"),
            (&[("history_bytes", "0")][..], "history_bytes"),
            (&[("history_bytes", "5MB")][..], "history_bytes"),
            (&[("namespace", "a}b")][..], "namespace"),
            (&[("connect_timeout", "soon")][..], "connect_timeout"),
            (&[("bogus", "1")][..], "bogus"),
        ] {
            let e = RedisConfig::from_url(&url("redis", opts)).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
        let e = RedisConfig::from_url(&url("redis", &[("cacert", "/ca.pem")])).unwrap_err();
        assert!(e.to_string().contains("rediss"), "{e}");
        let e = RedisConfig::from_url(&url("redis", &[("cert", "/c.pem"), ("key", "/c.key")])).unwrap_err();
        assert!(e.to_string().contains("rediss"), "{e}");
        let e = RedisConfig::from_url(&url("rediss", &[("cert", "/c.pem")])).unwrap_err();
        assert!(e.to_string().contains("`key`"), "{e}");
        let e = RedisConfig::from_url(&url("rediss", &[("key", "/c.key")])).unwrap_err();
        assert!(e.to_string().contains("`cert`"), "{e}");
        let c = RedisConfig::from_url(&url("rediss", &[("cert", "/c.pem"), ("key", "/c.key")])).unwrap();
        assert_eq!((c.cert.unwrap(), c.key.unwrap()), (PathBuf::from("/c.pem"), PathBuf::from("/c.key")));
    }
}
