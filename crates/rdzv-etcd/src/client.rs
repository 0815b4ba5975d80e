//! One `etcd-client` client per runtime and connection settings, shared by every
//! [`EtcdKv`](crate::EtcdKv) built from those settings: a thousand handlers in one process
//! use one HTTP/2 connection (to the member in use), not a thousand.
//!
//! The cache is keyed by the tokio runtime too, because a client's connection tasks live on
//! the runtime that created it and die with it; an entry whose runtime is gone is replaced.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, Identity, KvClient, LeaseClient, TlsOptions, WatchClient,
};
use rdzv_core::kv::LeaseId;
use rdzv_core::per_process::PerProcess;
use rdzv_core::url::Endpoint;
use rdzv_core::{ConfigError, KvError};
use tokio::sync::OnceCell;

use crate::config::{EtcdOptions, TlsFiles};
use crate::connector::Connector;
use crate::error::{self, BACKEND, Context};

/// etcd's own Go client accepts responses up to 2 GiB; tonic's default of 4 MiB would make
/// a watch that replays a few 1 MiB values fail to decode.
const MAX_MESSAGE_SIZE: usize = i32::MAX as usize;

/// How many lease TTLs a client remembers at most.
const MAX_REMEMBERED_LEASES: usize = 100_000;

/// HTTP/2 keep-alive pings while streams are open, so that a watch on a connection that died
/// silently (no FIN, no RST) ends instead of waiting forever. etcd refuses pings more often
/// than every 5 s (`--grpc-keepalive-min-time`) and pings without open streams.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The per-service clients of one etcd member.
pub(crate) struct Clients {
    pub client: Client,
    pub kv: KvClient,
    pub watch: WatchClient,
    pub lease: LeaseClient,
    /// The keep-alive streams lease refreshes share, on this member's channel; `None` with
    /// credentials (etcd-client holds the token) or for a client the caller connected, where
    /// each lease's refreshes go on a stream of its own (`keep_alive.rs`).
    pub refreshes: Option<Arc<crate::lease_streams::LeaseStreams>>,
}

impl Clients {
    fn new(client: Client, refreshes: Option<Arc<crate::lease_streams::LeaseStreams>>) -> Clients {
        Clients {
            refreshes,
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            watch: client.watch_client().max_decoding_message_size(MAX_MESSAGE_SIZE),
            lease: client.lease_client(),
            client,
        }
    }
}

/// One endpoint, connected on first use (with credentials, connecting authenticates, which
/// needs the member to answer).
struct Member {
    url: String,
    clients: OnceCell<Clients>,
}

/// The clients of a cluster, and what errors need to know about it.
///
/// Requests go to one member (a random one per process, so that processes spread over the
/// cluster); when it cannot be reached they fail over to the next, and it stays preferred
/// until it fails. Unlike balancing every request over all members, a dead member then
/// costs one failed connection attempt, not a share of all requests.
pub(crate) struct Shared {
    members: Vec<Member>,
    /// How to connect a member (`None`: the members came connected).
    connect: Option<Connect>,
    preferred: AtomicUsize,
    /// `http(s)://host:port,…`, for errors; never credentials.
    pub endpoints: String,
    pub username: Option<String>,
    /// TTLs of the leases granted through this client, so that a keep-alive can return the
    /// TTL without a second round trip (etcd-client swallows the first answer's TTL).
    lease_ttls: Mutex<HashMap<LeaseId, i64>>,
    /// The one watch stream all watches of this client share.
    pub watches: crate::watch::Mux,
    /// The connection batched lease refreshes use (see [`Shared::keeper`]).
    keeper: std::sync::OnceLock<Box<Shared>>,
    /// Slots of the requests in flight on this connection (see [`REQUESTS_IN_FLIGHT`]).
    pub requests: tokio::sync::Semaphore,
    /// The keep-alive streams open on this connection, by lease.
    pub keep_alives: crate::keep_alive::Streams,
    /// The runtime this client was made in, where its connections' tasks run.
    runtime: Option<tokio::runtime::Id>,
}

