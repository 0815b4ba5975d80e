//! Termination signals received (SIGINT, SIGTERM, SIGHUP, SIGQUIT), "stdin closed", and
//! signals sent to process groups — through `rustix`'s safe system-call wrappers, never by
//! running the `kill` program (absent from minimal images, and its failures went unseen).

use rustix::process::{Pid, Signal as Sig};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// A termination signal received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGHUP (the terminal or the session went away).
    Hangup,
    /// SIGQUIT.
    Quit,
}

impl Received {
    /// The signal's short name (`INT`, `TERM`, `HUP`, `QUIT`).
    pub fn name(self) -> &'static str {
        match self {
            Received::Interrupt => "INT",
            Received::Terminate => "TERM",
            Received::Hangup => "HUP",
            Received::Quit => "QUIT",
        }
    }

    /// The conventional exit code of a process ended by this signal (128 + number).
    pub fn exit_code(self) -> u8 {
        match self {
            Received::Interrupt => 130,
            Received::Terminate => 143,
            Received::Hangup => 129,
            Received::Quit => 131,
        }
    }

    /// The signal passed on to the workers: SIGINT stays SIGINT (Python turns it into
    /// `KeyboardInterrupt`); SIGHUP and SIGQUIT are handled like SIGTERM, since SIGQUIT
    /// would make every worker dump core and SIGHUP is often ignored.
    pub fn forwarded(self) -> Sig {
        match self {
            Received::Interrupt => Sig::INT,
            Received::Terminate | Received::Hangup | Received::Quit => Sig::TERM,
        }
    }
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, caught from creation on (so they no longer end this
/// process).
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
}

impl Signals {
    /// Starts catching the four signals.
    pub fn catch() -> std::io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal.
    pub async fn recv(&mut self) -> Received {
        tokio::select! {
            _ = self.interrupt.recv() => Received::Interrupt,
            _ = self.terminate.recv() => Received::Terminate,
            _ = self.hangup.recv() => Received::Hangup,
            _ = self.quit.recv() => Received::Quit,
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

/// Sends `signal` to every process of the process group `pgid`. A group that no longer
/// exists is not an error (`Ok(false)`): the caller stops what may already be gone.
/// Other errors (no permission) are returned.
pub fn signal_group(pgid: u32, signal: Sig) -> std::io::Result<bool> {
    let Some(pid) = i32::try_from(pgid).ok().and_then(Pid::from_raw) else {
        return Err(std::io::Error::other(format!("{pgid} is not a process group id")));
    };
    match rustix::process::kill_process_group(pid, signal) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hangup_and_quit_are_forwarded_as_terminate() {
        assert_eq!(Received::Hangup.forwarded(), Sig::TERM);
        assert_eq!(Received::Quit.forwarded(), Sig::TERM);
        assert_eq!(Received::Interrupt.forwarded(), Sig::INT);
        assert_eq!(Received::Quit.exit_code(), 131);
    }

    #[test]
    fn a_gone_group_is_no_error() {
        // Process id 0 is never a group; a huge id is not one either on Linux (pid_max is
        // at most 2^22).
        assert!(signal_group(0, Sig::TERM).is_err());
        assert_eq!(signal_group(1 << 30, Sig::TERM).ok(), Some(false));
    }
}
