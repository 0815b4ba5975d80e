//! The background lease reaper: every client runs one so that an expired lease's keys are
//! deleted (with their events) even when nobody writes. Reaping also runs at the start of
//! every operation; this task only covers quiet periods.

use std::sync::Weak;
use std::time::Duration;

use crate::client::{Retry, Shared};

/// The shortest lease TTL honoured: a lease ends at most one reaper period late, so a
/// shorter TTL would be mostly lateness.
pub(crate) const MIN_LEASE_TTL: Duration = Duration::from_millis(500);

/// Longest sleep between two reaps (and the lateness bound of an expiry nobody reads).
const MAX_PERIOD: Duration = Duration::from_millis(200);

/// Shortest sleep, so a deadline that just passed is not polled in a tight loop.
const MIN_PERIOD: Duration = Duration::from_millis(5);

/// Starts the reaper; it ends by itself once `shared` is gone (and is aborted by
/// [`RedisKv`](crate::RedisKv)'s drop).
pub(crate) fn spawn(shared: Weak<Shared>) -> tokio::task::AbortHandle {
    tokio::spawn(async move {
        let mut delay = MAX_PERIOD;
        loop {
            tokio::time::sleep(delay).await;
            let Some(shared) = shared.upgrade() else { return };
            if shared.high.should_announce() {
                shared.announce_rollback().await;
            }
            delay = match shared.call("reap", &[], Retry::Once).await {
                Ok(mut reply) => match reply.int() {
                    // The next deadline, by the server's clock, bounded to [MIN, MAX].
                    Ok(ms) if ms >= 0 => {
                        Duration::from_millis(u64::try_from(ms).unwrap_or(0)).clamp(MIN_PERIOD, MAX_PERIOD)
                    }
                    _ => MAX_PERIOD,
                },
                Err(e) => {
                    // The operations report the same error to their callers; here it only
                    // slows the reaper down.
                    tracing::debug!(error = %e, "redis lease reaper");
                    Duration::from_secs(1)
                }
            };
        }
    })
    .abort_handle()
}
