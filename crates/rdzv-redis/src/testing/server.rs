//! [`RedisServer`]: a real `redis-server` on a free loopback port, for tests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdzv_core::Kv;
use rdzv_core::testing::logs::{last_lines, read_since};
use rdzv_core::testing::ports::PortClaim;

use crate::config::RedisConfig;
use crate::kv::RedisKv;
use crate::testing::tls::TlsFiles;

/// Why a test server could not be started or used.
#[derive(Debug)]
pub struct HarnessError(pub String);

impl std::fmt::Display for HarnessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HarnessError {}

/// How long a server may take to answer `PING` after it was started.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// How many times a server's first start chooses new ports after one was taken.
const START_ATTEMPTS: u32 = 3;

/// What Redis logs when a port it was told to listen on is taken (then it exits).
const PORT_TAKEN: &str = "Address already in use";

/// What Redis logs once it listens on all its ports.
const READY: &str = "Ready to accept connections";

/// A `redis-server` process started by the test: no automatic persistence (`--save ""
/// --appendonly no`; a test may still `SAVE` a snapshot and
/// [restart from it](RedisServer::restart_from_snapshot)), a temporary directory, loopback
/// only. It is killed on drop (also
/// when a test panics) and when the test process exits in any way: the server runs under
/// a small shell that kills it as soon as its standard input — a pipe held by this process
/// — closes.
pub struct RedisServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    tls: Option<(u16, TlsFiles)>,
    /// Whether the TLS port requires a client certificate (`tls-auth-clients yes`).
    client_auth: bool,
    extra_args: Vec<String>,
    guard: Option<Child>,
    /// Its ports, claimed so that no other test server chooses them, also while it is down.
    claims: Vec<PortClaim>,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer").field("port", &self.port).field("tls_port", &self.tls_port()).finish()
    }
}

static NAMESPACES: AtomicU64 = AtomicU64::new(0);

impl RedisServer {
    /// Starts a plain-TCP server on a free port and waits until it answers `PING`.
    /// The binary is `$REDIS_SERVER_BIN` or `redis-server` on `PATH`; a missing binary is
    /// an error saying how to install it.
    pub fn start() -> Result<RedisServer, HarnessError> {
        Self::start_inner(false)
    }

    /// Starts a server that also listens with TLS (certificates generated now, in the
    /// temporary directory); connect to [`RedisServer::tls_config`]. The plain port stays
    /// open for the harness' own health checks.
    pub fn start_tls() -> Result<RedisServer, HarnessError> {
        Self::start_inner(true)
    }

    /// Like [`RedisServer::start_tls`], but the TLS port requires a client certificate
    /// signed by the generated CA (`tls-auth-clients yes`, Redis' own default);
    /// [`RedisServer::tls_client_config`] has one.
    pub fn start_tls_with_client_auth() -> Result<RedisServer, HarnessError> {
        let mut server = Self::prepare(true)?;
        server.client_auth = true;
        server.start_on_free_ports()?;
        Ok(server)
    }

    /// Starts a plain-TCP server with extra `redis-server` arguments (e.g.
    /// `["--requirepass", "pw"]`); the harness' health check then only needs an answer,
    /// not `+PONG` (an auth error counts as alive).
    pub fn start_with_args(args: &[&str]) -> Result<RedisServer, HarnessError> {
        let mut server = Self::prepare(false)?;
        server.extra_args = args.iter().map(|a| a.to_string()).collect();
        server.start_on_free_ports()?;
        Ok(server)
    }

    fn start_inner(tls: bool) -> Result<RedisServer, HarnessError> {
        let mut server = Self::prepare(tls)?;
        server.start_on_free_ports()?;
        Ok(server)
    }

