//! Turning `etcd-client` errors into [`KvError`]s, by error type and gRPC status code —
//! never by message alone, so that a reworded message cannot turn a retryable failure into
//! a final one (or stop member failover).
//!
//! First, where a failure came from, by type:
//!
//! | what | how it is recognised | becomes |
//! |---|---|---|
//! | no connection could be opened (refused, DNS, TLS handshake) | a [`tonic::ConnectError`] in the status' source chain | `Unavailable`; the request was never sent |
//! | the connection broke during the request (reset, closed, HTTP/2 error) | a status with a source error: tonic makes those from local I/O errors, while a status the server sent is decoded from its trailers and has no source | `Unavailable` |
//! | a client-side request timeout | a [`tonic::TimeoutExpired`] in the chain | `Timeout` |
//! | a stream's channel closed (watch, keep-alive) | `etcd_client::Error::WatchError` / `LeaseKeepAliveError` | `Unavailable` |
//! | transport or I/O error outside a status | `TransportError` / `IoError` | `Unavailable` |
//!
//! Then an answer from the server (a status without source), by code — etcd's codes are
//! stable API (`api/v3rpc/rpctypes`):
//!
//! | code | etcd's meanings | becomes |
//! |---|---|---|
//! | `Unavailable` | no leader, leader changed, request timed out, server stopped, unhealthy | `Busy`: it passes by itself, so it is retried even at the first contact |
//! | `Cancelled`, `Aborted` | the server gave up on the request | `Unavailable` |
//! | `ResourceExhausted` | too many requests; database space exceeded | `Busy` (¹) |
//! | `DeadlineExceeded` | deadline exceeded | `Timeout` |
//! | `NotFound` | lease not found (the only `NotFound` a key-value request can get) | `LeaseNotFound` with the request's lease, else `Backend` |
//! | `Unauthenticated` | invalid auth token; credentials refused at login | `Backend`: check user and password |
//! | `PermissionDenied` | the user's roles do not cover the keys | `Backend`: check the user's roles |
//! | `InvalidArgument`, `FailedPrecondition`, `OutOfRange` | empty key, request too large, compacted or future revision… | `InvalidArgument` (²) |
//! | `Unknown` whose message says "too many requests" | etcd 3.4's overloaded raft (³) | `Busy` |
//! | anything else | | `Backend` |
//!
//! Messages are only a second signal, to give a better hint where etcd uses one code for
//! several things; each falls back to the code's class when the message is reworded, and
//! none makes a failure retryable:
//! (¹) `ResourceExhausted` whose message says a message was larger than the server's
//! maximum is a too-large request (`InvalidArgument`, not worth retrying), and one that
//! says the database space is exceeded needs the operator (`Unavailable`, with the hint);
//! (²) `InvalidArgument` whose message is about the user name or auth (etcd answers
//! "user name is empty" to a request without credentials) becomes `Backend` with a hint to
//! give credentials; "request is too large" gets a hint about `max_request_bytes`.
//! (³) The one exception to "no message makes a failure retryable": etcd 3.4 answers a
//! request its raft cannot take now ("etcdserver: too many requests", thousands of sessions
//! starting at once) with code `Unknown` (its status mapping lacks that error), and this
//! passes by itself like the same words under `ResourceExhausted`.

use std::error::Error as StdError;
use std::time::Duration;

use etcd_client::Error as EtcdError;
use rdzv_core::KvError;
use rdzv_core::kv::LeaseId;
use tonic::{Code, Status};

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

/// Where a gRPC status came from, decided by the types in its source chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// No connection could be opened: the request was never sent.
    NotConnected,
    /// The client gave up waiting (tonic's own request timeout).
    ClientTimeout,
    /// The connection failed during the request (it may or may not have been applied).
    Transport,
    /// The server answered with this status.
    Server,
}

