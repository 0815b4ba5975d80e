//! Phase 4: while a round runs, watch its members' keep-alive keys and the state, and tell
//! the owner when the round is over (instead of leaving it to find out by a hung
//! collective).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::KvError;
use crate::ext::KvExt;
use crate::kv::{Event, EventKind, Kv, KvResult, Revision, WatchScope};
use crate::per_process::PerProcess;
use crate::retry::RetryPolicy;
use crate::wait::{Reading, Start, Wait};

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

#[derive(Clone)]
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
    /// Starts watching; the first reason the round is over is published on `status`, and
    /// told to `told` just before (so that it is reported before anyone who waits for it
    /// acts on it), unless the round was left meanwhile.
    pub(crate) fn spawn(
        round: Watched,
        lease_lost: CancellationToken,
        status: watch::Sender<RoundStatus>,
        told: impl FnOnce(&RoundBroken) + Send + 'static,
    ) -> Monitor {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let version = round.version;
        let shared = SharedWatch::of(round);
        tokio::spawn(async move {
            let mut reported = shared.reason.clone();
            let shared_reason = async {
                reported.wait_for(Option::is_some).await.ok().map(|r| r.clone().unwrap_or(RoundBroken::Ended))
            };
            let reason = tokio::select! {
                _ = stopped.cancelled() => return,
                _ = lease_lost.cancelled() => RoundBroken::LeaseLost,
                reason = shared_reason => match reason {
                    Some(reason) => reason,
                    // The shared watch ran in a runtime that is gone: watch alone.
                    None => tokio::select! {
                        _ = stopped.cancelled() => return,
                        _ = lease_lost.cancelled() => RoundBroken::LeaseLost,
                        reason = watch_round(&shared.round) => reason,
                    },
                },
            };
            drop(shared);
            tracing::info!(version, ?reason, "round broken");
            let current = status.borrow().clone();
            if current.version == Some(version) && current.broken.is_none() {
                told(&reason);
            }
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

/// The watch of one running round, shared by every member of it in this process that
/// watches it through the same backend client: N in-process workers would otherwise hold N
/// watches of the same keys, and as the members leave, each of them would be sent every
/// member's leaving — N² events queued, gigabytes at 8,192 workers. It runs while any of its
/// members' monitors holds it.
struct SharedWatch {
    round: Watched,
    reason: watch::Receiver<Option<RoundBroken>>,
    _stop: DropGuard,
}

/// A round as its watch sees it: the backend client (by address), the state key, the
/// version, and the revisions the watch starts from.
type RoundId = (usize, Vec<u8>, u64, Revision, Revision);

/// The shared watches alive in this process (a fresh table in a forked child).
static SHARED: PerProcess<Mutex<HashMap<RoundId, Weak<SharedWatch>>>> =
    PerProcess::new(|| Mutex::new(HashMap::new()));

impl SharedWatch {
    /// The shared watch of `round`, started if none runs.
    fn of(round: Watched) -> Arc<SharedWatch> {
        let id = (
            Arc::as_ptr(&round.kv).cast::<()>() as usize,
            round.keys.state(),
            round.version,
            round.final_revision,
            round.members_from,
        );
        let mut table = SHARED.get().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(shared) = table.get(&id).and_then(Weak::upgrade) {
            return shared;
        }
        table.retain(|_, shared| shared.strong_count() > 0);
        let (tell, reason) = watch::channel(None);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let watched = round.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stopped.cancelled() => {}
                reason = watch_round(&watched) => {
                    tell.send_replace(Some(reason));
                    // Keep telling until the last member lets go.
                    stopped.cancelled().await;
                }
            }
        });
        let shared = Arc::new(SharedWatch { round, reason, _stop: stop.drop_guard() });
        table.insert(id, Arc::downgrade(&shared));
        shared
    }
}