impl Shared {
    /// Wraps a client the caller connected (one member, as far as failover goes).
    pub fn from_client(client: Client, endpoints: String) -> Shared {
        Shared {
            members: vec![Member {
                url: endpoints.clone(),
                clients: OnceCell::new_with(Some(Clients::new(client, None))),
            }],
            connect: None,
            preferred: AtomicUsize::new(0),
            endpoints,
            username: None,
            lease_ttls: Mutex::new(HashMap::new()),
            watches: crate::watch::Mux::default(),
            keeper: std::sync::OnceLock::new(),
            keep_alives: crate::keep_alive::Streams::default(),
            requests: tokio::sync::Semaphore::new(REQUESTS_IN_FLIGHT),
            runtime: tokio::runtime::Handle::try_current().ok().map(|h| h.id()),
        }
    }

    fn new(urls: Vec<String>, connect: Connect, username: Option<String>) -> Shared {
        let first = std::process::id() as usize % urls.len().max(1);
        Shared {
            endpoints: urls.join(","),
            members: urls.into_iter().map(|url| Member { url, clients: OnceCell::new() }).collect(),
            connect: Some(connect),
            preferred: AtomicUsize::new(first),
            username,
            lease_ttls: Mutex::new(HashMap::new()),
            watches: crate::watch::Mux::default(),
            keeper: std::sync::OnceLock::new(),
            keep_alives: crate::keep_alive::Streams::default(),
            requests: tokio::sync::Semaphore::new(REQUESTS_IN_FLIGHT),
            runtime: tokio::runtime::Handle::try_current().ok().map(|h| h.id()),
        }
    }

    /// The client batched lease refreshes go through. Sent from another runtime than this
    /// client's: a second connection to the same members, connected by the first refresh
    /// *in that runtime*. Sessions send them from a keep-alive thread of their own
    /// (`rdzv_core::Session`), so this connection's tasks run there and a refresh never
    /// waits for a runtime that is busy with the protocol (where this client's connection
    /// lives). Sent from this client's own runtime, or for a client the caller connected
    /// ([`Shared::from_client`], no settings to connect again): this client.
    pub fn keeper(&self) -> &Shared {
        let Some(connect) = &self.connect else {
            return self;
        };
        if tokio::runtime::Handle::try_current().ok().map(|h| h.id()) == self.runtime {
            return self;
        }
        self.keeper.get_or_init(|| {
            let urls = self.members.iter().map(|m| m.url.clone()).collect();
            Box::new(Shared::new(urls, connect.clone(), self.username.clone()))
        })
    }

    /// The clients of member `index`, connecting them on first use.
    async fn member(&self, index: usize) -> Result<&Clients, etcd_client::Error> {
        let Some(member) = self.members.get(index) else {
            return Err(etcd_client::Error::InvalidArgs("no etcd endpoint given".to_string()));
        };
        member
            .clients
            .get_or_try_init(|| async {
                let mut refreshes = None;
                let client = match &self.connect {
                    Some(connect) => match endpoint(&member.url, connect) {
                        Ok(endpoint) => {
                            let channel =
                                endpoint.connect_with_connector_lazy(Connector::new(KEEP_ALIVE_INTERVAL));
                            if self.username.is_none() {
                                refreshes =
                                    Some(Arc::new(crate::lease_streams::LeaseStreams::new(channel.clone())));
                            }
                            let channel = etcd_client::Channel::Tonic(channel);
                            Client::from_channel(channel, Some(connect.options.clone())).await
                        }
                        Err(e) => Err(e),
                    },
                    None => {
                        Err(etcd_client::Error::InvalidArgs("no way to connect to etcd given".to_string()))
                    }
                };
                // With credentials, connecting logs in, and the login is the only request
                // it makes: a final answer to it means the credentials were refused.
                let client = match client {
                    Err(e) if self.username.is_some() => Err(error::login_refused(e)),
                    other => other,
                }?;
                Ok(Clients::new(client, refreshes))
            })
            .await
    }

    /// The preferred member's client (connecting it if needed).
    pub async fn client(&self) -> Result<Client, etcd_client::Error> {
        self.run(|clients| {
            let client = clients.client.clone();
            async move { Ok(client) }
        })
        .await
    }

    /// Runs `request` on the preferred member; if that member cannot be reached (the
    /// request was not sent), on the next, until every member was tried once. A request
    /// that was never sent cannot be applied twice. A member that failed is no longer
    /// preferred.
    pub async fn run<T, F, Fut>(&self, request: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(&Clients) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.run_with(request, Resend::Never).await
    }