fn origin(status: &Status) -> Origin {
    // tonic attaches a source only to statuses it makes from local errors; one decoded
    // from the server's trailers has none.
    let Some(source) = StdError::source(status) else {
        return Origin::Server;
    };
    if find::<tonic::ConnectError>(source).is_some() {
        Origin::NotConnected
    } else if find::<tonic::TimeoutExpired>(source).is_some() {
        Origin::ClientTimeout
    } else {
        Origin::Transport
    }
}

/// The first error of type `T` in `error`'s source chain, looking inside I/O errors too
/// (an `io::Error`'s `source()` skips the error it wraps).
fn find<'a, T: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(inner) = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref())
            && let Some(found) = find::<T>(inner)
        {
            return Some(found);
        }
        current = err.source();
    }
    None
}

/// The code of a status the server sent (`None` for local failures and other errors).
pub(crate) fn server_code(error: &EtcdError) -> Option<Code> {
    match error {
        EtcdError::GRpcStatus(status) if origin(status) == Origin::Server => Some(status.code()),
        _ => None,
    }
}

/// Classifies an `etcd-client` error from `operation` (a few words, e.g. "put").
pub(crate) fn classify(operation: &str, error: EtcdError, ctx: Context<'_>) -> KvError {
    match &error {
        EtcdError::GRpcStatus(status) => match origin(status) {
            Origin::NotConnected | Origin::Transport => unavailable(operation, error, ctx),
            Origin::ClientTimeout => timeout(operation, ctx),
            Origin::Server => {
                let (code, message) = (status.code(), status.message().to_string());
                classify_answer(operation, code, &message, error, ctx)
            }
        },
        EtcdError::TransportError(_) | EtcdError::IoError(_) => unavailable(operation, error, ctx),
        // The request or response channel of a stream closed under us: the stream is gone
        // (a lease that is not found is reported as a `NotFound` status by the backend).
        EtcdError::WatchError(_) | EtcdError::LeaseKeepAliveError(_) => unavailable(operation, error, ctx),
        EtcdError::InvalidArgs(message) => KvError::InvalidArgument(format!("etcd {operation}: {message}")),
        EtcdError::InvalidUri(_) => KvError::InvalidArgument(format!(
            "etcd endpoint is not a valid URI ({}): {}",
            ctx.endpoints,
            describe(&error)
        )),
        _ => backend(operation, error),
    }
}

/// Second signals: words of etcd's and gRPC's messages that refine a code's meaning. Each
/// only picks a better hint within the code's class (see the module documentation).
mod signals {
    /// gRPC's "received message larger than max (N vs. M)".
    pub fn message_too_large(message: &str) -> bool {
        message.contains("larger than max")
    }

    /// etcd's "request is too large".
    pub fn request_too_large(message: &str) -> bool {
        message.contains("too large")
    }

    /// etcd's "too many requests" (its raft log is too far ahead of what it applied).
    pub fn too_many_requests(message: &str) -> bool {
        message.contains("too many requests")
    }

    /// etcd's "database space exceeded" (the NOSPACE alarm).
    pub fn no_space(message: &str) -> bool {
        message.contains("space exceeded")
    }

    /// etcd's "user name is empty", "user name not found", "invalid auth token"...
    pub fn about_credentials(message: &str) -> bool {
        message.contains("user name") || message.contains("auth")
    }
}

/// The hint given with a request the server refused as too large.
const TOO_LARGE_HINT: &str = "the request is larger than the server accepts: store less, or if the \
    server's --max-request-bytes was raised, set the option max_request_bytes to the same value";

/// The hint given when the server's database is full.
const NO_SPACE_HINT: &str = "the etcd database reached its quota (--quota-backend-bytes): \
    the operator must compact and defragment it and disarm the NOSPACE alarm \
    (`etcdctl alarm disarm`)";

