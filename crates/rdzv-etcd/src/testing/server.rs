//! [`EtcdServer`]: one real `etcd` process on free loopback ports.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use rdzv_core::Kv;
use rdzv_core::testing::logs::{last_lines, read_since};
use rdzv_core::testing::ports::PortClaim;
use rdzv_core::url::{Endpoint, Secret};
use tempfile::TempDir;

use super::HarnessError;
use super::certs::TlsMaterial;
use super::metrics::{self, PROPOSALS_COMMITTED, metric_value};
use crate::client::{ConnectError, tls_options};
use crate::config::EtcdOptions;
use crate::kv::EtcdKv;

/// How long a starting server may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times a server or cluster is started on newly chosen ports when a port was
/// taken between choosing and binding it ([`port_was_taken`]).
pub(crate) const START_ATTEMPTS: u32 = 3;

/// Whether a start failed because one of its ports was taken meanwhile (by a test running
/// beside it): then starting again on other ports is worth it.
pub(crate) fn port_was_taken(error: &HarnessError) -> bool {
    error.to_string().contains("address already in use")
}

/// How long a stopping server may take to exit before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The watchdog: runs etcd in the background and waits on stdin. A line `kill` ends etcd
/// with SIGKILL, `term` with SIGTERM; end of input (the test process died or exited
/// without dropping the server) ends it with SIGTERM and removes `$RDZV_ETCD_CLEANUP` if
/// set. So etcd never outlives the test process.
const WATCHDOG: &str = r#"
"$0" "$@" &
pid=$!
if read -r command; then
  if [ "$command" = kill ]; then kill -9 "$pid" 2>/dev/null; else kill "$pid" 2>/dev/null; fi
  wait "$pid"
else
  kill "$pid" 2>/dev/null
  wait "$pid"
  if [ -n "$RDZV_ETCD_CLEANUP" ]; then rm -rf "$RDZV_ETCD_CLEANUP"; fi
fi
"#;

/// A running (or stopped, for outage tests) `etcd` server on `127.0.0.1`.
///
/// Dropping it kills the server and deletes its data directory.
pub struct EtcdServer {
    binary: PathBuf,
    client_port: u16,
    peer_port: u16,
    metrics_port: u16,
    dir: TempDir,
    tls: Option<TlsMaterial>,
    auth: Option<(String, Secret)>,
    process: Option<Process>,
    /// Its ports, claimed so that no other test server chooses them, also while it is down.
    claims: Vec<PortClaim>,
    /// Where the log stood when the server was last spawned: each start appends to the same
    /// log, and only what this start wrote says whether it failed.
    log_start: u64,
    extra_args: Vec<String>,
    /// The member name, and the cluster it belongs to (`name=peer-url,…`).
    pub(crate) name: String,
    pub(crate) initial_cluster: Option<String>,
}

impl std::fmt::Debug for EtcdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdServer")
            .field("client_port", &self.client_port)
            .field("tls", &self.tls.is_some())
            .field("auth", &self.auth.as_ref().map(|(user, _)| user))
            .field("running", &self.process.is_some())
            .finish_non_exhaustive()
    }
}

/// Options of a server to start: see [`EtcdServer::builder`].
#[derive(Default)]
pub struct EtcdServerBuilder {
    tls: bool,
    server_names: Option<Vec<String>>,
    auth: Option<Secret>,
    args: Vec<String>,
}

impl std::fmt::Debug for EtcdServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdServerBuilder")
            .field("tls", &self.tls)
            .field("server_names", &self.server_names)
            .field("auth", &self.auth.is_some())
            .field("args", &self.args)
            .finish()
    }
}

