//! Phase 4: while a round runs, watch its members' keep-alive keys and the state, and tell
//! the owner when the round is over (instead of leaving it to find out by a hung
//! collective).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::ext::KvExt;
use crate::kv::{EventKind, Kv, KvResult, Revision, WatchScope};

use super::broken::RoundBroken;
use super::decide;
use super::keys::RunKeys;
use super::state::State;

/// What the handler publishes to `round_broken` waiters: the round, and whether it broke.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RoundStatus {
    pub(crate) version: Option<u64>,
    pub(crate) broken: Option<RoundBroken>,
}

/// A running watch over one round; stops when dropped.
#[derive(Debug)]
pub(crate) struct Monitor {
    _stop: DropGuard,
}

pub(crate) struct Watched {
    pub(crate) kv: Arc<dyn Kv>,
    pub(crate) keys: RunKeys,
    pub(crate) version: u64,
    pub(crate) world_size: usize,
    pub(crate) final_revision: Revision,
    /// Watch the members' keep-alive keys from here (see `Completed::members_from`).
    pub(crate) members_from: Revision,
}

impl Monitor {
    /// Starts watching; the first reason the round is over is published on `status`.
    pub(crate) fn spawn(
        round: Watched,
        lease_lost: CancellationToken,
        status: watch::Sender<RoundStatus>,
    ) -> Monitor {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let version = round.version;
        tokio::spawn(async move {
            let reason = tokio::select! {
                _ = stopped.cancelled() => return,
                _ = lease_lost.cancelled() => RoundBroken::LeaseLost,
                reason = watch_round(&round) => reason,
            };
            tracing::info!(version, ?reason, "round broken");
            status.send_if_modified(|s| {
                if s.version == Some(version) && s.broken.is_none() {
                    s.broken = Some(reason);
                    true
                } else {
                    false
                }
            });
        });
        Monitor { _stop: stop.drop_guard() }
    }
}

/// Pauses before re-checking a round whose watch failed: from `RECHECK_FIRST` growing to
/// `RECHECK_LONGEST`, each with jitter, so that the monitors of thousands of handlers that
/// lost their watches together (an outage) neither poll a recovering server every half
/// second nor come back to it in lockstep. A watch that lasted longer than the longest pause
/// starts the next failure's pauses from the first again.
const RECHECK_FIRST: Duration = Duration::from_millis(500);
const RECHECK_LONGEST: Duration = Duration::from_secs(2);

async fn watch_round(round: &Watched) -> RoundBroken {
    let (mut states_from, mut members_from) = (round.final_revision + 1, round.members_from + 1);
    let mut pauses = crate::retry_delays(RECHECK_FIRST, RECHECK_LONGEST);
    loop {
        let opened = tokio::time::Instant::now();
        match watch_from(round, states_from, members_from).await {
            Ok(reason) => return reason,
            Err(e) => {
                // Compaction or an outage: re-check the round with a read, then watch again.
                tracing::debug!(error = %e, "round monitor lost its watch; re-reading");
                if opened.elapsed() > RECHECK_LONGEST {
                    pauses = crate::retry_delays(RECHECK_FIRST, RECHECK_LONGEST);
                }
                tokio::time::sleep(pauses.next().unwrap_or(RECHECK_LONGEST)).await;
                match recheck(round).await {
                    Ok(Ok(revision)) => (states_from, members_from) = (revision + 1, revision + 1),
                    Ok(Err(reason)) => return reason,
                    Err(_) => {}
                }
            }
        }
    }
}

async fn watch_from(round: &Watched, states_from: Revision, members_from: Revision) -> KvResult<RoundBroken> {
    let mut states = round.kv.watch_from(&round.keys.state(), WatchScope::Key, states_from).await?;
    let rank_prefix = round.keys.ranks(round.version);
    let mut members = round.kv.watch_from(&rank_prefix, WatchScope::Prefix, members_from).await?;
    loop {
        tokio::select! {
            event = states.next() => {
                let event = event?;
                let state = match event.kind {
                    EventKind::Put => State::parse(&event.kv.key, &event.kv.value).ok(),
                    EventKind::Delete => None,
                };
                if let Some(reason) = decide::running_round(state.as_ref(), round.version) {
                    return Ok(reason);
                }
            }
            event = members.next() => {
                let event = event?;
                if event.kind == EventKind::Delete {
                    let rank = std::str::from_utf8(&event.kv.key[rank_prefix.len().min(event.kv.key.len())..])
                        .ok()
                        .and_then(|r| r.parse().ok());
                    return Ok(RoundBroken::MemberGone { rank });
                }
            }
        }
    }
}

/// Reads the round: `Ok(Ok(revision))` if it is intact as of `revision`, `Ok(Err(reason))` if
/// it is over.
async fn recheck(round: &Watched) -> KvResult<Result<Revision, RoundBroken>> {
    let read = round.kv.get(&round.keys.state()).await?;
    let state = read.kv.as_ref().and_then(|kv| State::parse(&kv.key, &kv.value).ok());
    if let Some(reason) = decide::running_round(state.as_ref(), round.version) {
        return Ok(Err(reason));
    }
    let alive = round.kv.count(&round.keys.ranks(round.version), None).await?;
    if !decide::completes_round(alive, round.world_size) {
        return Ok(Err(RoundBroken::MemberGone { rank: None }));
    }
    Ok(Ok(read.revision))
}