/// An answer from the server, by its code (`message` only refines the hint).
fn classify_answer(
    operation: &str,
    code: Code,
    message: &str,
    error: EtcdError,
    ctx: Context<'_>,
) -> KvError {
    match code {
        Code::Unavailable => busy(operation, error, ctx),
        Code::Cancelled | Code::Aborted => unavailable(operation, error, ctx),
        Code::ResourceExhausted if signals::message_too_large(message) => {
            KvError::InvalidArgument(format!("etcd {operation}: {message}: {TOO_LARGE_HINT}"))
        }
        // "database space exceeded" needs the operator (compact, defragment, disarm the
        // alarm), and then passes too.
        Code::ResourceExhausted if signals::no_space(message) => KvError::Unavailable {
            backend: BACKEND,
            endpoint: ctx.endpoints.to_string(),
            message: format!("{operation} failed: {message}: {NO_SPACE_HINT}"),
            source: Some(Box::new(error)),
        },
        // "too many requests" passes.
        Code::ResourceExhausted => busy(operation, error, ctx),
        Code::DeadlineExceeded => KvError::Timeout {
            backend: BACKEND,
            operation: format!("{operation} at {} ({message})", ctx.endpoints),
            after: ctx.timeout,
        },
        Code::NotFound => match ctx.lease {
            Some(lease) => KvError::LeaseNotFound(lease),
            None => backend(operation, error),
        },
        Code::Unauthenticated => KvError::Backend {
            backend: BACKEND,
            message: format!(
                "{operation}: authentication failed at {} ({message}): check the user name and \
                 password, and that the server has authentication enabled",
                ctx.endpoints
            ),
            source: Some(Box::new(error)),
        },
        Code::PermissionDenied => KvError::Backend {
            backend: BACKEND,
            message: format!(
                "{operation}: permission denied at {} ({message}): the user's roles must grant \
                 read and write on every key under rdzv's key prefix (parameter `prefix`, \
                 default /torchelastic/p2p; see docs/ETCD.md, RBAC)",
                ctx.endpoints
            ),
            source: Some(Box::new(error)),
        },
        Code::InvalidArgument if signals::about_credentials(message) => KvError::Backend {
            backend: BACKEND,
            message: format!(
                "{operation}: {message} at {}: the server requires authentication; give \
                 credentials (etcd://user:password@host/…)",
                ctx.endpoints
            ),
            source: Some(Box::new(error)),
        },
        Code::InvalidArgument if signals::request_too_large(message) => {
            KvError::InvalidArgument(format!("etcd {operation}: {message}: {TOO_LARGE_HINT}"))
        }
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            KvError::InvalidArgument(format!("etcd {operation}: {message}"))
        }
        // etcd 3.4 sends its raft backlog's "too many requests" (thousands of sessions
        // arriving at once) as `Unknown`, without a code of its own.
        Code::Unknown if signals::too_many_requests(message) => busy(operation, error, ctx),
        _ => backend(operation, error),
    }
}

/// The answer a refused login becomes: [`Code::Unauthenticated`], whatever code etcd used
/// (`InvalidArgument` for a wrong password, `FailedPrecondition` when auth is off). Only for
/// errors of the login itself (connecting with credentials makes no other request); a
/// retryable failure of the login stays as it is.
/// The error etcd put in a lease grant's answer (its `error` field, not a gRPC status): an
/// overloaded or leaderless server ("too many requests", "timed out", "no leader", "leader
/// changed") is `Busy`, as the same words in a status are; anything else is final.
pub(crate) fn grant_answer(message: &str, endpoints: &str) -> KvError {
    const PASSING: [&str; 5] = ["too many requests", "timed out", "no leader", "leader changed", "unhealthy"];
    if PASSING.iter().any(|w| message.contains(w)) {
        KvError::Busy {
            backend: BACKEND,
            endpoint: endpoints.to_string(),
            message: format!("lease_grant failed: {message}"),
            source: None,
        }
    } else {
        KvError::backend(BACKEND, format!("lease_grant failed: {message}"))
    }
}

pub(crate) fn login_refused(error: EtcdError) -> EtcdError {
    match server_code(&error) {
        Some(Code::InvalidArgument | Code::FailedPrecondition | Code::PermissionDenied | Code::NotFound) => {
            let message = match &error {
                EtcdError::GRpcStatus(status) => status.message().to_string(),
                other => other.to_string(),
            };
            EtcdError::GRpcStatus(Status::unauthenticated(message))
        }
        _ => error,
    }
}