impl EtcdServerBuilder {
    /// Serve TLS and require a client certificate (see [`EtcdServer::start_tls`]).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Serve TLS (as [`EtcdServerBuilder::tls`]) with a server certificate issued to
    /// `names` only (e.g. `etcd.test`, not `127.0.0.1`): a client must then expect one of
    /// them (`tls_server_name`).
    pub fn tls_server_names<I: IntoIterator<Item = S>, S: Into<String>>(mut self, names: I) -> Self {
        self.tls = true;
        self.server_names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Enable authentication with user `root` and `password` (see
    /// [`EtcdServer::start_with_auth`]).
    pub fn auth(mut self, password: &str) -> Self {
        self.auth = Some(Secret::new(password));
        self
    }

    /// Pass one more flag to etcd (e.g. `--auth-token-ttl=1`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Starts the server and waits until it answers.
    pub async fn start(self) -> Result<EtcdServer, HarnessError> {
        let tls = match (self.tls, self.server_names) {
            (false, _) => None,
            (true, names) => Some(names),
        };
        EtcdServer::launch(tls, self.auth.map(|p| ("root".to_string(), p)), self.args).await
    }
}

struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl EtcdServer {
    /// Starts a plain-text server and waits until it answers.
    pub async fn start() -> Result<EtcdServer, HarnessError> {
        EtcdServer::builder().start().await
    }

    /// Starts a TLS server that requires a client certificate (`--client-cert-auth`), with
    /// a CA, server and client certificates generated now ([`EtcdServer::tls`]).
    pub async fn start_tls() -> Result<EtcdServer, HarnessError> {
        EtcdServer::builder().tls().start().await
    }

    /// Starts a plain-text server with authentication enabled: user `root` with
    /// `password` (role `root`). [`EtcdServer::options`] and [`EtcdServer::url`] carry the
    /// credentials.
    pub async fn start_with_auth(password: &str) -> Result<EtcdServer, HarnessError> {
        EtcdServer::builder().auth(password).start().await
    }

    /// A builder for servers with several of TLS, auth and extra etcd flags.
    pub fn builder() -> EtcdServerBuilder {
        EtcdServerBuilder::default()
    }

    /// `tls`: `None` plain text, `Some(None)` TLS for `127.0.0.1`, `Some(Some(names))` TLS
    /// with a certificate for `names`.
    async fn launch(
        tls: Option<Option<Vec<String>>>,
        auth: Option<(String, Secret)>,
        extra_args: Vec<String>,
    ) -> Result<EtcdServer, HarnessError> {
        let binary = find_binary()?;
        let dir = temp_dir()?;
        let tls = match tls {
            None => None,
            Some(None) => Some(TlsMaterial::generate(dir.path())?),
            Some(Some(names)) => Some(TlsMaterial::generate_for(dir.path(), &names)?),
        };
        let mut server = EtcdServer {
            binary,
            client_port: 0,
            peer_port: 0,
            metrics_port: 0,
            dir,
            tls,
            auth: None,
            process: None,
            claims: Vec::new(),
            log_start: 0,
            extra_args,
            name: "rdzv-test".to_string(),
            initial_cluster: None,
        };
        let mut attempts = 0;
        // A free port can be taken between choosing and binding it; choose again then.
        loop {
            attempts += 1;
            server.use_ports(claim_ports(3)?);
            let _ = std::fs::remove_dir_all(server.data_dir());
            match server.spawn_and_wait().await {
                Ok(()) => break,
                Err(e) if attempts < START_ATTEMPTS && port_was_taken(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some((user, password)) = auth {
            server.enable_auth(&user, &password).await?;
            server.auth = Some((user, password));
        }
        Ok(server)
    }

    /// The client endpoint.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint { host: "127.0.0.1".to_string(), port: self.client_port }
    }

    /// The client URL (`http://127.0.0.1:PORT` or `https://…`).
    pub fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The generated certificates of a TLS server.
    pub fn tls(&self) -> Option<&TlsMaterial> {
        self.tls.as_ref()
    }

    /// The data directory (kept across [`EtcdServer::restart`]).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A rendezvous URL for this server: `etcd://127.0.0.1:PORT/<rest>` (`rest` is the run id
    /// and query, e.g. `"job?min_workers=2"`). A TLS server gets `etcds://` and its `cacert`,
    /// `cert` and `key` options (and `tls_server_name` if its certificate does not name
    /// `127.0.0.1`); a server with auth gets `root:password@`.
    pub fn url(&self, rest: &str) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        let user = match &self.auth {
            Some((user, password)) => {
                format!("{}:{}@", percent_encode_all(user), percent_encode_all(password.expose()))
            }
            None => String::new(),
        };
        let mut url =
            format!("{scheme}://{user}127.0.0.1:{}/{}", self.client_port, rest.trim_start_matches('/'));
        if let Some(tls) = &self.tls {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&format!(
                "cacert={}&cert={}&key={}",
                percent_encode(&tls.ca_cert.display().to_string()),
                percent_encode(&tls.client_cert.display().to_string()),
                percent_encode(&tls.client_key.display().to_string()),
            ));
            if let Some(name) = tls.client_files().server_name {
                url.push_str(&format!("&tls_server_name={}", percent_encode_all(&name)));
            }
        }
        url
    }

    /// Connection options for this server (TLS files and credentials included).
    pub fn options(&self) -> EtcdOptions {
        let mut options = EtcdOptions::new(vec![self.endpoint()]);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.client_files());
        }
        if let Some((user, password)) = &self.auth {
            options = options.with_user(user.clone(), password.clone());
        }
        options
    }

