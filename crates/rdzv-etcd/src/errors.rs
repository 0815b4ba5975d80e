//! Turning `etcd-client` errors into [`KvError`]s: connection trouble is `Unavailable` (with
//! the endpoints, never credentials), deadlines are `Timeout`, etcd's own answers keep their
//! meaning (lease not found, compacted, invalid argument), everything else is `Backend` with
//! its source.

use std::error::Error as StdError;
use std::time::Duration;

use etcd_client::Error as EtcdError;
use rdzv_core::{KvError, LeaseId};

/// The backend name used in errors.
pub(crate) const BACKEND: &str = "etcd";

/// What the failed request was about, for errors that need it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Context<'a> {
    /// The endpoints, for `Unavailable`.
    pub endpoints: &'a str,
    /// The lease the request named, for `LeaseNotFound`.
    pub lease: Option<LeaseId>,
    /// The request timeout, for `Timeout`.
    pub timeout: Duration,
}

/// A request that did not answer within the context's timeout.
pub(crate) fn timeout(operation: &str, ctx: Context<'_>) -> KvError {
    KvError::Timeout {
        backend: BACKEND,
        operation: format!("{operation} at {}", ctx.endpoints),
        after: ctx.timeout,
    }
}

/// Classifies an `etcd-client` error from `operation` (a few words, e.g. "put").
pub(crate) fn classify(operation: &str, error: EtcdError, ctx: Context<'_>) -> KvError {
    match &error {
        EtcdError::GRpcStatus(status) => {
            let code = status.code() as i32;
            let message = status.message().to_string();
            let transport = is_connection_error(&describe(&error));
            classify_status(operation, code, &message, transport, error, ctx)
        }
        EtcdError::TransportError(_) | EtcdError::IoError(_) => unavailable(operation, error, ctx),
        // The request or response channel of a stream closed under us: the connection went.
        EtcdError::WatchError(_) => unavailable(operation, error, ctx),
        EtcdError::LeaseKeepAliveError(message) if message.contains("not found") => match ctx.lease {
            Some(lease) => KvError::LeaseNotFound(lease),
            None => backend(operation, error),
        },
        EtcdError::LeaseKeepAliveError(_) => unavailable(operation, error, ctx),
        EtcdError::InvalidArgs(message) => KvError::InvalidArgument(format!("etcd {operation}: {message}")),
        EtcdError::InvalidUri(_) => KvError::InvalidArgument(format!(
            "etcd endpoint is not a valid URI ({}): {}",
            ctx.endpoints,
            describe(&error)
        )),
        _ => backend(operation, error),
    }
}

/// gRPC status codes (the gRPC specification's numbers).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const ABORTED: i32 = 10;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

fn classify_status(
    operation: &str,
    status_code: i32,
    message: &str,
    transport: bool,
    error: EtcdError,
    ctx: Context<'_>,
) -> KvError {
    match status_code {
        code::NOT_FOUND if message.contains("lease not found") => match ctx.lease {
            Some(lease) => KvError::LeaseNotFound(lease),
            None => backend(operation, error),
        },
        code::DEADLINE_EXCEEDED => KvError::Timeout {
            backend: BACKEND,
            operation: format!("{operation} at {} ({message})", ctx.endpoints),
            after: ctx.timeout,
        },
        // etcd's own "request timed out", "no leader", "leader changed", "too many
        // requests" are retryable like a lost connection.
        code::UNAVAILABLE | code::RESOURCE_EXHAUSTED | code::ABORTED => unavailable(operation, error, ctx),
        // A connection torn down mid-request surfaces as Cancelled or Unknown with a
        // transport error inside.
        code::CANCELLED | code::UNKNOWN if transport => unavailable(operation, error, ctx),
        code::INVALID_ARGUMENT if message.contains("authentication failed") => KvError::Backend {
            backend: BACKEND,
            message: format!(
                "{operation}: authentication failed at {}: check the user name and password",
                ctx.endpoints
            ),
            source: Some(Box::new(error)),
        },
        // "user name is empty", "user name not found", "invalid auth token": the server has
        // auth enabled and we gave no (valid) credentials.
        code::INVALID_ARGUMENT if message.contains("user name") || message.contains("auth") => {
            KvError::Backend {
                backend: BACKEND,
                message: format!(
                    "{operation}: {message} at {}: the server requires authentication; give \
                     credentials (etcd://user:password@host/…)",
                    ctx.endpoints
                ),
                source: Some(Box::new(error)),
            }
        }
        code::INVALID_ARGUMENT | code::FAILED_PRECONDITION | code::OUT_OF_RANGE => {
            KvError::InvalidArgument(format!("etcd {operation}: {message}"))
        }
        code::PERMISSION_DENIED | code::UNAUTHENTICATED => KvError::Backend {
            backend: BACKEND,
            message: format!(
                "{operation}: {message} at {}: check the user's credentials and roles",
                ctx.endpoints
            ),
            source: Some(Box::new(error)),
        },
        _ => backend(operation, error),
    }
}

