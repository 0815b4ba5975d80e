//! Turning what the `redis` client and our scripts report into [`KvError`]s.

use std::time::Duration;

use rdzv_core::KvError;
use redis::RedisError;

/// Backend name in errors.
pub(crate) const NAME: &str = "redis";

/// A client-library error as a [`KvError`]: unreachable / dropped connections are
/// `Unavailable` (with the endpoint, never the password), a server that says it cannot serve
/// now (loading, busy with a script, no primary) `Busy`, timeouts `Timeout`, the rest
/// `operation` at `endpoint` did not complete within `after` (named as etcd's timeouts are).
pub(crate) fn timeout(operation: &str, endpoint: &str, after: Duration) -> KvError {
    KvError::Timeout { backend: NAME, operation: format!("{operation} at {endpoint}"), after }
}

/// (script errors included) `Backend` with the source. `bound` is the timeout that applied.
pub(crate) fn from_redis(err: RedisError, endpoint: &str, operation: &str, bound: Duration) -> KvError {
    if err.is_timeout() {
        return timeout(operation, endpoint, bound);
    }
    if err.code() == Some("OOM") {
        return KvError::Backend {
            backend: NAME,
            message: format!(
                "{operation} failed at {endpoint}: the Redis server is out of memory (maxmemory \
                 reached; nothing was written): free memory or raise maxmemory, and keep \
                 maxmemory-policy noeviction (see docs/REDIS.md on memory)"
            ),
            source: Some(Box::new(err)),
        };
    }
    if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
        return KvError::Backend {
            backend: NAME,
            message: format!(
                "{operation} failed at {endpoint}: the Redis user lacks a permission rdzv needs ({}); \
                 grant the ACL rules listed in docs/REDIS.md (its commands, and the keys \
                 ~{{rdzv:<namespace>}}:*)",
                err.detail().unwrap_or("NOPERM")
            ),
            source: Some(Box::new(err)),
        };
    }
    // The server answered that it cannot serve now: it is loading its data after a start,
    // runs a long script, or (behind a proxy or in a cluster) has no primary for now. That
    // passes by itself.
    let passing = matches!(
        err.kind(),
        redis::ErrorKind::Server(
            redis::ServerErrorKind::BusyLoading
                | redis::ServerErrorKind::TryAgain
                | redis::ServerErrorKind::ClusterDown
                | redis::ServerErrorKind::MasterDown
        )
    ) || err.code() == Some("BUSY");
    if passing {
        return KvError::Busy {
            backend: NAME,
            endpoint: endpoint.to_string(),
            message: format!("{operation} failed: {err}"),
            source: Some(Box::new(err)),
        };
    }
    if err.is_io_error()
        || err.is_connection_refusal()
        || err.is_connection_dropped()
        || err.is_unrecoverable_error()
    {
        return KvError::Unavailable {
            backend: NAME,
            endpoint: endpoint.to_string(),
            message: format!("{operation} failed: {err}"),
            source: Some(Box::new(err)),
        };
    }
    KvError::Backend {
        backend: NAME,
        message: format!("{operation} failed at {endpoint}: {err}"),
        source: Some(Box::new(err)),
    }
}

/// A reply that does not have the shape our scripts produce.
pub(crate) fn bad_reply(operation: &str, what: impl std::fmt::Display) -> KvError {
    KvError::backend(
        NAME,
        format!(
            "{operation}: unexpected reply from the server ({what}); is this the rdzv script on a Redis 7 server?"
        ),
    )
}

/// A value under our keys that we did not write.
pub(crate) fn corrupt(key: &[u8], message: &str) -> KvError {
    KvError::backend(
        NAME,
        format!(
            "the Redis key `{}` does not hold what rdzv wrote ({message}); something else wrote \
             under rdzv's keys: use a separate namespace or database, or delete the damaged keys",
            String::from_utf8_lossy(key)
        ),
    )
}

/// The namespace's epoch is not the one this client attached to.
pub(crate) fn lost(endpoint: &str, namespace: &str, found: &[u8]) -> KvError {
    let found = String::from_utf8_lossy(found);
    // Set by the client that detected a rollback (see `prologue` in prelude.lua):
    // `<time>:rolled-back:<revision found>:<revision seen>`.
    if let Some((_, detail)) = found.split_once(":rolled-back:") {
        let (now, seen) = detail.split_once(':').unwrap_or((detail, "?"));
        return KvError::backend(
            NAME,
            rolled_back(
                endpoint,
                namespace,
                &format!("a client that had seen revision {seen} found revision {now}"),
            ),
        );
    }
    let what = if found.is_empty() {
        "its data is gone (the server restarted without persistence, or was flushed)".to_string()
    } else {
        "its data was replaced (the namespace was reset by another client after a data loss)".to_string()
    };
    KvError::backend(
        NAME,
        format!(
            "the Redis server at {endpoint} lost rdzv's state in namespace `{namespace}`: {what}; \
             revisions, leases and watch history from before are unknown, so this client stops; \
             connect a new client and start over"
        ),
    )
}

/// The message for a server that went back in time (`evidence`: which counter went back).
/// Not retryable: the same client can never trust that server's history again.
pub(crate) fn rolled_back(endpoint: &str, namespace: &str, evidence: &str) -> String {
    format!(
        "the Redis server at {endpoint} rolled back rdzv's state in namespace `{namespace}` \
         ({evidence}): it restarted from an older RDB/AOF snapshot, or a replica that missed \
         writes was promoted; acknowledged writes are gone and their revisions would be reused \
         for different data, so this client stops; connect a new client and start over (see \
         docs/REDIS.md on persistence)"
    )
}

#[cfg(test)]
mod tests {
    use redis::{ErrorKind, ServerErrorKind};

    use super::*;

    #[test]
    fn a_server_that_cannot_serve_now_is_busy_and_one_out_of_reach_is_unavailable() {
        let bound = Duration::from_secs(1);
        for kind in [ServerErrorKind::BusyLoading, ServerErrorKind::TryAgain, ServerErrorKind::MasterDown] {
            let err = from_redis(RedisError::from((ErrorKind::Server(kind), "not now")), "h:1", "get", bound);
            assert!(err.is_busy(), "{kind:?}: {err:?}");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = from_redis(RedisError::from(refused), "h:1", "get", bound);
        assert!(matches!(err, KvError::Unavailable { .. }), "{err:?}");
        let err = from_redis(
            RedisError::from((ErrorKind::Server(ServerErrorKind::ReadOnly), "replica")),
            "h:1",
            "put",
            bound,
        );
        assert!(!err.is_retryable(), "{err:?}");
    }
}
