//! Errors, one enum per layer: [`KvError`] for backends, [`ConfigError`] for URLs and
//! parameters, [`RendezvousError`] for the rendezvous.

use std::time::Duration;

use crate::kv::{LeaseId, Revision};

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error of a backend operation (see docs/KV.md). A failed precondition is not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// The server could not be reached or dropped the connection. Retryable.
    #[error("{backend} at {endpoint} is unavailable: {message}; check that the server runs and is reachable")]
    Unavailable {
        /// Backend name.
        backend: &'static str,
        /// The endpoint(s) tried, without credentials.
        endpoint: String,
        /// What went wrong.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The server answered, but cannot serve now: it has no leader (an election is under
    /// way), is overloaded ("too many requests"), or a request timed out inside the cluster
    /// (a leader failed). Retryable, and unlike [`KvError::Unavailable`] worth retrying
    /// even at the first contact, where a server that cannot be reached fails at once: it
    /// passes by itself ([`retry_while_busy`](crate::retry::retry_while_busy)).
    #[error(
        "{backend} at {endpoint} cannot serve now: {message}; this passes by itself (a leader election, an overload): retry, and if it lasts, check the cluster's health"
    )]
    Busy {
        /// Backend name.
        backend: &'static str,
        /// The endpoint(s) tried, without credentials.
        endpoint: String,
        /// What the server said.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The operation did not complete in time. Retryable.
    #[error("{backend}: {operation} timed out after {after:?}")]
    Timeout {
        /// Backend name.
        backend: &'static str,
        /// What was being done.
        operation: String,
        /// How long was waited.
        after: Duration,
    },
    /// A watch stopped delivering events without an error of its own (the connection
    /// dropped, or the server cancelled it). Retryable: read again, then watch from the
    /// read's revision + 1 ([`KvExt::watch_from`](crate::KvExt::watch_from) returns it).
    #[error("{backend}: the watch of `{key}` ended; read again and watch from the read's revision")]
    WatchEnded {
        /// Backend name.
        backend: &'static str,
        /// The watched key or prefix, as text.
        key: String,
    },
    /// The lease does not exist (expired or revoked).
    #[error("lease {0:#x} not found: it expired or was revoked")]
    LeaseNotFound(LeaseId),
    /// The requested revision was compacted away; re-read, then watch from `oldest` or later.
    #[error("revision {requested} is compacted; the oldest available revision is {oldest}")]
    Compacted {
        /// The revision that was asked for.
        requested: Revision,
        /// The oldest revision still available.
        oldest: Revision,
    },
    /// The arguments were not valid for this backend (empty prefix, bad TTL, too large…).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A key, value or request is larger than the backend accepts; nothing was sent.
    #[error(
        "{backend}: {what} is {size} bytes, more than the limit of {limit} bytes; store less{}",
        raise_hint(*.raise)
    )]
    TooLarge {
        /// Backend name.
        backend: &'static str,
        /// What is too large (`"a key"`, `"a value"`, `"a request"`).
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
        /// How this limit can be raised, if it can (`None`: it is fixed); named in the
        /// message, so that it never points at an option the backend lacks.
        raise: Option<&'static str>,
    },
    /// The backend lacks this capability.
    #[error("the {backend} backend does not support {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The missing capability.
        what: &'static str,
    },
    /// Anything else the backend reported, with its source.
    #[error("{backend}: {message}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What went wrong.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl KvError {
    /// Whether retrying the same operation may succeed (server unreachable or slow).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            KvError::Unavailable { .. }
                | KvError::Busy { .. }
                | KvError::Timeout { .. }
                | KvError::WatchEnded { .. }
        )
    }

    /// Whether the server answered that it cannot serve now ([`KvError::Busy`]): a
    /// condition that passes by itself, retried even where an unreachable server is not.
    pub fn is_busy(&self) -> bool {
        matches!(self, KvError::Busy { .. })
    }

    /// Whether a watch failed in a way that a fresh read repairs: its start revision was
    /// compacted away ([`KvError::Compacted`]) or it ended ([`KvError::WatchEnded`]). Read
    /// again, then watch from the read's revision + 1.
    pub fn needs_reread(&self) -> bool {
        matches!(self, KvError::Compacted { .. } | KvError::WatchEnded { .. })
    }

    /// The same error again, for each of several callers one failure ends (a batch of lease
    /// refreshes, the watches of one broken stream). `KvError` is not `Clone` because of its
    /// sources: the copy has the same variant and fields, with each source's text folded
    /// into the message, so it stays retryable exactly when the original is.
    pub fn duplicate(&self) -> KvError {
        let with_source = |message: &str, source: &Option<BoxError>| {
            let mut text = message.to_string();
            let mut next: Option<&(dyn std::error::Error + 'static)> = source.as_deref().map(|s| s as _);
            while let Some(err) = next {
                let part = err.to_string();
                if !text.contains(&part) {
                    text = format!("{text}: {part}");
                }
                next = err.source();
            }
            text
        };
        match self {
            KvError::Unavailable { backend, endpoint, message, source } => KvError::Unavailable {
                backend,
                endpoint: endpoint.clone(),
                message: with_source(message, source),
                source: None,
            },
            KvError::Busy { backend, endpoint, message, source } => KvError::Busy {
                backend,
                endpoint: endpoint.clone(),
                message: with_source(message, source),
                source: None,
            },
            KvError::Timeout { backend, operation, after } => {
                KvError::Timeout { backend, operation: operation.clone(), after: *after }
            }
            KvError::WatchEnded { backend, key } => KvError::WatchEnded { backend, key: key.clone() },
            KvError::LeaseNotFound(id) => KvError::LeaseNotFound(*id),
            KvError::Compacted { requested, oldest } => {
                KvError::Compacted { requested: *requested, oldest: *oldest }
            }
            KvError::InvalidArgument(message) => KvError::InvalidArgument(message.clone()),
            KvError::TooLarge { backend, what, size, limit, raise } => {
                KvError::TooLarge { backend, what, size: *size, limit: *limit, raise: *raise }
            }
            KvError::Unsupported { backend, what } => KvError::Unsupported { backend, what },
            KvError::Backend { backend, message, source } => {
                KvError::Backend { backend, message: with_source(message, source), source: None }
            }
        }
    }

    /// A [`KvError::Backend`] from a message alone.
    pub fn backend(backend: &'static str, message: impl Into<String>) -> Self {
        KvError::Backend { backend, message: message.into(), source: None }
    }
}