    /// [`Shared::run`], where `resend` says whether a request whose connection broke under
    /// it also goes to the next member.
    pub async fn run_with<T, F, Fut>(&self, mut request: F, resend: Resend) -> Result<T, etcd_client::Error>
    where
        F: FnMut(&Clients) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let count = self.members.len().max(1);
        let first = self.preferred.load(Ordering::Relaxed) % count;
        let mut tried = 0;
        loop {
            let index = (first + tried) % count;
            let result = match self.member(index).await {
                Ok(clients) => request(clients).await,
                Err(e) => Err(e),
            };
            tried += 1;
            match result {
                Err(e) if error::is_unreachable(&e) => {
                    let next = (index + 1) % count;
                    let _ =
                        self.preferred.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
                    if tried < count && (resend == Resend::IfLost || error::never_sent(&e)) {
                        continue;
                    }
                    return Err(e);
                }
                other => return other,
            }
        }
    }

    /// The TTL a lease was granted with through this client, if known.
    pub fn known_ttl(&self, lease: LeaseId) -> Option<i64> {
        self.lease_ttls.lock().ok().and_then(|ttls| ttls.get(&lease).copied())
    }

    /// Remembers a lease's TTL.
    pub fn remember_ttl(&self, lease: LeaseId, ttl: i64) {
        if let Ok(mut ttls) = self.lease_ttls.lock() {
            // Leases that expired unobserved would pile up; forgetting costs only a second
            // keep-alive round for the ones still alive.
            if ttls.len() >= MAX_REMEMBERED_LEASES {
                ttls.clear();
            }
            ttls.insert(lease, ttl);
        }
    }

    /// Forgets an ended lease.
    pub fn forget_ttl(&self, lease: LeaseId) {
        if let Ok(mut ttls) = self.lease_ttls.lock() {
            ttls.remove(&lease);
        }
    }

    /// Error context for requests through this client.
    pub fn context(&self, timeout: Duration, lease: Option<LeaseId>) -> Context<'_> {
        Context { endpoints: &self.endpoints, lease, timeout }
    }
}

/// Whether a request that may have reached a member before its connection broke is sent
/// to the next member too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only a request that was never sent: any other might then be applied twice.
    Never,
    /// Also one whose member was lost under it: for requests that may be applied twice, such
    /// as lease refreshes (a second refresh only renews the lease again).
    IfLost,
}

/// Why a connection could not be set up.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The settings are wrong (unreadable TLS file…): retrying will not help.
    Config(ConfigError),
    /// The cluster did not answer, or refused us.
    Kv(KvError),
}

/// The settings that make two clients interchangeable. Not `Debug`: it holds the password.
#[derive(PartialEq, Eq, Hash)]
struct CacheKey {
    runtime: tokio::runtime::Id,
    endpoints: Vec<Endpoint>,
    username: Option<String>,
    password: Option<String>,
    tls: Option<TlsFiles>,
    connect_timeout: Duration,
}

struct Entry {
    cell: Arc<OnceCell<Arc<Shared>>>,
    /// Dropped when the runtime that owns the client's tasks shuts down.
    runtime_alive: Weak<()>,
}

/// This process's clients (a forked child starts without its parent's: their connections'
/// tasks ran on the parent's runtimes, and a parent's thread may have held the lock).
static CACHE: PerProcess<Mutex<HashMap<CacheKey, Entry>>> = PerProcess::new(Default::default);

/// The shared client for `options`, connecting (and checking that the cluster answers) the
/// first time.
pub(crate) async fn shared(options: &EtcdOptions) -> Result<Arc<Shared>, ConnectError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        ConnectError::Kv(KvError::backend(BACKEND, "the etcd backend must be used inside a tokio runtime"))
    })?;
    let key = CacheKey {
        runtime: runtime.id(),
        endpoints: options.endpoints.clone(),
        username: options.username.clone(),
        password: options.password.as_ref().map(|p| p.expose().to_string()),
        tls: options.tls.clone(),
        connect_timeout: options.connect_timeout,
    };
    let cell = {
        let mut cache = CACHE.get().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.retain(|_, entry| entry.runtime_alive.strong_count() > 0);
        let entry = cache.entry(key).or_insert_with(|| {
            let alive = Arc::new(());
            let runtime_alive = Arc::downgrade(&alive);
            // Lives exactly as long as the runtime: dropped with its tasks at shutdown.
            runtime.spawn(async move {
                let _alive = alive;
                std::future::pending::<()>().await;
            });
            Entry { cell: Arc::new(OnceCell::new()), runtime_alive }
        });
        entry.cell.clone()
    };
    // Concurrent first connects wait for one attempt; a failed attempt leaves the cell
    // empty for the next caller to retry.
    cell.get_or_try_init(|| connect(options)).await.cloned()
}

