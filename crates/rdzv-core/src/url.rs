//! Parsing of rendezvous URLs (SURFACE.md): `scheme://[user:pass@]host:port[,host:port…]/<run_id>?options`.

use std::collections::BTreeMap;

use crate::error::ConfigError;
use crate::params::RendezvousParams;

/// A host and port of a backend server.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// Host name, IPv4 address, or IPv6 address without brackets.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A password: never shown by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret string.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for handing to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A parsed rendezvous URL: where the backend is, how to log in, which run, and the
/// options. The rendezvous parameters are parsed out by [`RendezvousUrl::params`]; what a
/// backend understands it takes from [`RendezvousUrl::options`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousUrl {
    /// The scheme, lower-case (`etcd`, `etcds`, `redis`, `rediss`, `mem`, or a user's).
    pub scheme: String,
    /// The servers: the URL's host plus any `endpoints=` option (default port per scheme;
    /// for `mem://<name>/…`, one endpoint whose host is the name and port 0).
    pub endpoints: Vec<Endpoint>,
    /// User name, if given.
    pub username: Option<String>,
    /// Password, if given.
    pub password: Option<Secret>,
    /// The run id (the URL's path without its leading `/`), percent-decoded.
    pub run_id: String,
    /// Every query option that is not a rendezvous parameter, by its canonical name.
    pub options: BTreeMap<String, String>,
    /// The rendezvous parameters' query options as given (canonical names).
    pub rendezvous_options: BTreeMap<String, String>,
}