/// The error a keep-alive answer with TTL 0 (etcd's "no such lease") becomes: `NotFound`,
/// like etcd's own answer to other requests about a missing lease.
pub(crate) fn lease_not_found() -> EtcdError {
    EtcdError::GRpcStatus(Status::not_found("the keep-alive answered TTL 0: lease not found"))
}

/// A server's answer that it cannot serve now (no leader, overloaded, timed out inside the
/// cluster).
fn busy(operation: &str, error: EtcdError, ctx: Context<'_>) -> KvError {
    KvError::Busy {
        backend: BACKEND,
        endpoint: ctx.endpoints.to_string(),
        message: format!("{operation} failed: {}", describe(&error)),
        source: Some(Box::new(error)),
    }
}

fn unavailable(operation: &str, error: EtcdError, ctx: Context<'_>) -> KvError {
    let detail = describe(&error);
    let hint = tls_hint(&error).unwrap_or_default();
    KvError::Unavailable {
        backend: BACKEND,
        endpoint: ctx.endpoints.to_string(),
        message: format!("{operation} failed: {detail}{hint}"),
        source: Some(Box::new(error)),
    }
}

/// What to do about a TLS failure, recognised by the TLS library's error type.
fn tls_hint(error: &EtcdError) -> Option<&'static str> {
    let source: &(dyn StdError + 'static) = match error {
        EtcdError::GRpcStatus(status) => StdError::source(status)?,
        EtcdError::TransportError(e) => e,
        EtcdError::IoError(e) => e,
        _ => return None,
    };
    let tls = find::<rustls::Error>(source)?;
    Some(match tls {
        rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
        | rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. }) => {
            " (TLS: the server's certificate is not issued for the name connected to; if it is \
             issued for another name, give that name as tls_server_name=<name>)"
        }
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer) => {
            " (TLS: the server's certificate is signed by a CA that is not trusted: give the CA \
             as cacert=<ca.pem>; without cacert, only the system's CA store is trusted)"
        }
        rustls::Error::InvalidCertificate(_) => {
            " (TLS: the server's certificate was refused: check cacert and the certificate's \
             names and dates)"
        }
        _ => {
            " (TLS handshake failed: check cacert, cert and key, and that the server's \
             certificate names this host)"
        }
    })
}

/// Whether the TLS library refused the connection (a TLS error type in the chain).
pub(crate) fn is_tls_failure(error: &EtcdError) -> bool {
    tls_hint(error).is_some()
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
    matches!(error, EtcdError::GRpcStatus(status) if origin(status) == Origin::NotConnected)
}

