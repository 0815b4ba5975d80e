//! The keep-alive streams a connection keeps open between refreshes of a lease, where the
//! connection has no shared streams (`lease_streams.rs`): with credentials, and for a client
//! the caller connected.
//!
//! etcd-client opens a gRPC stream for each `keep_alive` and binds it to one lease. Opened
//! anew for every refresh, thousands of sessions on one client cost thousands of stream
//! openings per refresh period on one connection, on the server's side too; at 8,192 sessions
//! that took longer than the TTL and the sessions were lost. Kept open, a refresh is one
//! message each way on a stream that exists.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use rdzv_core::kv::LeaseId;
use tokio::time::Instant;

/// A stream not used for this long is closed (its lease was revoked or expired elsewhere, or
/// is refreshed so rarely that opening a stream each time costs nothing).
const IDLE: Duration = Duration::from_secs(300);

/// One open keep-alive stream of a lease: every request sent on it has had its answer read,
/// so the next message read answers the next request.
pub(crate) struct OpenStream {
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
    used: Instant,
}

impl OpenStream {
    /// A stream etcd-client opened, with every answer so far read.
    pub(crate) fn new(keeper: LeaseKeeper, answers: LeaseKeepAliveStream) -> OpenStream {
        OpenStream { keeper, answers, used: Instant::now() }
    }

    /// One refresh: the TTL the server answers, 0 if the lease is gone. An error means the
    /// stream is broken (the connection was lost); it must not be used again.
    pub(crate) async fn refresh(&mut self) -> Result<i64, etcd_client::Error> {
        self.keeper.keep_alive().await?;
        let answer = self.answers.message().await?;
        self.used = Instant::now();
        match answer {
            Some(answer) => Ok(answer.ttl()),
            None => Err(etcd_client::Error::LeaseKeepAliveError("keep-alive stream closed".to_string())),
        }
    }
}

/// The open streams of one connection, by lease. A refresh *takes* its lease's stream and
/// gives it back only after a whole exchange, so a refresh cancelled half-way (its deadline)
/// drops the stream with it instead of leaving an unread answer for the next one.
#[derive(Default)]
pub(crate) struct Streams {
    open: Mutex<(HashMap<LeaseId, OpenStream>, Option<Instant>)>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.open.lock().map(|open| open.0.len()).unwrap_or(0);
        f.debug_struct("Streams").field("open", &count).finish()
    }
}

impl Streams {
    /// The open stream of `lease`, if there is one (nobody else can use it meanwhile).
    pub(crate) fn take(&self, lease: LeaseId) -> Option<OpenStream> {
        self.open.lock().ok()?.0.remove(&lease)
    }

    /// Keeps `stream` open for the next refresh of `lease`; closes streams idle for
    /// [`IDLE`] (looked for at most once a minute).
    pub(crate) fn give_back(&self, lease: LeaseId, stream: OpenStream) {
        let Ok(mut open) = self.open.lock() else { return };
        let now = Instant::now();
        let (streams, swept) = &mut *open;
        if swept.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60)) {
            streams.retain(|_, s| now.duration_since(s.used) < IDLE);
            *swept = Some(now);
        }
        streams.insert(lease, stream);
    }

    /// Closes the stream of `lease` (revoked, or gone from the server).
    pub(crate) fn close(&self, lease: LeaseId) {
        if let Ok(mut open) = self.open.lock() {
            open.0.remove(&lease);
        }
    }
}