/// Whether a failure (described by [`describe`]) came from the transport (connection
/// refused, reset or closed, TLS) rather than from the server.
fn is_connection_error(description: &str) -> bool {
    let lower = description.to_lowercase();
    ["transport error", "connection", "h2 protocol error", "broken pipe", "tcp connect", "dns error"]
        .iter()
        .any(|word| lower.contains(word))
}

fn unavailable(operation: &str, error: EtcdError, ctx: Context<'_>) -> KvError {
    let detail = describe(&error);
    let lower = detail.to_lowercase();
    let hint = if ["certificate", "tls", "handshake", "alert"].iter().any(|word| lower.contains(word)) {
        " (TLS handshake failed: check cacert, cert and key, and that the server's certificate names this host)"
    } else {
        ""
    };
    KvError::Unavailable {
        backend: BACKEND,
        endpoint: ctx.endpoints.to_string(),
        message: format!("{operation} failed: {detail}{hint}"),
        source: Some(Box::new(error)),
    }
}

fn backend(operation: &str, error: EtcdError) -> KvError {
    KvError::Backend {
        backend: BACKEND,
        message: format!("{operation} failed: {}", describe(&error)),
        source: Some(Box::new(error)),
    }
}

/// Whether a request failed before anything was sent: the connection to the endpoint it
/// was routed to could not be opened. Retrying it elsewhere cannot apply it twice.
pub(crate) fn never_sent(error: &EtcdError) -> bool {
    let description = describe(error).to_lowercase();
    description.contains("tcp connect error") || description.contains("dns error")
}

/// Whether a failure means the member could not be reached or dropped the connection
/// (as opposed to an answer from it): another member may do better.
pub(crate) fn is_unreachable(error: &EtcdError) -> bool {
    match error {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => true,
        EtcdError::GRpcStatus(status) => {
            let code = status.code() as i32;
            code == code::UNAVAILABLE || is_connection_error(&describe(error))
        }
        _ => false,
    }
}

/// What went wrong, in words: for a gRPC status its message and the chain of its sources
/// (its own `Display` shows them in `Debug` form).
pub(crate) fn describe(error: &EtcdError) -> String {
    match error {
        EtcdError::GRpcStatus(status) => chain_from(status.message().to_string(), StdError::source(status)),
        other => chain(other),
    }
}

/// The error and its sources, `: `-separated, without repeats (tonic and hyper often
/// repeat their source's text).
pub(crate) fn chain(error: &(dyn StdError + 'static)) -> String {
    chain_from(error.to_string(), error.source())
}

/// `first`, then each source's text that is not already contained in what came before.
fn chain_from(first: String, mut source: Option<&(dyn StdError + 'static)>) -> String {
    let mut parts = vec![first];
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = err.source();
    }
    parts.join(": ")
}
