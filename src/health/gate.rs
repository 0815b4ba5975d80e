//! The health gate around a join, and the watch over a member (docs/PROTOCOL.md "Health
//! gates"). The handler does the writing (its exclusion record, leaving a round); this
//! decides when, from the checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdzv_core::events::EventKind;
use rdzv_core::params::HealthParams;
use rdzv_core::{ConfigError, RendezvousError, RendezvousHandler, RendezvousInfo};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::check::{Checks, Target, Verdict};

/// A node's health gate: its checks, how often they run, how many failures in a row drain a
/// member.
#[derive(Debug)]
pub(crate) struct Gate {
    checks: Checks,
    interval: Duration,
    failures: u32,
    target: Target,
    /// Whether a check ran yet: one that cannot run at the first is a bad command line.
    checked: AtomicBool,
}

/// The watch over a member's health while its round runs: stopped when dropped.
#[derive(Debug)]
pub(crate) struct MemberWatch(AbortHandle);

impl Drop for MemberWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Gate {
    /// The gate `health` describes for `handler`'s worker (a bare `gpu` expecting
    /// `health.gpus` GPUs); an unknown built-in is a [`RendezvousError::Config`].
    pub(crate) fn new(handler: &RendezvousHandler, health: &HealthParams) -> Result<Gate, RendezvousError> {
        let checks = Checks::parse(&health.checks, health.timeout)?.expecting_gpus(health.gpus);
        let target = Target {
            kv: handler.backend(),
            keys: handler.keys().clone(),
            node: handler.participant().node.clone(),
        };
        let (interval, failures) = (health.interval, health.failures);
        Ok(Gate { checks, interval, failures, target, checked: AtomicBool::new(false) })
    }

    /// Joins the next round once this node is healthy, and while it stays so: checks first;
    /// while a check fails, stays out (excluded) and checks again every interval; then joins,
    /// checking every interval while it waits — a failure withdraws it (the call is dropped,
    /// which withdraws its keys) and it stays out again. Returns the round and when the join
    /// that formed it started.
    pub(crate) async fn join(
        &self,
        handler: &RendezvousHandler,
    ) -> Result<(RendezvousInfo, Instant), RendezvousError> {
        let mut failed = self.check(handler, 1, None).await?;
        loop {
            if let Some(reason) = failed {
                self.stay_out(handler, reason).await?;
            }
            handler.readmit().await?;
            let started = Instant::now();
            match self.join_while_healthy(handler).await? {
                Ok(info) => return Ok((info, started)),
                Err(reason) => failed = Some(reason),
            }
        }
    }

    /// Keeps this node excluded for `reason` until a check passes (every interval), the run
    /// closes ([`RendezvousError::Closed`]) or the worker shuts down.
    async fn stay_out(&self, handler: &RendezvousHandler, mut reason: String) -> Result<(), RendezvousError> {
        let interval = humantime::format_duration(self.interval);
        tracing::warn!(
            "this node failed its health check and stays out of the run: {reason}; checking again every {interval}"
        );
        let mut consecutive = 1u32;
        loop {
            consecutive = consecutive.saturating_add(1);
            match handler.exclude(&reason).await {
                Err(RendezvousError::Shutdown) => return Err(RendezvousError::Shutdown),
                Err(e) => {
                    tracing::warn!("could not record this node's exclusion (it stays out all the same): {e}")
                }
                Ok(()) => {}
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = handler.stopped() => return Err(RendezvousError::Shutdown),
            }
            if let Some(closed) = closed(handler).await {
                return Err(closed);
            }
            match self.check(handler, consecutive, None).await? {
                None => {
                    tracing::warn!("this node's health check passes again; it joins the run");
                    return Ok(());
                }
                Some(now) => reason = now,
            }
        }
    }

    /// `next_rendezvous`, with a check every interval beside it: the round, or why a check
    /// failed first (then the call was dropped, withdrawing its keys).
    async fn join_while_healthy(
        &self,
        handler: &RendezvousHandler,
    ) -> Result<Result<RendezvousInfo, String>, RendezvousError> {
        let join = handler.next_rendezvous();
        tokio::pin!(join);
        loop {
            let check = async {
                tokio::time::sleep(self.interval).await;
                self.check(handler, 1, None).await
            };
            tokio::select! {
                biased;
                joined = &mut join => return joined.map(Ok),
                failed = check => if let Some(reason) = failed? {
                    tracing::warn!("this node's health check failed while it waited to join; it withdraws");
                    return Ok(Err(reason));
                },
            }
        }
    }

    /// Watches the member `handler` of round `version`: a check every interval until the
    /// round is over for it; after `failures` failed checks in a row, it leaves the round and
    /// is excluded ([`RendezvousHandler::exclude`]), so that the others re-form at once.
    pub(crate) fn watch_member(self: &Arc<Self>, handler: RendezvousHandler, version: u64) -> MemberWatch {
        let gate = self.clone();
        let task = tokio::spawn(async move { gate.watch(handler, version).await });
        MemberWatch(task.abort_handle())
    }

    async fn watch(&self, handler: RendezvousHandler, version: u64) {
        let mut consecutive = 0;
        loop {
            let check = async {
                tokio::time::sleep(self.interval).await;
                self.check(&handler, consecutive + 1, Some(version)).await
            };
            let failed = tokio::select! {
                _ = handler.round_broken() => return,
                failed = check => failed,
            };
            match failed {
                Ok(None) => consecutive = 0,
                Ok(Some(reason)) if consecutive + 1 >= self.failures => {
                    tracing::warn!(
                        "this node failed its health check {} times in a row; it leaves round {version}: {reason}",
                        consecutive + 1
                    );
                    if let Err(e) = handler.exclude(&reason).await {
                        tracing::warn!("leaving the round as unhealthy: {e}");
                    }
                    return;
                }
                Ok(Some(_)) => consecutive += 1,
                Err(_) => return,
            }
        }
    }

    /// Runs the checks once: `None` if they passed, else why (reported as an event and
    /// logged). A check that cannot run at this worker's very first check is a bad command
    /// line: [`RendezvousError::Config`].
    async fn check(
        &self,
        handler: &RendezvousHandler,
        consecutive: u32,
        member_of: Option<u64>,
    ) -> Result<Option<String>, RendezvousError> {
        let verdict = self.checks.run(Some(&self.target)).await;
        let first = !self.checked.swap(true, Ordering::SeqCst);
        let reason = match verdict {
            Verdict::Passed => return Ok(None),
            Verdict::CannotRun(why) if first => {
                return Err(ConfigError::InvalidValue {
                    option: "health_check".into(),
                    value: why,
                    reason: "the check could not run at all; fix the command or install what it runs".into(),
                }
                .into());
            }
            Verdict::Failed(why) | Verdict::CannotRun(why) => why,
        };
        tracing::info!(consecutive, ?member_of, "health check failed: {reason}");
        handler.emit(EventKind::HealthCheckFailed { reason: reason.clone(), consecutive, member_of });
        Ok(Some(reason))
    }
}

/// The run's close, if it is closed (a read that fails is no close: the next check asks
/// again).
async fn closed(handler: &RendezvousHandler) -> Option<RendezvousError> {
    match handler.is_closed().await {
        Ok(true) => {
            let outcome = handler.run_outcome().await.ok().flatten();
            Some(RendezvousError::Closed { run_id: handler.run_id().to_string(), outcome })
        }
        _ => None,
    }
}