    /// Launches the server, choosing its ports again when one was taken between choosing
    /// and binding it (by a test running beside this one).
    fn start_on_free_ports(&mut self) -> Result<(), HarnessError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.launch() {
                Err(e) if attempts < START_ATTEMPTS && e.0.contains(PORT_TAKEN) => self.choose_ports()?,
                done => return done,
            }
        }
    }

    fn choose_ports(&mut self) -> Result<(), HarnessError> {
        self.claims = claim_ports(if self.tls.is_some() { 2 } else { 1 })?;
        self.port = self.claims[0].port();
        if let Some((tls_port, _)) = &mut self.tls {
            *tls_port = self.claims[1].port();
        }
        Ok(())
    }

    fn prepare(tls: bool) -> Result<RedisServer, HarnessError> {
        let bin = find_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("rdzv-redis-")
            .tempdir()
            .map_err(|e| HarnessError(format!("cannot create a temporary directory: {e}")))?;
        let tls = if tls { Some((0, TlsFiles::generate(dir.path())?)) } else { None };
        let mut server = RedisServer {
            bin,
            dir,
            port: 0,
            tls,
            client_auth: false,
            extra_args: Vec::new(),
            guard: None,
            claims: Vec::new(),
        };
        server.choose_ports()?;
        Ok(server)
    }

    /// The plain-TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, for a server from [`RedisServer::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|(p, _)| *p)
    }

    /// The PEM file of the CA that signed the TLS server's certificate.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|(_, f)| f.ca.clone())
    }

    /// A rendezvous URL for this server: `redis://127.0.0.1:PORT/<run_id>?<query>`
    /// (`query` without the `?`, may be empty).
    pub fn url(&self, run_id: &str, query: &str) -> String {
        let q = if query.is_empty() { String::new() } else { format!("?{query}") };
        format!("redis://127.0.0.1:{}/{run_id}{q}", self.port)
    }

    /// A TLS rendezvous URL for a server from [`RedisServer::start_tls`]:
    /// `rediss://localhost:TLS_PORT/<run_id>?cacert=<generated CA>[&<query>]`.
    pub fn tls_url(&self, run_id: &str, query: &str) -> Option<String> {
        let (port, files) = self.tls.as_ref()?;
        let extra = if query.is_empty() { String::new() } else { format!("&{query}") };
        Some(format!("rediss://localhost:{port}/{run_id}?cacert={}{extra}", files.ca.display()))
    }

    /// Settings for this server (plain TCP) in `namespace`, with short timeouts for tests.
    pub fn config(&self, namespace: &str) -> RedisConfig {
        let mut c = RedisConfig::new("127.0.0.1", self.port).with_namespace(namespace);
        c.connect_timeout = Duration::from_secs(2);
        c.request_timeout = Duration::from_secs(5);
        c
    }

    /// Settings for the TLS port (host `localhost`, the generated CA), or `None` for a
    /// plain server.
    pub fn tls_config(&self, namespace: &str) -> Option<RedisConfig> {
        let (port, files) = self.tls.as_ref()?;
        let mut c = self.config(namespace);
        c.endpoint.host = "localhost".into();
        c.endpoint.port = *port;
        c.tls = true;
        c.cacert = Some(files.ca.clone());
        Some(c)
    }

    /// [`RedisServer::tls_config`] with the generated client certificate and key.
    pub fn tls_client_config(&self, namespace: &str) -> Option<RedisConfig> {
        let (_, files) = self.tls.as_ref()?;
        let mut c = self.tls_config(namespace)?;
        c.cert = Some(files.client_cert.clone());
        c.key = Some(files.client_key.clone());
        Some(c)
    }

    /// The PEM files of a TLS server (CA, server and client certificates).
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|(_, f)| f)
    }

    /// A fresh namespace name, unique in this process.
    pub fn fresh_namespace() -> String {
        format!("t{}-{}", std::process::id(), NAMESPACES.fetch_add(1, Ordering::Relaxed))
    }

    /// A client in a fresh namespace (so tests sharing a server never see each other).
    pub async fn kv(&self) -> Arc<dyn Kv> {
        self.kv_in(&Self::fresh_namespace()).await
    }

    /// A client in `namespace`; panics with the reason if the server cannot be reached
    /// (this is a test helper).
    pub async fn kv_in(&self, namespace: &str) -> Arc<dyn Kv> {
        match RedisKv::connect(self.config(namespace)).await {
            Ok(kv) => Arc::new(kv),
            Err(e) => panic!("cannot connect to the test redis-server on port {}: {e}", self.port),
        }
    }

    /// Stops the server (kills it and waits until it is gone). Its data is lost.
    pub fn stop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            // A line, then the pipe closed: the guard shell kills the server and exits,
            // keeping the directory (a restart reuses it).
            if let Some(mut stdin) = guard.stdin.take() {
                let _ = stdin.write_all(b"stop\n");
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match guard.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = guard.kill();
                        let _ = guard.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }

    /// Stops the server and starts it again on the same port(s), empty (no persistence; a
    /// snapshot saved with `SAVE` is deleted first).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop();
        match std::fs::remove_file(self.snapshot_file()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(HarnessError(format!("cannot delete the old snapshot: {e}"))),
        }
        self.launch()
    }

    /// Kills the server (nothing is saved at exit) and starts it again on the same port(s)
    /// and directory, so it loads the last snapshot a client saved with `SAVE` or `BGSAVE`:
    /// what a restart from an RDB snapshot looks like in production, writes after the
    /// snapshot lost. Errors if there is no snapshot.
    pub fn restart_from_snapshot(&mut self) -> Result<(), HarnessError> {
        self.stop();
        let snapshot = self.snapshot_file();
        if !snapshot.is_file() {
            return Err(HarnessError(format!(
                "no snapshot at {}: send SAVE to the server before restarting from it",
                snapshot.display()
            )));
        }
        self.launch()
    }

    /// Kills the server and starts it again on the same port(s) and directory, keeping its
    /// files: a server started with persistence (e.g. `--appendonly yes --appendfsync
    /// always` through [`RedisServer::start_with_args`]) comes back with its data.
    pub fn restart_keeping_files(&mut self) -> Result<(), HarnessError> {
        self.stop();
        self.launch()
    }

    /// Where `SAVE`/`BGSAVE` write the snapshot (the server's `dir` and default `dbfilename`).
    pub fn snapshot_file(&self) -> PathBuf {
        self.dir.path().join("dump.rdb")
    }

    /// Whether the server process is running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.guard.as_mut().map(|g| g.try_wait()), Some(Ok(None)))
    }

    fn launch(&mut self) -> Result<(), HarnessError> {
        let log = self.dir.path().join("redis.log");
        // Redis appends to its log: only what this launch writes tells how it went.
        let log_start = std::fs::metadata(&log).map_or(0, |m| m.len());
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
            "--logfile".into(),
            log.display().to_string(),
        ];
        if let Some((port, files)) = &self.tls {
            args.extend([
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                files.cert.display().to_string(),
                "--tls-key-file".into(),
                files.key.display().to_string(),
                "--tls-ca-cert-file".into(),
                files.ca.display().to_string(),
                "--tls-auth-clients".into(),
                if self.client_auth { "yes" } else { "no" }.into(),
            ]);
        }
        args.extend(self.extra_args.iter().cloned());
        // The guard shell: start the server, wait for a line (`stop`) or the end of stdin,
        // then kill the server and reap it. An end without a line means this process exited
        // without dropping the server (the shared one lives in a static) or died: the
        // directory is removed too, since no `TempDir` drop will.
        let script = "\"$0\" \"$@\" </dev/null >/dev/null 2>&1 & pid=$!; read -r line; told=$?; \
            kill -9 $pid 2>/dev/null; wait $pid; [ $told -eq 0 ] || rm -rf \"$RDZV_REDIS_CLEANUP\"";
        let guard = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(&self.bin)
            .args(&args)
            .env("RDZV_REDIS_CLEANUP", self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| HarnessError(format!("cannot run sh to start {}: {e}", self.bin.display())))?;
        self.guard = Some(guard);
        let deadline = Instant::now() + READY_DEADLINE;
        while Instant::now() < deadline {
            // A `PING` alone could be answered by another test's server on a port taken
            // meanwhile; this server's own log says when it listens.
            let logged = log_since(&log, log_start);
            if logged.contains(READY) && ping(self.port) {
                return Ok(());
            }
            // The guard shell outlives a server that gave up; its log says so at once.
            if logged.contains(PORT_TAKEN) || !self.is_running() {
                self.stop();
                return Err(HarnessError(format!(
                    "redis-server ({}) on 127.0.0.1:{} gave up during start-up; its log:\n{}",
                    self.bin.display(),
                    self.port,
                    tail(&logged)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        Err(HarnessError(format!(
            "redis-server ({}) did not answer PING on 127.0.0.1:{} within {READY_DEADLINE:?}; its log:\n{}",
            self.bin.display(),
            self.port,
            tail(&log_since(&log, log_start))
        )))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn find_binary() -> Result<PathBuf, HarnessError> {
    if let Some(bin) = std::env::var_os("REDIS_SERVER_BIN") {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(HarnessError(format!("REDIS_SERVER_BIN={} is not a file", bin.display())));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            HarnessError(
                "redis-server not found on PATH (or set REDIS_SERVER_BIN): install redis-server \
                 (scripts/setup.sh) to run the Redis tests"
                    .into(),
            )
        })
}

/// `n` distinct free loopback ports outside the ephemeral range, so that a server restarted
/// on them cannot find one taken by an outgoing connection, claimed so that no other test
/// server chooses them (`rdzv_core::testing::ports`).
fn claim_ports(n: usize) -> Result<Vec<PortClaim>, HarnessError> {
    rdzv_core::testing::ports::claim_loopback_ports(n)
        .map_err(|e| HarnessError(format!("cannot find free loopback ports: {e}")))
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    // `+PONG`, or `-NOAUTH …` from a server with a password: either way it is serving.
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && (&buf == b"+PONG\r\n" || buf.starts_with(b"-NOAUTH"))
}

/// What the log at `path` holds past its first `start` bytes.
fn log_since(path: &Path, start: u64) -> String {
    read_since(path, start).unwrap_or_else(|e| format!("(no log: {e})"))
}

/// The end of a server's log, for an error message.
fn tail(text: &str) -> String {
    last_lines(text, 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port taken between choosing and binding it, here by another test's server: the
    /// new server must not take that one's answers for its own, and starts on other ports.
    #[test]
    fn a_server_whose_port_is_taken_starts_on_another_not_sharing_the_first() {
        let first = RedisServer::start().expect("redis-server");
        let mut second = RedisServer::prepare(false).expect("prepared");
        second.port = first.port();
        second.start_on_free_ports().expect("starts on other ports");
        assert_ne!(second.port(), first.port());
        assert!(log_since(&second.dir.path().join("redis.log"), 0).contains(PORT_TAKEN));
        assert!(ping(second.port()));
    }

    /// A server that gave up is reported at once, not after the start-up deadline.
    #[test]
    fn a_server_whose_port_is_taken_fails_at_once_saying_why() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let mut server = RedisServer::prepare(false).expect("prepared");
        server.port = taken.local_addr().expect("its address").port();
        let started = Instant::now();
        let err = server.launch().expect_err("its port is taken");
        assert!(started.elapsed() < READY_DEADLINE / 2, "took {:?}", started.elapsed());
        assert!(err.0.contains("gave up during start-up"), "{err}");
        assert!(err.0.contains(PORT_TAKEN), "{err}");
    }
}