/// The end of a [`KvError::TooLarge`] message: how to raise the limit, or that it is fixed.
fn raise_hint(raise: Option<&'static str>) -> String {
    match raise {
        Some(how) => format!(", or raise the limit: {how}"),
        None => " (this limit is fixed)".to_string(),
    }
}

/// A bad URL or parameter. Each variant's message is one sentence saying what is wrong and
/// what would be right. Passwords never appear in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The URL does not parse.
    #[error("invalid rendezvous URL: {0}")]
    InvalidUrl(String),
    /// No backend is registered for this scheme.
    #[error("unknown URL scheme `{scheme}`; known schemes: {known}")]
    UnknownScheme {
        /// The scheme given.
        scheme: String,
        /// The schemes that exist, comma-separated.
        known: String,
    },
    /// The backend exists but was compiled out.
    #[error(
        "the `{scheme}` backend is not compiled in; enable the cargo feature `{feature}` of the `rdzv` crate"
    )]
    BackendDisabled {
        /// The scheme given.
        scheme: String,
        /// The cargo feature that enables it.
        feature: String,
    },
    /// An option name that no layer understands.
    #[error("unknown option `{option}`; known options: {known}")]
    UnknownOption {
        /// The option given.
        option: String,
        /// The options that exist, comma-separated.
        known: String,
    },
    /// A required option is missing.
    #[error("missing required option `{0}`")]
    MissingOption(String),
    /// An option's value is invalid.
    #[error("invalid value `{value}` for `{option}`: {reason}")]
    InvalidValue {
        /// The option.
        option: String,
        /// The value given.
        value: String,
        /// Why it is invalid and what is expected.
        reason: String,
    },
    /// A registry conflict: another factory already serves this scheme.
    #[error("a different backend is already registered for scheme `{0}`")]
    SchemeTaken(String),
}

