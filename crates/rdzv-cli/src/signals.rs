//! SIGINT/SIGTERM reception, "stdin closed", and sending signals to children (through
//! `kill(1)`, since the workspace forbids `unsafe` and so `libc::kill`).

use tokio::io::AsyncReadExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// A termination signal received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
}

impl Received {
    /// The name `kill -s` takes.
    pub fn name(self) -> &'static str {
        match self {
            Received::Interrupt => "INT",
            Received::Terminate => "TERM",
        }
    }

    /// The conventional exit code of a process ended by this signal (128 + number).
    pub fn exit_code(self) -> u8 {
        match self {
            Received::Interrupt => 130,
            Received::Terminate => 143,
        }
    }
}

/// SIGINT and SIGTERM, caught from creation on (so they no longer kill this process).
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    /// Starts catching SIGINT and SIGTERM.
    pub fn catch() -> std::io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The next signal.
    pub async fn recv(&mut self) -> Received {
        tokio::select! {
            _ = self.interrupt.recv() => Received::Interrupt,
            _ = self.terminate.recv() => Received::Terminate,
        }
    }
}

/// Resolves when stdin reaches its end (or cannot be read: a closed or absent stdin counts
/// as closed). Whatever is read is discarded.
pub async fn stdin_closed() {
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 1024];
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// Sends signal `name` (`TERM`, `KILL`, `INT`) to the process group `pgid`. Errors (the
/// group is already gone) are ignored: the caller waits for the child either way.
pub async fn signal_group(pgid: u32, name: &str) {
    let status = tokio::process::Command::new("kill")
        .args(["-s", name, "--", &format!("-{pgid}")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    tracing::debug!(pgid, name, ?status, "signal sent");
}
