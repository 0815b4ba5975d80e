//! # rdzv-etcd
//!
//! The etcd v3 backend of rdzv: the [`Kv`](rdzv_core::Kv) contract on etcd's gRPC API
//! (through `etcd-client`), for etcd 3.4 and later. (PyTorch's etcd rendezvous speaks the
//! v2 API, which etcd 3.6 removed; this one does not.)
//!
//! ## How the contract maps onto etcd
//! - **Preconditions** are compares in one transaction: *create if absent* is
//!   `create_revision(key) = 0`, *update if unchanged* is `mod_revision(key) = R` (and
//!   `version(key) > 0`). The transaction's failure branch reads the key, so a lost race
//!   returns the winner's key in the same round trip — one etcd proposal per attempt.
//! - **Ranges** are `[prefix, prefix+1)`; counts, limits, key-only reads and ordering by
//!   creation are etcd's own. etcd counts *before* applying `max_create_revision`, so with
//!   that filter the count is taken from the filtered keys (key names only, no values).
//!   Such a filtered count costs etcd a read of every key in the range (any filter or sort
//!   makes it fetch the whole range): about 3.5 ms for 1,024 keys on a 2-core machine,
//!   where a plain count only walks its index.
//! - **Leases** have whole-second TTLs, rounded up, and etcd grants at least 2 s (with its
//!   default timing: 1.5 × the election timeout) — see [`MIN_LEASE_TTL`]. A keep-alive is
//!   one request/response round; expiry is decided by the server.
//! - **Watches** start at a revision (inclusive). If it was compacted, the stream yields
//!   [`KvError::Compacted`](rdzv_core::KvError::Compacted) and ends. If the connection
//!   breaks, the watch is reopened from the last delivered revision + 1 (never a gap, never
//!   a duplicate), with pauses from 100 ms to 2 s between up to 8 further attempts; if
//!   they all fail, the stream yields `Unavailable` and ends. All watches of one client
//!   share one gRPC watch stream (as etcd's Go client does); dropping a watch sends a cancel
//!   request on it, so thousands of watches ending at once cost the connection nothing.
//!
//! ## Connecting
//! By URL, through the registry ([`EtcdFactory`] serves `etcd` and `etcds`):
//!
//! ```text
//! etcd://[user:password@]host[:2379][,host2:2379…]/<run_id>?min_workers=2
//! etcd://host:2379/<run_id>?endpoints=h2:2379,h3:2379
//! etcds://host:2379/<run_id>?cacert=ca.pem&cert=client.pem&key=client.key
//! etcds://10.0.0.5:2379/<run_id>?tls_server_name=etcd.internal   (system CA store)
//! etcd://host:2379/<run_id>?protocol=https&cacert=ca.pem      (the reference's spelling)
//! ```
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `cacert` | PEM file of the CA that signed the servers' certificates | the system's CA store |
//! | `cert`, `key` | PEM client certificate and its key, for servers with `--client-cert-auth` | none |
//! | `tls_server_name` | the name the servers' certificates are issued to, if not the host in the URL | the host |
//! | `connect_timeout` | how long connecting, and the first contact, may take | 5 s |
//! | `request_timeout` | how long any single request may take | 10 s |
//! | `max_request_bytes` | the servers' `--max-request-bytes`; set it only if theirs was raised | 1572864 (etcd's default, 1.5 MiB) |
//!
//! Durations are seconds (`2`, `0.5`) or humane (`500ms`, `10s`). With several endpoints,
//! a process sends its requests to one member (chosen at random per process, so that
//! processes spread over the cluster) and fails over to the next when that member cannot
//! be reached — a request that could not be sent is sent to the next member at once, so
//! one dead member among live ones fails no request (a lease refresh goes there too when
//! its member was lost under it: a refresh sent twice only renews twice). With a user
//! name, the client authenticates and renews its token when it expires.
//!
//! Or directly, with [`EtcdOptions`] and [`EtcdKv::connect`], or around a client you built
//! with [`EtcdKv::from_client`]:
//!
//! ```no_run
//! use std::time::Duration;
//! use rdzv_core::Kv;
//! use rdzv_core::url::Endpoint;
//! use rdzv_core::kv::{PutMode, PutOptions, PutOutcome};
//! use rdzv_etcd::{EtcdKv, EtcdOptions};
//!
//! # async fn demo() -> Result<(), rdzv_core::KvError> {
//! let options = EtcdOptions::new(vec![Endpoint { host: "127.0.0.1".into(), port: 2379 }])
//!     .with_request_timeout(Duration::from_secs(5));
//! let kv = EtcdKv::connect(options).await?;
//! match kv.put(b"leader", b"me", PutOptions::new(PutMode::Create)).await? {
//!     PutOutcome::Written { revision, .. } => println!("leader since revision {revision}"),
//!     PutOutcome::Conflict { current } => println!("someone else leads: {current:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! ## One client per process
//! [`EtcdKv::connect`] (and so every URL connect) keeps one client per endpoint set,
//! credentials, TLS files and connect timeout — and per tokio runtime, since a client's
//! connection tasks die with the runtime that made them. A thousand handlers in one process
//! share one HTTP/2 connection (to the member in use); their requests and watches are
//! multiplexed on it. The request timeout is per handle.
//!
//! ```
//! use rdzv_core::BackendFactory;
//! use rdzv_core::url::Endpoint;
//! use rdzv_etcd::{EtcdFactory, EtcdOptions};
//!
//! assert_eq!(EtcdFactory.default_port(), Some(2379));
//! assert!(EtcdFactory.options().contains(&"cacert"));
//! let options = EtcdOptions::new(vec![Endpoint { host: "10.0.0.1".into(), port: 2379 }]);
//! assert_eq!(options.endpoint_list(), "http://10.0.0.1:2379");
//! ```
//!
//! ## Outages
//! Nothing waits forever: every request ends by its request timeout. While no endpoint
//! answers, operations fail at once or by that timeout with
//! [`KvError::Unavailable`](rdzv_core::KvError::Unavailable) (naming the endpoints, never
//! the password) or [`KvError::Timeout`](rdzv_core::KvError::Timeout) — both retryable —
//! and the client reconnects by itself when the server is back. Open watches resume as
//! described above; leases survive an outage shorter than their TTL (etcd extends them
//! when it restarts), and refreshing them works again once the server answers. HTTP/2
//! keep-alive pings (every 10 s on connections with open streams) notice a connection that
//! died without a word. Requests require a leader: a member cut off from its cluster
//! answers "no leader" (`Unavailable`) and ends its watches instead of serving stale data,
//! and the client moves on to another member.
//!
//! ## Size limits
//! Checked before anything is sent, failing with
//! [`KvError::TooLarge`](rdzv_core::KvError::TooLarge) (which names the limit): a key,
//! namespace included, may have [`MAX_KEY_BYTES`] (8 KiB); a value
//! `max_request_bytes` − [`REQUEST_RESERVE_BYTES`] (1,507,328 bytes with etcd's default
//! limit). Together they keep every request within `max_request_bytes`, which must match
//! the servers' `--max-request-bytes`.
//!
//! ## Errors
//! Classified by error type and gRPC status code, not by message (see docs/ETCD.md):
//! unreachable, refused, reset or TLS-failed connections and etcd's `Unavailable` answers
//! ("no leader", "request timed out"…) are `Unavailable`; deadlines are `Timeout`; an
//! unknown lease is `LeaseNotFound`; compaction in a watch is `Compacted`; bad arguments
//! (empty key, a request too large for the server, a compacted or future revision) are
//! `InvalidArgument`; authentication and permission problems and anything else are
//! `Backend`, with the `etcd-client` error as source.
//!
//! ## Testing
//! With the `testing` feature, the module `testing` starts real `etcd` servers for tests
//! (plain, TLS, with auth, or a cluster of several members; stop, kill, restart;
//! `/metrics` and the proposal counter).

mod client;
mod config;
mod connector;
mod error;
mod factory;
mod keep_alive;
mod keys;
mod kv;
mod lease_streams;
mod watch;

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT, EtcdOptions,
    MAX_KEY_BYTES, MIN_MAX_REQUEST_BYTES, OPTIONS, REQUEST_RESERVE_BYTES, TlsFiles,
};
pub use factory::EtcdFactory;
pub use kv::{EtcdKv, MIN_LEASE_TTL};

#[cfg(feature = "testing")]
pub mod testing;