/// Number of live cached clients (for tests of the sharing).
pub(crate) fn cached_clients() -> usize {
    let cache = CACHE.get().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    cache.values().filter(|e| e.runtime_alive.strong_count() > 0 && e.cell.initialized()).count()
}

/// How this client's connections are made: etcd-client's options (credentials,
/// `require_leader`) and what [`endpoint`] needs.
#[derive(Clone)]
pub(crate) struct Connect {
    options: ConnectOptions,
    tls: Option<TlsOptions>,
    connect_timeout: Duration,
}

/// At most this many requests (lease refreshes aside) are in flight on one connection; more
/// wait for a slot. etcd applies the writes it commits one after another, and a lease
/// refresh fails ("waiting for the applied index took too long") once applying lags a
/// second behind: thousands of workers of one client writing at once made it lag seconds,
/// and their sessions were lost. Waiting here keeps the lag short; the server is no slower.
const REQUESTS_IN_FLIGHT: usize = 256;

/// How many streams this side reset that a connection remembers, for [`RESET_STREAM_MEMORY`]
/// each. A frame the server sent before it saw the reset is ignored on a remembered stream;
/// on a forgotten one it is an error that HTTP/2 answers with a reset of its own, and after
/// 1,024 of those (hyper's default: it remembers 10) the connection closes itself with
/// `GOAWAY(ENHANCE_YOUR_CALM, "too_many_internal_resets")`. Thousands of workers on one
/// client cancel that many requests (deadlines, ended watches) within seconds: at 8,192
/// in-process workers the connection closed itself about every ten seconds, and every
/// session on it was lost.
const RESET_STREAMS_REMEMBERED: usize = 1 << 16;
/// See [`RESET_STREAMS_REMEMBERED`] (h2's default).
const RESET_STREAM_MEMORY: Duration = Duration::from_secs(30);

/// The HTTP/2 endpoint of one member, as etcd-client makes it (TLS, keep-alive, connect
/// timeout), and also remembering every stream reset recently (see
/// [`RESET_STREAMS_REMEMBERED`]) and never closing itself over resets the server caused: the
/// server is the cluster the user named, not an adversary. Its TCP connections are
/// [`Connector`]'s.
fn endpoint(url: &str, connect: &Connect) -> Result<tonic::transport::Endpoint, etcd_client::Error> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_string())?;
    if let Some(tls) = &connect.tls {
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    Ok(endpoint
        .connect_timeout(connect.connect_timeout)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(false)
        .http2_max_concurrent_reset_streams(RESET_STREAMS_REMEMBERED)
        .http2_reset_stream_duration(RESET_STREAM_MEMORY)
        .http2_max_local_error_reset_streams(None))
}

/// Connects a new client and checks that the cluster answers within the connect timeout.
async fn connect(options: &EtcdOptions) -> Result<Arc<Shared>, ConnectError> {
    if options.endpoints.is_empty() {
        return Err(ConnectError::Config(ConfigError::InvalidUrl("no etcd endpoint given".to_string())));
    }
    let endpoint_list = options.endpoint_list();
    let scheme = if options.tls.is_some() { "https" } else { "http" };
    let urls: Vec<String> = options.endpoints.iter().map(|e| format!("{scheme}://{e}")).collect();
    // A member cut off from its cluster refuses requests and ends watches ("no leader")
    // instead of serving stale reads or a watch that never delivers; both then move on to
    // another member.
    let mut connect_options = ConnectOptions::new().with_require_leader(true);
    if let Some(user) = &options.username {
        let password = options.password.as_ref().map(|p| p.expose().to_string()).unwrap_or_default();
        // Simple tokens expire (5 min by default); re-authenticate instead of failing.
        connect_options = connect_options.with_user(user.clone(), password).with_auto_token_refresh(true);
    }
    let tls = options.tls.as_ref().map(tls_options).transpose()?;
    let connect_options = Connect { options: connect_options, tls, connect_timeout: options.connect_timeout };
    let operation = "connect";
    let classify = |e: etcd_client::Error| {
        let ctx = Context { endpoints: &endpoint_list, lease: None, timeout: options.connect_timeout };
        let tls_failure = error::is_tls_failure(&e);
        let error = error::classify(operation, e, ctx);
        if tls_failure { error } else { with_tls_hint(error, options) }
    };
    let members = urls.len() as u32;
    let shared = Shared::new(urls, connect_options, options.username.clone());
    // The first contact: connecting a member (which authenticates, with credentials) and
    // asking for its status, so that a wrong address, a TLS mismatch or a bad password is
    // reported here rather than at the first operation. Each unreachable member may take
    // the connect timeout. A member that answers it has no leader (an election under way:
    // the status goes with `require_leader`) is asked again within that time, since that
    // passes; one that cannot be reached fails at once.
    let deadline = tokio::time::Instant::now() + options.connect_timeout * members;
    let probe = rdzv_core::retry::retry_while_busy(deadline, || async {
        let status = shared.run(|clients| {
            let mut maintenance = clients.client.maintenance_client();
            async move { maintenance.status().await }
        });
        status.await.map(drop).map_err(classify)
    });
    match tokio::time::timeout_at(deadline, probe).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ConnectError::Kv(e)),
        Err(_) => return Err(ConnectError::Kv(no_answer(&endpoint_list, options))),
    }
    tracing::debug!(endpoints = %endpoint_list, "connected to etcd");
    Ok(Arc::new(shared))
}