    /// A connected backend, as `Arc<dyn Kv>`.
    ///
    /// # Panics
    /// If the server does not answer: this is a test harness, and a test without its
    /// server must fail. Use [`EtcdServer::try_kv`] to handle the error.
    pub async fn kv(&self) -> Arc<dyn Kv> {
        match self.try_kv().await {
            Ok(kv) => Arc::new(kv),
            Err(e) => panic!("cannot connect to the test etcd at {}: {e}", self.client_url()),
        }
    }

    /// A connected backend.
    pub async fn try_kv(&self) -> Result<EtcdKv, rdzv_core::KvError> {
        EtcdKv::connect(self.options()).await
    }

    /// Fetches the server's Prometheus metrics (text format).
    pub async fn metrics(&self) -> Result<String, HarnessError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.metrics_port));
        tokio::task::spawn_blocking(move || metrics::fetch(addr))
            .await
            .map_err(|e| HarnessError::new(format!("metrics fetch task failed: {e}")))?
    }

    /// The server's `etcd_server_proposals_committed_total`: how many writes went through
    /// Raft so far.
    pub async fn proposals_committed(&self) -> Result<u64, HarnessError> {
        let text = self.metrics().await?;
        metric_value(&text, PROPOSALS_COMMITTED)
            .map(|v| v as u64)
            .ok_or_else(|| HarnessError::new(format!("no `{PROPOSALS_COMMITTED}` in /metrics")))
    }

    /// Whether the process is running (not stopped).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Stops the server gracefully (SIGTERM) and waits for it to exit; its ports and data
    /// directory are kept for [`EtcdServer::restart`].
    pub async fn stop(&mut self) -> Result<(), HarnessError> {
        self.end("term").await
    }

    /// Freezes the server with SIGSTOP, like a machine that stops answering without closing
    /// its connections (a long GC pause, a hung disk). Its clock keeps running: leases whose
    /// TTL passes meanwhile expire as soon as it is resumed with [`EtcdServer::resume`].
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.signal("STOP")
    }

    /// Resumes a server frozen by [`EtcdServer::pause`] (SIGCONT).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal("CONT")
    }

    /// Sends `signal` to the etcd process (not its watchdog shell), found by the client
    /// address on its command line.
    fn signal(&self, signal: &str) -> Result<(), HarnessError> {
        let needle = format!("127.0.0.1:{}", self.client_port);
        let entries =
            std::fs::read_dir("/proc").map_err(|e| HarnessError::new(format!("cannot list /proc: {e}")))?;
        for entry in entries.flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
            let is_etcd = args.next().is_some_and(|a| a.ends_with("etcd"));
            if is_etcd && args.any(|a| a.contains(&needle)) {
                let pid = entry.file_name().to_string_lossy().into_owned();
                let status = std::process::Command::new("kill")
                    .args([format!("-{signal}"), pid.clone()])
                    .status()
                    .map_err(|e| HarnessError::new(format!("cannot run kill: {e}")))?;
                return if status.success() {
                    Ok(())
                } else {
                    Err(HarnessError::new(format!("kill -{signal} {pid} failed: {status}")))
                };
            }
        }
        Err(HarnessError::new(format!("no etcd process serves {needle}")))
    }

    /// Kills the server (SIGKILL), like a crash; see [`EtcdServer::stop`].
    pub async fn kill(&mut self) -> Result<(), HarnessError> {
        self.end("kill").await
    }

    /// [`EtcdServer::kill`] without yielding to the runtime: blocks this thread until etcd is
    /// gone. A client on a single-threaded runtime then has not yet seen its connections to
    /// the server close (as when a member dies while its client is busy), and its next request
    /// is written to a dead connection.
    pub fn kill_blocking(&mut self) -> Result<(), HarnessError> {
        match self.process.take() {
            Some(process) => end_process(process, "kill"),
            None => Ok(()),
        }
    }

    /// Starts the server again on the same ports and data directory (stopping it first if
    /// it runs), and waits until it answers.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        if self.process.is_some() {
            self.stop().await?;
        }
        self.spawn_and_wait().await
    }

    async fn end(&mut self, how: &'static str) -> Result<(), HarnessError> {
        let Some(process) = self.process.take() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || end_process(process, how))
            .await
            .map_err(|e| HarnessError::new(format!("stop task failed: {e}")))?
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    pub(crate) fn spawn(&mut self) -> Result<(), HarnessError> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let metrics = format!("http://127.0.0.1:{}", self.metrics_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| HarnessError::new(format!("cannot open the etcd log: {e}")))?;
        self.log_start = log.metadata().map_or(0, |m| m.len());
        let log_err =
            log.try_clone().map_err(|e| HarnessError::new(format!("cannot open the etcd log: {e}")))?;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(WATCHDOG)
            .arg(&self.binary)
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args([
                "--initial-cluster",
                &self.initial_cluster.clone().unwrap_or_else(|| format!("{}={peer}", self.name)),
            ])
            .args(["--initial-cluster-state", "new"])
            .args(["--listen-metrics-urls", &metrics])
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"])
            .args(&self.extra_args)
            .env("RDZV_ETCD_CLEANUP", self.dir.path())
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH)
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(log_err);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca_cert)
                .arg("--client-cert-auth");
        }
        let mut child = command.spawn().map_err(|e| {
            HarnessError::new(format!("cannot run {} through sh: {e}", self.binary.display()))
        })?;
        let stdin = child.stdin.take();
        self.process = Some(Process { child, stdin });
        Ok(())
    }

    async fn spawn_and_wait(&mut self) -> Result<(), HarnessError> {
        self.spawn()?;
        self.wait_ready().await
    }

    /// Waits until the spawned process answers a status request.
    pub(crate) async fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let exited = self.process.as_mut().and_then(|process| process.child.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.process = None;
                return Err(HarnessError::new(format!(
                    "etcd exited during start-up ({status}); its log says:\n{}",
                    self.log_tail()
                )));
            }
            let last = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            // The watchdog outlives an etcd that gave up (a port taken meanwhile, say): its
            // log says so at once, long before the deadline.
            if self.log_says_it_gave_up() {
                let _ = self.kill().await;
                return Err(HarnessError::new(format!(
                    "etcd on port {} gave up during start-up; its log says:\n{}",
                    self.client_port,
                    self.log_tail()
                )));
            }
            if Instant::now() >= deadline {
                let _ = self.kill().await;
                return Err(HarnessError::new(format!(
                    "etcd on port {} did not answer within {START_TIMEOUT:?} ({last}); its log says:\n{}",
                    self.client_port,
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One health request with a deadline: a fresh client asks for the server's status.
    async fn probe(&self) -> Result<(), String> {
        let mut options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
        if let Some(tls) = &self.tls {
            let files = tls.client_files();
            options = options.with_tls(tls_options(&files).map_err(|e| match e {
                ConnectError::Config(e) => e.to_string(),
                ConnectError::Kv(e) => e.to_string(),
            })?);
        }
        let attempt = async {
            let client = Client::connect([self.client_url()], Some(options)).await?;
            client.maintenance_client().status().await?;
            client.cluster_client().member_list().await
        };
        let members = match tokio::time::timeout(Duration::from_secs(2), attempt).await {
            Ok(Ok(members)) => members,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("status request timed out".to_string()),
        };
        // Another test's server may have taken the client port between choosing and binding
        // it: that one answers too, but in a cluster without this server's peer address.
        let peer = self.peer_url();
        if members.members().iter().any(|m| m.peer_urls().contains(&peer)) {
            Ok(())
        } else {
            Err(format!("the server answering there is not this one (no member at {peer})"))
        }
    }

    async fn enable_auth(&self, user: &str, password: &Secret) -> Result<(), HarnessError> {
        let fail = |what: &str, e: etcd_client::Error| {
            HarnessError::new(format!("cannot enable etcd auth ({what}): {e}"))
        };
        let mut client = Client::connect([self.client_url()], None).await.map_err(|e| fail("connect", e))?;
        client.user_add(user, password.expose(), None).await.map_err(|e| fail("user add", e))?;
        client.user_grant_role(user, "root").await.map_err(|e| fail("grant role root", e))?;
        client.auth_enable().await.map_err(|e| fail("auth enable", e))?;
        Ok(())
    }

    /// Whether etcd logged a fatal error (it exits after one).
    fn log_says_it_gave_up(&self) -> bool {
        self.log_of_this_start().contains(r#""level":"fatal""#)
    }

    /// The last lines this start wrote to the server's log, for error messages.
    fn log_tail(&self) -> String {
        last_lines(&self.log_of_this_start(), 20)
    }

    /// What the server wrote to its log since it was last spawned (an earlier start that
    /// gave up, on ports since chosen again, is not this one's failure).
    fn log_of_this_start(&self) -> String {
        read_since(&self.log_path(), self.log_start).unwrap_or_default()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            let _ = end_process(process, "kill");
        }
    }
}

/// Tells the watchdog how to end etcd, then waits for it (bounded; SIGKILL of the
/// watchdog as the last resort).
fn end_process(mut process: Process, how: &str) -> Result<(), HarnessError> {
    if let Some(mut stdin) = process.stdin.take() {
        let _ = writeln!(stdin, "{how}");
        drop(stdin);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        match process.child.try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = process.child.kill();
                let _ = process.child.wait();
                return Err(HarnessError::new(format!(
                    "etcd did not exit within {STOP_TIMEOUT:?}; killed its watchdog"
                )));
            }
        }
    }
}

/// A fresh directory for a server's data, log and certificates.
fn temp_dir() -> Result<TempDir, HarnessError> {
    let mut builder = tempfile::Builder::new();
    builder.prefix("rdzv-etcd-test-");
    // etcd fsyncs every commit; on tmpfs that costs nothing, which keeps tests quick.
    let shm = Path::new("/dev/shm");
    let dir =
        if shm.is_dir() { builder.tempdir_in(shm).or_else(|_| builder.tempdir()) } else { builder.tempdir() };
    dir.map_err(|e| HarnessError::new(format!("cannot create a temporary directory: {e}")))
}

impl EtcdServer {
    /// A not yet started member `name` of a plain-text cluster, on the given ports.
    pub(crate) fn member(name: String, ports: [u16; 3]) -> Result<EtcdServer, HarnessError> {
        Ok(EtcdServer {
            binary: find_binary()?,
            client_port: ports[0],
            peer_port: ports[1],
            metrics_port: ports[2],
            dir: temp_dir()?,
            tls: None,
            auth: None,
            process: None,
            claims: Vec::new(),
            log_start: 0,
            extra_args: Vec::new(),
            name,
            initial_cluster: None,
        })
    }

    /// Takes the three `claims` as its client, peer and metrics ports, in that order.
    pub(crate) fn use_ports(&mut self, claims: Vec<PortClaim>) {
        [self.client_port, self.peer_port, self.metrics_port] = [0, 1, 2].map(|i| claims[i].port());
        self.claims = claims;
    }

    /// The peer URL.
    pub(crate) fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// This member's raft id, from its own status answer (`None` if it does not answer).
    pub(crate) async fn member_id(&self) -> Option<u64> {
        let status = async {
            let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
            let client = Client::connect([self.client_url()], Some(options)).await?;
            client.maintenance_client().status().await
        };
        let status = tokio::time::timeout(Duration::from_secs(2), status).await.ok()?.ok()?;
        status.header().map(|h| h.member_id())
    }
}

/// The etcd binary: `$ETCD_BIN`, else `etcd` on `PATH`.
fn find_binary() -> Result<PathBuf, HarnessError> {
    locate_binary(std::env::var_os("ETCD_BIN"), std::env::var_os("PATH"))
}

fn locate_binary(
    etcd_bin: Option<std::ffi::OsString>,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf, HarnessError> {
    let missing = |detail: String| {
        HarnessError::new(format!(
            "{detail}; the etcd tests need a real etcd server: install etcd-server \
             (scripts/setup.sh, or `apt-get install etcd-server`) or set ETCD_BIN"
        ))
    };
    if let Some(binary) = etcd_bin {
        let binary = PathBuf::from(binary);
        return if is_executable(&binary) {
            Ok(binary)
        } else {
            Err(missing(format!("ETCD_BIN={} is not an executable file", binary.display())))
        };
    }
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| missing("no `etcd` binary on PATH".to_string()))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// `n` distinct free loopback ports outside the ephemeral range, claimed for a server
/// (`rdzv_core::testing::ports`), so that a server restarted on them finds them free.
pub(crate) fn claim_ports(n: usize) -> Result<Vec<PortClaim>, HarnessError> {
    rdzv_core::testing::ports::claim_loopback_ports(n)
        .map_err(|e| HarnessError::new(format!("cannot find free loopback ports: {e}")))
}

/// Percent-encodes everything but unreserved characters and `/` (for file paths in a query).
fn percent_encode(text: &str) -> String {
    encode(text, b"-._~/")
}

/// Percent-encodes everything but unreserved characters (for a user name or password).
fn percent_encode_all(text: &str) -> String {
    encode(text, b"-._~")
}

fn encode(text: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || keep.contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port_list(n: usize) -> Vec<u16> {
        rdzv_core::testing::ports::free_loopback_ports(n).expect("free ports")
    }

    #[test]
    fn a_missing_binary_fails_and_says_how_to_install_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let err = locate_binary(None, Some(dir.path().as_os_str().to_owned())).expect_err("no etcd");
        assert!(err.to_string().contains("install etcd-server"), "{err}");
        assert!(err.to_string().contains("scripts/setup.sh"), "{err}");
        let err = locate_binary(Some(dir.path().join("nope").into_os_string()), None).expect_err("no etcd");
        assert!(err.to_string().contains("ETCD_BIN="), "{err}");
        let err = locate_binary(None, None).expect_err("no PATH");
        assert!(err.to_string().contains("install etcd-server"), "{err}");
    }

    /// A one-member cluster whose peer port is held by the returned listener.
    fn member_on_a_taken_peer_port() -> (std::net::TcpListener, EtcdServer) {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let peer = taken.local_addr().expect("its address").port();
        let free = free_port_list(2);
        let mut member =
            EtcdServer::member("rdzv-test-0".into(), [free[0], peer, free[1]]).expect("a member");
        member.initial_cluster = Some(format!("rdzv-test-0={}", member.peer_url()));
        (taken, member)
    }

    /// A port taken between choosing and binding it makes etcd give up at once, while its
    /// watchdog lives on: the start fails saying so (and a cluster then starts again on new
    /// ports), instead of waiting out the start-up deadline.
    #[tokio::test]
    async fn a_member_whose_port_is_taken_fails_at_once_saying_why() {
        let (_taken, mut member) = member_on_a_taken_peer_port();
        member.spawn().expect("etcd spawned");
        let err = member.wait_ready().await.expect_err("its peer port is taken");
        assert!(err.to_string().contains("gave up during start-up"), "{err}");
        assert!(err.to_string().contains("address already in use"), "{err}");
    }

    /// A client port taken by another test's server: that server answers there, but the
    /// start is not taken for ready; it fails saying why (and is started again elsewhere).
    #[tokio::test]
    async fn a_member_whose_client_port_another_server_has_is_not_ready() {
        let other = EtcdServer::start().await.expect("the other server");
        let free = free_port_list(2);
        let mut member = EtcdServer::member("rdzv-test-0".into(), [other.client_port, free[0], free[1]])
            .expect("a member");
        member.initial_cluster = Some(format!("rdzv-test-0={}", member.peer_url()));
        let err = member.spawn_and_wait().await.expect_err("its client port is the other's");
        assert!(err.to_string().contains("address already in use"), "{err}");
    }

    /// A server whose start gave up on a taken port starts on the ports chosen next: each
    /// start appends to the same log, and the earlier start's fatal line is not this one's.
    #[tokio::test]
    async fn a_start_again_on_other_ports_is_not_failed_by_the_last_one() {
        let (_taken, mut member) = member_on_a_taken_peer_port();
        member.spawn_and_wait().await.expect_err("its peer port is taken");
        member.peer_port = free_port_list(1)[0];
        member.initial_cluster = Some(format!("rdzv-test-0={}", member.peer_url()));
        let _ = std::fs::remove_dir_all(member.data_dir());
        member.spawn_and_wait().await.expect("starts on a free peer port");
        member.try_kv().await.expect("answers");
    }

    #[test]
    fn urls_are_percent_encoded() {
        assert_eq!(percent_encode("/tmp/a b/ca.pem"), "/tmp/a%20b/ca.pem");
        assert_eq!(percent_encode_all("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
    }
}