/// Pauses before re-checking a round whose watch failed: from 500 ms growing to 2 s, each
/// with jitter, so that the monitors of thousands of handlers that lost their watches
/// together (an outage) neither poll a recovering server every half second nor come back to
/// it in lockstep. A watch that lasted longer than the longest pause starts the next
/// failure's pauses from the first again.
const RECHECK: RetryPolicy = RetryPolicy::new(Duration::from_millis(500), Duration::from_secs(2));

/// Watches the round from the revisions its `final` was written and confirmed at, until it
/// is over; any failure (compaction, an outage) re-checks it with a read after a pause.
async fn watch_round(round: &Watched) -> RoundBroken {
    let from = vec![round.final_revision + 1, round.members_from + 1];
    let wait = RoundWait {
        round,
        rank_prefix: round.keys.ranks(round.version),
        pauses: Box::new(RECHECK.pauses()),
        watching_since: Some(Instant::now()),
    };
    round.kv.wait_until(wait, Start::Watch(from)).await.unwrap_or_else(|e| {
        // `RoundWait::failed` reads again after every error: a bug. Tell the owner, rather
        // than leave it in a round nobody watches.
        tracing::error!(error = %e, "the round monitor stopped (a bug of rdzv; please report it)");
        RoundBroken::Ended
    })
}

/// The wait of a round's monitor: for the state to move on, or a member's keep-alive key
/// to go.
struct RoundWait<'a> {
    round: &'a Watched,
    rank_prefix: Vec<u8>,
    pauses: Box<dyn Iterator<Item = Duration> + Send>,
    /// When the watches last started: since a read found the round intact.
    watching_since: Option<Instant>,
}

/// Which of [`RoundWait::watched`] an event is of.
const STATE: usize = 0;

impl Wait for RoundWait<'_> {
    type Output = RoundBroken;

    fn watched(&self) -> Vec<(Vec<u8>, WatchScope)> {
        vec![(self.round.keys.state(), WatchScope::Key), (self.rank_prefix.clone(), WatchScope::Prefix)]
    }

    /// Whether the round is intact as of the read's revision, else why it is over.
    async fn read(&mut self) -> KvResult<Reading<RoundBroken>> {
        let round = self.round;
        let read = round.kv.get(&round.keys.state()).await?;
        let state = read.kv.as_ref().and_then(|kv| State::parse_header(&kv.key, &kv.value).ok());
        if let Some(reason) = decide::running_round(state.as_ref(), round.version) {
            return Ok(Reading::Done(reason));
        }
        let alive = round.kv.count(&self.rank_prefix, None).await?;
        if !decide::completes_round(alive, round.world_size) {
            return Ok(Reading::Done(RoundBroken::MemberGone { rank: None }));
        }
        self.watching_since = Some(Instant::now());
        Ok(Reading::Pending(read.revision))
    }

    async fn event(&mut self, index: usize, event: Event) -> KvResult<Option<RoundBroken>> {
        if index == STATE {
            let state = match event.kind {
                EventKind::Put => State::parse_header(&event.kv.key, &event.kv.value).ok(),
                EventKind::Delete => None,
            };
            return Ok(decide::running_round(state.as_ref(), self.round.version));
        }
        if event.kind != EventKind::Delete {
            return Ok(None);
        }
        let rank = std::str::from_utf8(&event.kv.key[self.rank_prefix.len().min(event.kv.key.len())..])
            .ok()
            .and_then(|r| r.parse().ok());
        Ok(Some(RoundBroken::MemberGone { rank }))
    }

    /// Every failure re-checks the round, after a pause.
    async fn failed(&mut self, _: KvError) -> KvResult<()> {
        if self.watching_since.take().is_some_and(|since| since.elapsed() > RECHECK.longest) {
            self.pauses = Box::new(RECHECK.pauses());
        }
        tokio::time::sleep(self.pauses.next().unwrap_or(RECHECK.longest)).await;
        Ok(())
    }
}