/// A TLS connection the server closes during the first contact (without a TLS error on
/// our side), without a client certificate, is most likely a server that requires one;
/// TLS 1.3 does not always let the client see the server's alert.
fn with_tls_hint(error: KvError, options: &EtcdOptions) -> KvError {
    match (error, &options.tls) {
        (KvError::Unavailable { backend, endpoint, message, source }, Some(tls))
            if tls.client_cert.is_none() =>
        {
            KvError::Unavailable {
                backend,
                endpoint,
                message: format!(
                    "{message} (no client certificate was given: if the server requires one \
                     (--client-cert-auth), add cert=<client.pem>&key=<client.key>)"
                ),
                source,
            }
        }
        (error, _) => error,
    }
}

fn no_answer(endpoint_list: &str, options: &EtcdOptions) -> KvError {
    KvError::Unavailable {
        backend: BACKEND,
        endpoint: endpoint_list.to_string(),
        message: format!("no answer within the connect timeout of {:?}", options.connect_timeout),
        source: None,
    }
}

/// Reads the PEM files of `tls`; without a CA file, the system's CA store is trusted.
pub(crate) fn tls_options(tls: &TlsFiles) -> Result<TlsOptions, ConnectError> {
    let mut config = match &tls.ca_cert {
        Some(path) => TlsOptions::new().ca_certificate(Certificate::from_pem(read_pem("cacert", path)?)),
        None => {
            // tonic would fail every connection attempt with a transport error instead.
            if rustls_native_certs::load_native_certs().certs.is_empty() {
                return Err(ConnectError::Config(ConfigError::MissingOption(
                    "cacert (etcds:// without cacert trusts the system's CA store, and none was \
                     found: install the system's CA certificates (ca-certificates) or give \
                     cacert=/path/ca.pem)"
                        .to_string(),
                )));
            }
            TlsOptions::new().with_native_roots()
        }
    };
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let cert = read_pem("cert", cert)?;
            let key = read_pem("key", key)?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        (None, None) => {}
        (Some(cert), None) => {
            return Err(ConnectError::Config(ConfigError::InvalidValue {
                option: "cert".to_string(),
                value: cert.display().to_string(),
                reason: "a client certificate needs its private key (option `key`)".to_string(),
            }));
        }
        (None, Some(key)) => {
            return Err(ConnectError::Config(ConfigError::InvalidValue {
                option: "key".to_string(),
                value: key.display().to_string(),
                reason: "a client key needs its certificate (option `cert`)".to_string(),
            }));
        }
    }
    Ok(config)
}

fn read_pem(option: &str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    let invalid = |reason: String| {
        ConnectError::Config(ConfigError::InvalidValue {
            option: option.to_string(),
            value: path.display().to_string(),
            reason,
        })
    };
    let bytes = std::fs::read(path).map_err(|e| invalid(format!("cannot read the file: {e}")))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(invalid(
            "the file is not PEM (no `-----BEGIN` line); give a PEM certificate or key".to_string(),
        ));
    }
    Ok(bytes)
}