/// Whether a failure means the member could not be reached, dropped the connection, or
/// cannot serve (no leader…) — as opposed to an answer about the request: another member
/// may do better.
pub(crate) fn is_unreachable(error: &EtcdError) -> bool {
    match error {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => true,
        EtcdError::GRpcStatus(status) => match origin(status) {
            Origin::NotConnected | Origin::Transport => true,
            Origin::ClientTimeout => false,
            Origin::Server => status.code() == Code::Unavailable,
        },
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

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    const LEASE: LeaseId = 0x1234;

    fn ctx(lease: Option<LeaseId>) -> Context<'static> {
        Context { endpoints: "http://10.0.0.1:2379", lease, timeout: Duration::from_secs(3) }
    }

    /// A status as the server sends it: decoded from trailers, without a source.
    fn answer(code: Code, message: &str) -> EtcdError {
        EtcdError::GRpcStatus(Status::new(code, message))
    }

    /// A status as tonic makes it from a local error (it walks the chain like for a real
    /// failed request).
    fn local(error: impl StdError + Send + Sync + 'static) -> EtcdError {
        EtcdError::GRpcStatus(Status::from_error(Box::new(error)))
    }

    fn refused() -> EtcdError {
        local(tonic::ConnectError(Box::new(io::Error::from(io::ErrorKind::ConnectionRefused))))
    }

    fn classified(error: EtcdError, lease: Option<LeaseId>) -> KvError {
        classify("put", error, ctx(lease))
    }

    #[test]
    fn server_statuses_are_classified_by_code_whatever_their_message() {
        for message in ["etcdserver: no leader", "etcdserver: leader changed", "reworded: nobody leads"] {
            let err = classified(answer(Code::Unavailable, message), None);
            assert!(matches!(err, KvError::Busy { .. }), "{message}: {err:?}");
            assert!(err.to_string().contains(message), "{err}");
            assert!(is_unreachable(&answer(Code::Unavailable, message)), "fails over: {message}");
            assert!(!never_sent(&answer(Code::Unavailable, message)), "it was sent: {message}");
        }
        // etcd may answer a lease grant with its error in the response instead of a status.
        assert!(grant_answer("etcdserver: too many requests", "h:1").is_busy());
        assert!(grant_answer("etcdserver: request timed out", "h:1").is_busy());
        assert!(!grant_answer("etcdserver: lease already exists", "h:1").is_retryable());
        for code in [Code::Cancelled, Code::Aborted, Code::ResourceExhausted] {
            let err = classified(answer(code, "etcdserver: too many requests, or anything"), None);
            assert!(err.is_retryable(), "{code:?}: {err:?}");
        }
        let err = classified(answer(Code::ResourceExhausted, "etcdserver: too many requests"), None);
        assert!(err.is_busy(), "{err:?}");
        let err =
            classified(answer(Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded"), None);
        assert!(err.is_retryable() && !err.is_busy(), "{err:?}");
        assert!(err.to_string().contains("alarm disarm"), "{err}");
        let err = classified(answer(Code::DeadlineExceeded, "whatever"), None);
        assert!(matches!(err, KvError::Timeout { after, .. } if after == Duration::from_secs(3)), "{err:?}");
        for message in ["etcdserver: requested lease not found", "lease gone (reworded)"] {
            let err = classified(answer(Code::NotFound, message), Some(LEASE));
            assert!(matches!(err, KvError::LeaseNotFound(LEASE)), "{message}: {err:?}");
        }
        let err = classified(answer(Code::NotFound, "etcdserver: member not found"), None);
        assert!(matches!(err, KvError::Backend { .. }), "no lease asked about: {err:?}");
        for message in ["etcdserver: required revision has been compacted", "etcdserver: future revision"] {
            let err = classified(answer(Code::OutOfRange, message), None);
            assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
            assert!(!is_unreachable(&answer(Code::OutOfRange, message)));
        }
        let err = classified(answer(Code::FailedPrecondition, "etcdserver: something"), None);
        assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
        let err = classified(answer(Code::Internal, "etcdserver: corrupt"), None);
        assert!(matches!(err, KvError::Backend { .. }), "{err:?}");
        let err = classified(answer(Code::Unknown, "no source, so from the server"), None);
        assert!(matches!(err, KvError::Backend { .. }), "{err:?}");
        // etcd 3.4's overloaded raft, as 8,192 sessions starting at once meet it.
        let err = classified(answer(Code::Unknown, "etcdserver: too many requests"), None);
        assert!(err.is_busy(), "{err:?}");
    }

    #[test]
    fn auth_and_permission_answers_say_what_to_check() {
        let err = classified(answer(Code::PermissionDenied, "etcdserver: permission denied"), None);
        assert!(matches!(err, KvError::Backend { .. }), "{err:?}");
        assert!(err.to_string().contains("permission denied") && err.to_string().contains("roles"), "{err}");
        let err = classified(answer(Code::Unauthenticated, "etcdserver: invalid auth token"), None);
        assert!(err.to_string().contains("authentication failed"), "{err}");
        // A refused login, whatever code etcd gave it.
        for code in [Code::InvalidArgument, Code::FailedPrecondition] {
            let err = classified(login_refused(answer(code, "etcdserver: authentication failed")), None);
            assert!(matches!(err, KvError::Backend { .. }), "{err:?}");
            assert!(err.to_string().contains("authentication failed"), "{err}");
            assert!(err.to_string().contains("check the user name and password"), "{err}");
        }
        // A login that could not be sent or found no leader stays retryable.
        assert!(classified(login_refused(refused()), None).is_retryable());
        assert!(classified(login_refused(answer(Code::Unavailable, "no leader")), None).is_retryable());
        // Second signal: a request without credentials to a server with auth.
        let err = classified(answer(Code::InvalidArgument, "etcdserver: user name is empty"), None);
        assert!(err.to_string().contains("give credentials"), "{err}");
        // Reworded, it is still a final InvalidArgument with the server's words.
        let err = classified(answer(Code::InvalidArgument, "etcdserver: who are you?"), None);
        assert!(matches!(err, KvError::InvalidArgument(ref m) if m.contains("who are you")), "{err:?}");
    }

    #[test]
    fn too_large_requests_are_final_and_name_the_option() {
        let err = classified(answer(Code::InvalidArgument, "etcdserver: request is too large"), None);
        assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
        assert!(err.to_string().contains("max_request_bytes"), "{err}");
        let grpc = "grpc: received message larger than max (2200010 vs. 2097152)";
        let err = classified(answer(Code::ResourceExhausted, grpc), None);
        assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
        assert!(err.to_string().contains("max_request_bytes"), "{err}");
    }

    #[test]
    fn local_failures_are_classified_by_type() {
        // Could not connect: unavailable, never sent, fail over.
        let err = refused();
        assert!(never_sent(&err) && is_unreachable(&err));
        assert!(matches!(classified(err, None), KvError::Unavailable { .. }));
        // The connection broke mid-request: tonic makes Unknown or Cancelled statuses with
        // the I/O error inside; unavailable, may have been applied.
        for error in [io::ErrorKind::BrokenPipe, io::ErrorKind::ConnectionReset] {
            let err = local(io::Error::new(error, "stream closed"));
            assert!(is_unreachable(&err) && !never_sent(&err), "{err:?}");
            let classified = classified(err, None);
            assert!(matches!(classified, KvError::Unavailable { .. }), "{classified:?}");
        }
        let err = EtcdError::GRpcStatus(Status::from_error(Box::new(tonic::TimeoutExpired(()))));
        assert!(matches!(classified(err, None), KvError::Timeout { .. }));
        for err in [
            EtcdError::WatchError("channel closed".into()),
            EtcdError::LeaseKeepAliveError("channel closed".into()),
            EtcdError::IoError(io::Error::from(io::ErrorKind::ConnectionAborted)),
        ] {
            assert!(classified(err, Some(LEASE)).is_retryable());
        }
        let err = classified(lease_not_found(), Some(LEASE));
        assert!(matches!(err, KvError::LeaseNotFound(LEASE)), "{err:?}");
        let err = classified(EtcdError::InvalidArgs("empty endpoints".into()), None);
        assert!(matches!(err, KvError::InvalidArgument(_)), "{err:?}");
    }

    #[test]
    fn tls_failures_are_recognised_by_type() {
        let bad_cert = |error: rustls::CertificateError| {
            local(tonic::ConnectError(Box::new(io::Error::new(
                io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(error),
            ))))
        };
        let err = classified(bad_cert(rustls::CertificateError::NotValidForName), None);
        assert!(matches!(err, KvError::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("tls_server_name="), "{err}");
        let err = classified(bad_cert(rustls::CertificateError::UnknownIssuer), None);
        assert!(err.to_string().contains("cacert="), "{err}");
        assert!(err.to_string().contains("system's CA store"), "{err}");
        let err = classified(refused(), None);
        assert!(!err.to_string().contains("TLS"), "no TLS hint without a TLS error: {err}");
    }
}