/// An error of the rendezvous (see docs/PROTOCOL.md): the variants users branch on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// The run was closed (by `set_closed`); no further rounds will form.
    #[error("rendezvous of run `{run_id}` is closed{}", closed_because(*.outcome))]
    Closed {
        /// The run.
        run_id: String,
        /// How the run ended, if its closer said so.
        outcome: Option<crate::rendezvous::RunOutcome>,
    },
    /// The call did not complete by its deadline.
    #[error("rendezvous of run `{run_id}` timed out after {after:?} while {phase}")]
    Timeout {
        /// The run.
        run_id: String,
        /// The phase it was in, in words.
        phase: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The backend could not be reached, or could not serve: a [`KvError`] that
    /// [`is_retryable`](KvError::is_retryable), and only such. Retryable.
    #[error("rendezvous backend unreachable: {0}")]
    Unavailable(#[source] KvError),
    /// A value under the rendezvous' keys is corrupt.
    #[error("corrupt rendezvous state at `{key}`: {reason}")]
    State {
        /// The key holding the bad value.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A bad URL or parameter.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// This worker's session lease was lost (it was silent longer than its TTL); it is no
    /// longer a member of any round.
    #[error("this worker's session lease was lost; it is no longer a member and must rejoin")]
    LeaseLost,
    /// The handler was shut down.
    #[error("the rendezvous handler was shut down")]
    Shutdown,
    /// Any other backend error: a [`KvError`] that is not retryable.
    #[error("rendezvous backend error: {0}")]
    Backend(#[source] KvError),
    /// A step lost a race that only starting over repairs (a key it was creating vanished
    /// before the answer came). Retryable: `next_rendezvous` starts over by itself, within
    /// its deadline.
    #[error("the rendezvous must start over: {0}")]
    Raced(String),
    /// A bug of rdzv: the protocol reached a state it never should. Not retryable.
    #[error("internal error of rdzv: {0}; this is a bug, please report it")]
    Internal(String),
}

impl RendezvousError {
    /// Whether calling again may succeed: the backend was out of reach or busy
    /// ([`RendezvousError::Unavailable`], decided by [`KvError::is_retryable`]), or a race
    /// was lost ([`RendezvousError::Raced`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            RendezvousError::Unavailable(e) | RendezvousError::Backend(e) => e.is_retryable(),
            RendezvousError::Raced(_) => true,
            _ => false,
        }
    }

    /// What a [`BackendFactory`](crate::BackendFactory) returns when its backend could not
    /// connect with `error`: a setting the backend refused ([`KvError::InvalidArgument`]: an
    /// unreadable TLS file, a bad namespace) is a [`ConfigError::InvalidUrl`]; any other
    /// error is `Unavailable` or `Backend` as [`KvError::is_retryable`] says.
    pub fn connecting(error: KvError) -> RendezvousError {
        match error {
            KvError::InvalidArgument(reason) => RendezvousError::Config(ConfigError::InvalidUrl(reason)),
            other => other.into(),
        }
    }
}

fn closed_because(outcome: Option<crate::rendezvous::RunOutcome>) -> &'static str {
    match outcome {
        Some(crate::rendezvous::RunOutcome::Succeeded) => ": the job succeeded",
        Some(crate::rendezvous::RunOutcome::Failed) => ": the job failed",
        None => "",
    }
}

