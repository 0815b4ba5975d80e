//! Exit codes, mapped from errors in one place: 0 success, 2 usage or configuration error,
//! 3 timeout, 4 closed, 5 backend unreachable, 1 anything else.

use std::process::ExitCode;

use rdzv::{RendezvousError, StoreError};

/// Anything not listed below.
pub const FAILURE: u8 = 1;
/// A usage or configuration error (also clap's own usage errors).
pub const CONFIG: u8 = 2;
/// A deadline passed.
pub const TIMEOUT: u8 = 3;
/// The run is closed.
pub const CLOSED: u8 = 4;
/// The backend could not be reached.
pub const UNAVAILABLE: u8 = 5;

/// An error on its way to the user: one line for stderr and the process's exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    /// The exit code.
    pub code: u8,
    /// One line, without the `rdzv: ` in front.
    pub message: String,
}

impl CliError {
    /// An error with exit code 1.
    pub fn other(message: impl Into<String>) -> Self {
        CliError { code: FAILURE, message: message.into() }
    }

    /// Prepends what was being done: `"<context>: <message>"`, same code.
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        CliError { code: self.code, message: format!("{context}: {}", self.message) }
    }
}

/// The exit code for a rendezvous error.
pub fn code_of(e: &RendezvousError) -> u8 {
    match e {
        RendezvousError::Closed { .. } => CLOSED,
        RendezvousError::Timeout { .. } => TIMEOUT,
        RendezvousError::Unavailable(_) => UNAVAILABLE,
        RendezvousError::Config(_) => CONFIG,
        RendezvousError::State { .. }
        | RendezvousError::LeaseLost
        | RendezvousError::Shutdown
        | RendezvousError::Backend(_)
        | RendezvousError::Internal(_) => FAILURE,
        // The enum is non-exhaustive: anything new is "anything else".
        _ => FAILURE,
    }
}

impl From<RendezvousError> for CliError {
    fn from(e: RendezvousError) -> Self {
        CliError { code: code_of(&e), message: one_line(&e.to_string()) }
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        let code = match &e {
            StoreError::Timeout { .. } => TIMEOUT,
            StoreError::Backend(kv) if kv.is_retryable() => UNAVAILABLE,
            _ => FAILURE,
        };
        CliError { code, message: one_line(&e.to_string()) }
    }
}

/// Writes `rdzv: <message>` on stderr and returns the exit code.
pub fn report(e: &CliError) -> ExitCode {
    eprintln!("rdzv: {}", one_line(&e.message));
    ExitCode::from(e.code)
}

/// Messages are one line: inner line breaks become `; `.
pub fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdzv::ConfigError;
    use rdzv_core::KvError;

    use super::*;

    fn unavailable() -> KvError {
        KvError::Unavailable {
            backend: "etcd",
            endpoint: "h:1".into(),
            message: "refused".into(),
            source: None,
        }
    }

    #[test]
    fn each_variant_has_its_code() {
        let cases = [
            (RendezvousError::Closed { run_id: "r".into(), outcome: None }, CLOSED),
            (
                RendezvousError::Timeout {
                    run_id: "r".into(),
                    phase: "joining".into(),
                    after: Duration::from_secs(1),
                },
                TIMEOUT,
            ),
            (RendezvousError::Unavailable(unavailable()), UNAVAILABLE),
            (RendezvousError::Config(ConfigError::MissingOption("min_workers".into())), CONFIG),
            (RendezvousError::State { key: "k".into(), reason: "bad".into() }, FAILURE),
            (RendezvousError::LeaseLost, FAILURE),
            (RendezvousError::Shutdown, FAILURE),
            (RendezvousError::Backend(KvError::backend("etcd", "boom")), FAILURE),
            (RendezvousError::Internal("a bug".into()), FAILURE),
        ];
        for (e, code) in cases {
            let cli = CliError::from(e);
            assert_eq!(cli.code, code, "{cli:?}");
            assert!(!cli.message.contains('\n'));
        }
    }

    #[test]
    fn store_errors_map_too() {
        let timeout = StoreError::Timeout {
            operation: "get",
            keys: vec![b"k".to_vec()],
            after: Duration::from_secs(1),
        };
        assert_eq!(CliError::from(timeout).code, TIMEOUT);
        assert_eq!(CliError::from(StoreError::Backend(unavailable())).code, UNAVAILABLE);
        assert_eq!(CliError::from(StoreError::InvalidArgument("x".into())).code, FAILURE);
    }

    #[test]
    fn messages_become_one_line() {
        assert_eq!(one_line("a\n  b\n\nc"), "a; b; c");
        assert_eq!(CliError::other("x").context("joining").message, "joining: x");
    }
}
