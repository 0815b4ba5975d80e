//! Termination signals received (SIGINT, SIGTERM, SIGHUP, SIGQUIT), notices to pass on
//! (SIGUSR1, SIGUSR2), "stdin closed", and signals sent to process groups — through
//! `rustix`'s safe system-call wrappers, never by running the `kill` program (absent from
//! minimal images, and its failures went unseen).

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

/// A notice received, for the workers: Slurm's `--signal` warns of a job's end with one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// SIGUSR1.
    Usr1,
    /// SIGUSR2.
    Usr2,
}

impl Notice {
    /// The signal's name (`SIGUSR1`, `SIGUSR2`).
    pub fn name(self) -> &'static str {
        match self {
            Notice::Usr1 => "SIGUSR1",
            Notice::Usr2 => "SIGUSR2",
        }
    }

    /// The signal to pass on.
    pub fn signal(self) -> Sig {
        match self {
            Notice::Usr1 => Sig::USR1,
            Notice::Usr2 => Sig::USR2,
        }
    }
}

/// What [`Signals::recv_or_notice`] caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caught {
    /// A termination signal.
    End(Received),
    /// A notice, to pass on to the workers.
    Notice(Notice),
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, caught from creation on (so they no longer end this
/// process); with [`Signals::catch_with_notices`], SIGUSR1 and SIGUSR2 too.
pub struct Signals {
    termination: Termination,
    notices: Option<Notices>,
}

impl Signals {
    /// Starts catching the four termination signals.
    pub fn catch() -> std::io::Result<Signals> {
        Ok(Signals { termination: Termination::catch()?, notices: None })
    }

    /// Starts catching the four termination signals, and SIGUSR1 and SIGUSR2 as notices for
    /// the workers ([`Signals::recv_or_notice`]).
    pub fn catch_with_notices() -> std::io::Result<Signals> {
        Ok(Signals { termination: Termination::catch()?, notices: Some(Notices::catch()?) })
    }

    /// The next termination signal.
    pub async fn recv(&mut self) -> Received {
        self.termination.recv().await
    }

    /// The next termination signal or notice, a termination signal first when both came.
    pub async fn recv_or_notice(&mut self) -> Caught {
        let notice = async {
            match self.notices.as_mut() {
                Some(notices) => notices.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            signal = self.termination.recv() => Caught::End(signal),
            notice = notice => Caught::Notice(notice),
        }
    }

    /// The notices received while nobody listened (no workers ran), taken so that they are
    /// not passed on to workers started later, before these could catch them.
    pub fn stale_notices(&mut self) -> Vec<Notice> {
        self.notices.as_mut().map(Notices::stale).unwrap_or_default()
    }
}

/// The four termination signals.
struct Termination {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
}

impl Termination {
    fn catch() -> std::io::Result<Termination> {
        Ok(Termination {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    async fn recv(&mut self) -> Received {
        tokio::select! {
            _ = self.interrupt.recv() => Received::Interrupt,
            _ = self.terminate.recv() => Received::Terminate,
            _ = self.hangup.recv() => Received::Hangup,
            _ = self.quit.recv() => Received::Quit,
        }
    }
}

/// SIGUSR1 and SIGUSR2.
struct Notices {
    usr1: Signal,
    usr2: Signal,
}

impl Notices {
    fn catch() -> std::io::Result<Notices> {
        Ok(Notices { usr1: signal(SignalKind::user_defined1())?, usr2: signal(SignalKind::user_defined2())? })
    }

    async fn recv(&mut self) -> Notice {
        tokio::select! {
            _ = self.usr1.recv() => Notice::Usr1,
            _ = self.usr2.recv() => Notice::Usr2,
        }
    }

    /// Those already received, without waiting.
    fn stale(&mut self) -> Vec<Notice> {
        let mut stale = Vec::new();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for (caught, notice) in [(&mut self.usr1, Notice::Usr1), (&mut self.usr2, Notice::Usr2)] {
            while let std::task::Poll::Ready(Some(())) = caught.poll_recv(&mut cx) {
                stale.push(notice);
            }
        }
        stale
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