impl From<KvError> for RendezvousError {
    fn from(e: KvError) -> Self {
        if e.is_retryable() { RendezvousError::Unavailable(e) } else { RendezvousError::Backend(e) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicate_keeps_the_variant_and_folds_the_source_into_the_message() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let original = KvError::Unavailable {
            backend: "etcd",
            endpoint: "h:2379".into(),
            message: "stream broke".into(),
            source: Some(Box::new(io)),
        };
        let copy = original.duplicate();
        assert!(copy.is_retryable());
        assert!(copy.to_string().contains("stream broke: reset by peer"), "{copy}");
        assert!(matches!(
            KvError::Compacted { requested: 3, oldest: 5 }.duplicate(),
            KvError::Compacted { requested: 3, oldest: 5 }
        ));
        assert!(KvError::backend("redis", "x").duplicate().to_string().contains("redis: x"));
        assert!(!KvError::LeaseNotFound(7).duplicate().is_retryable());
    }

    fn samples() -> Vec<KvError> {
        vec![
            KvError::Unavailable {
                backend: "x",
                endpoint: "h:1".into(),
                message: "refused".into(),
                source: None,
            },
            KvError::Busy { backend: "x", endpoint: "h:1".into(), message: "no leader".into(), source: None },
            KvError::Timeout { backend: "x", operation: "get".into(), after: Duration::from_secs(1) },
            KvError::WatchEnded { backend: "x", key: "k".into() },
            KvError::LeaseNotFound(7),
            KvError::Compacted { requested: 3, oldest: 5 },
            KvError::InvalidArgument("empty prefix".into()),
            KvError::TooLarge { backend: "x", what: "a key", size: 9, limit: 8, raise: None },
            KvError::Unsupported { backend: "x", what: "compaction" },
            KvError::backend("x", "boom"),
        ]
    }

    #[test]
    fn a_rendezvous_error_is_retryable_exactly_when_its_backend_error_is() {
        for e in samples() {
            let retryable = e.is_retryable();
            let wrapped = RendezvousError::from(e);
            assert_eq!(wrapped.is_retryable(), retryable, "{wrapped:?}");
            assert_eq!(matches!(wrapped, RendezvousError::Unavailable(_)), retryable, "{wrapped:?}");
        }
        assert!(RendezvousError::Raced("a key vanished".into()).is_retryable());
        let bug = RendezvousError::Internal("got Ack in phase `join`".into());
        assert!(!bug.is_retryable());
        assert!(bug.to_string().contains("bug, please report it"), "{bug}");
        for other in [RendezvousError::LeaseLost, RendezvousError::Shutdown] {
            assert!(!other.is_retryable(), "{other:?}");
        }
    }

    #[test]
    fn a_failed_connect_is_a_configuration_error_only_for_a_refused_setting() {
        for e in samples() {
            let refused_setting = matches!(e, KvError::InvalidArgument(_));
            let retryable = e.is_retryable();
            match RendezvousError::connecting(e) {
                RendezvousError::Config(ConfigError::InvalidUrl(reason)) => {
                    assert!(refused_setting && reason == "empty prefix", "{reason}")
                }
                other => assert!(!refused_setting && other.is_retryable() == retryable, "{other:?}"),
            }
        }
    }

    #[test]
    fn too_large_names_how_to_raise_the_limit_only_where_there_is_a_way() {
        let fixed = KvError::TooLarge { backend: "redis", what: "a value", size: 9, limit: 8, raise: None };
        let text = fixed.to_string();
        assert!(text.contains("more than the limit of 8 bytes; store less (this limit is fixed)"), "{text}");
        assert!(!text.contains("option"), "{text}");
        let raisable = KvError::TooLarge {
            backend: "etcd",
            what: "a value",
            size: 9,
            limit: 8,
            raise: Some("the option max_request_bytes"),
        };
        assert!(
            raisable.duplicate().to_string().ends_with("or raise the limit: the option max_request_bytes")
        );
    }
}
