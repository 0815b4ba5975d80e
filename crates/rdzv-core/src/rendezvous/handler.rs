//! The rendezvous handler (docs/PROTOCOL.md): what a worker holds to take part in a run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{KvError, RendezvousError};
use crate::events::{self, Event, EventKind, LostReason, Subscribers};
use crate::ext::KvExt;
use crate::kv::{DeleteMode, Kv, LeaseId, PutMode};
use crate::params::RendezvousParams;
use crate::retry::RetryPolicy;
use crate::session::{RefreshFailed, Session};

use super::broken::RoundBroken;
use super::changes::{KnownRound, RoundChanges};
use super::current::Current;
use super::deadline::Deadline;
use super::decide::Sizing;
use super::excluded::Exclusion;
use super::executor::{Attempt, Context, History, clean};
use super::keys::RunKeys;
use super::machine::{Completed, RoundTimings};
use super::monitor::{Monitor, RoundStatus, Watched};
use super::run_lease::{RunLease, cas_with_run_lease, put_with_run_lease};
use super::state::{LastRound, Participant, RunOutcome, State};
use super::waiting::Waiting;

type Result<T> = std::result::Result<T, RendezvousError>;

/// The outcome of [`RendezvousHandler::next_rendezvous`]: this worker's place in a completed
/// round. Every member of the round holds the same `version`, `world_size` and
/// `participants`; ranks are `0..world_size`, each held by exactly one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousInfo {
    /// The run.
    pub run_id: String,
    /// The round's number; only grows for one worker.
    pub version: u64,
    /// This worker's rank: its index in `participants`.
    pub rank: usize,
    /// The number of members.
    pub world_size: usize,
    /// The members in rank order (shared by every handler of the process that is in the
    /// round: cloning it is cheap).
    pub participants: Arc<[Participant]>,
    /// The key prefix of the round's Store (`…/rdzv/v_<N>/kv/`).
    pub store_prefix: Vec<u8>,
    /// The run lease (TTL `run_ttl`, kept alive by every live handler of the run): bind the
    /// round's Store data to it, so that it goes with the run (`None` if this worker could
    /// not learn it).
    pub run_lease: Option<LeaseId>,
    /// How long the phases took.
    pub timings: RoundTimings,
    /// What changed since the round before, as this worker knew it.
    pub changes: RoundChanges,
}

/// One worker's handle on a run: forms rounds with the other workers, tells when a round
/// breaks, and leaves when shut down or dropped.
///
/// Cheap to clone (all clones are the same worker). Calls of `next_rendezvous` on one
/// worker are serialized. Dropping the last clone leaves like [`shutdown`](Self::shutdown),
/// in the background.
#[derive(Clone, Debug)]
pub struct RendezvousHandler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ctx: Context,
    worker: tokio::sync::Mutex<Worker>,
    status: watch::Sender<RoundStatus>,
    shut_down: CancellationToken,
    /// Who is told of this worker's events ([`RendezvousHandler::on_event`]).
    events: Arc<Subscribers>,
    /// Whether the run's close was reported, and whether this worker closes (or closed) it
    /// (then it reports the close itself, and its round's monitor seeing the run closed is
    /// no news).
    closed: Arc<Closed>,
}

/// What a worker knows of the run's close, so that it reports it once.
#[derive(Debug, Default)]
struct Closed {
    closing: AtomicBool,
    told: AtomicBool,
}

/// What one worker holds between calls.
#[derive(Debug, Default)]
struct Worker {
    session: Option<Session>,
    membership: Option<(Completed, Monitor)>,
    /// The last round this worker was a member of.
    last: Option<KnownRound>,
    /// When it first arrived in the run (the create revision of its first join or waiting
    /// key): newcomers are admitted in this order.
    since: Option<crate::kv::Revision>,
    /// The last few sessions this worker gave up, newest last: their keys are its own.
    retired: Vec<LeaseId>,
    /// Since when this worker is excluded by its health check (wall clock for its record,
    /// monotonic for how long), if it is.
    excluded: Option<(SystemTime, Instant)>,
}

impl Worker {
    /// What the next attempt starts from.
    fn history(&self) -> History {
        let last = self
            .last
            .as_ref()
            .and_then(|known| Some(LastRound { version: known.version, rank: known.rank? }));
        History { last, since: self.since, retired: self.retired.clone() }
    }

    /// Gives up the current session (it is revoked in the background, best effort), and
    /// remembers its lease: should the revoke not get through, the keys it still holds on the
    /// server are known to be this worker's own.
    fn retire_session(&mut self) {
        drop(self.take_session());
    }

    /// Takes the current session out, remembered as retired.
    fn take_session(&mut self) -> Option<Session> {
        const REMEMBERED: usize = 8;
        let session = self.session.take()?;
        if self.retired.len() == REMEMBERED {
            self.retired.remove(0);
        }
        self.retired.push(session.lease());
        Some(session)
    }
}

impl RendezvousHandler {
    /// A handler for `params.run_id` on `kv`. Starts this worker's session lease, so an
    /// unreachable backend fails here with [`RendezvousError::Unavailable`]. The lease grant
    /// is asked again ([`retry_first_contact`](crate::retry::retry_first_contact)): after a
    /// server's answer that it cannot serve now ([`KvError::Busy`]: no leader yet,
    /// overloaded), until the `timeout` parameter has passed; after
    /// [`KvError::Unavailable`], at most twice more, within about a second and never past
    /// `timeout`, so that a client whose connection was just reset (it fails the next
    /// request once, then reconnects) gets its session, while a server that cannot be
    /// reached at all still fails within about a second.
    pub async fn new(kv: Arc<dyn Kv>, params: RendezvousParams) -> Result<Self> {
        params.validate_worker()?;
        let keys = RunKeys::new(&params.prefix, &params.run_id);
        let node = params.node_id.clone().unwrap_or_else(default_node_id);
        let addr = params.local_addr.clone().unwrap_or_else(host_name);
        let me =
            Participant { node, addr, pid: std::process::id(), port: None, segment: params.segment.clone() };
        let run_lease = RunLease::new(kv.clone(), &keys, params.run_ttl);
        let events = Arc::new(Subscribers::new(&params.run_id, &me.node, me.segment.as_deref()));
        // A server that answers it cannot serve yet (a leader election) is retried within
        // the rendezvous deadline; one that cannot be reached, a bounded number of times
        // (a reset connection's client reconnects), then fails here.
        let deadline = Instant::now() + params.timeout;
        let session = crate::retry::retry_first_contact(deadline, || {
            Session::start_observed(kv.clone(), params.keep_alive_ttl, Some(refresh_failures(&events)))
        })
        .await?;
        let sizing = Sizing::from_params(&params);
        let ctx = Context { kv, params, sizing, keys, me, run_lease };
        let worker = Worker { session: Some(session), ..Worker::default() };
        Ok(RendezvousHandler {
            inner: Arc::new(Inner {
                ctx,
                worker: tokio::sync::Mutex::new(worker),
                status: watch::Sender::new(RoundStatus::default()),
                shut_down: CancellationToken::new(),
                events,
                closed: Arc::default(),
            }),
        })
    }

    /// Blocks until a round completes with this worker in it, and returns its place in it.
    ///
    /// If this worker is a member of a running round, it first leaves it (the others learn
    /// at once). A worker that is not yet in a round survives the loss of its session (the
    /// backend was out of reach for longer than `keep_alive_ttl`): it starts a new one and
    /// carries on within the same deadline. Backend errors are retried until the deadline.
    ///
    /// A worker beyond `max_workers` waits as a *spare*: while the round it waits behind is
    /// full and intact, the deadline does not run (a spare waits until a member is gone, the
    /// run closes, or it shuts down), and it gets a whole `timeout` again from then on — also
    /// when it stops waiting because it lost its session, however long it waited before.
    ///
    /// Fails with [`RendezvousError::Closed`] if the run is or becomes closed,
    /// [`RendezvousError::Timeout`] if no round completes within the `timeout` parameter,
    /// [`RendezvousError::Shutdown`] if [`shutdown`](Self::shutdown) is called meanwhile
    /// (promptly: the call does not wait for its deadline), [`RendezvousError::State`] on a
    /// corrupt value. A failed or cancelled call withdraws what it wrote (its join and
    /// waiting keys, a `setup` value), so it leaves no ghost behind.
    pub async fn next_rendezvous(&self) -> Result<RendezvousInfo> {
        let inner = &*self.inner;
        let started = Instant::now();
        let shut_down = inner.shut_down.clone();
        let mut worker = self.lock_worker().await?;
        let previous = self.leave_running_round(&mut worker);
        let (round, waited_behind) = self.form_round(&mut worker, previous.as_ref(), started).await?;
        if shut_down.is_cancelled() {
            return Err(RendezvousError::Shutdown);
        }
        self.enter(&mut worker, round, waited_behind, started)
    }

    /// Stops watching the running round this worker is a member of, and returns it for the
    /// next call to end — unless its monitor already saw it end (then there is nothing to end,
    /// and a swap would only be a wasted write).
    fn leave_running_round(&self, worker: &mut Worker) -> Option<Completed> {
        let ended =
            matches!(self.inner.status.borrow().broken, Some(RoundBroken::Ended | RoundBroken::Closed));
        worker.membership.take().and_then(|(round, monitor)| {
            drop(monitor);
            self.publish(None, Some(RoundBroken::Left));
            (!ended).then_some(round)
        })
    }

    /// Forms the next round (leaving `previous` first, if given): attempts under one
    /// session at a time, a lost session replaced, until one completes a round, the call's
    /// deadline passes, or it fails; with the running round it last waited behind, if any. A
    /// failed attempt's keys are withdrawn.
    async fn form_round(
        &self,
        worker: &mut Worker,
        previous: Option<&Completed>,
        started: Instant,
    ) -> Result<(Completed, Option<KnownRound>)> {
        let ctx = &self.inner.ctx;
        let shut_down = self.inner.shut_down.clone();
        let mut deadline = Deadline::new(started, ctx.params.timeout);
        let leaving = previous.map(|round| round.version);
        let mut leave = previous;
        let mut phase = "starting a session";
        loop {
            let history = worker.history();
            let session = tokio::select! {
                session = tokio::time::timeout_at(deadline.resumed_at(Instant::now()), self.live_session(worker)) => match session {
                    Ok(Ok(session)) => session,
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(self.timed_out(phase)),
                },
                _ = shut_down.cancelled() => return Err(RendezvousError::Shutdown),
            };
            let lost = session.lost();
            let mut attempt = Attempt::new(ctx, session.lease(), started, leaving, leave.take(), history);
            let outcome = tokio::select! {
                r = attempt.run(&mut deadline) => r,
                _ = lost.cancelled() => Err(RendezvousError::LeaseLost),
                // The session is revoked by `shutdown`, and every key of this call with it.
                _ = shut_down.cancelled() => return Err(RendezvousError::Shutdown),
            };
            phase = attempt.doing();
            worker.since = worker.since.or(attempt.arrived());
            match outcome {
                Ok(round) => {
                    attempt.disarm();
                    return Ok((round, attempt.waited_behind()));
                }
                // Not a member of any round yet: nothing is lost with the session but this
                // call's own keys. Start a new session and carry on.
                Err(RendezvousError::LeaseLost) => {
                    tracing::info!(run_id = %ctx.params.run_id, "session lease lost while not in a round; starting a new one");
                    attempt.disarm();
                    worker.retire_session();
                    deadline.session_lost(Instant::now());
                }
                Err(e) => {
                    // Boxed: inline, this rare path would size the future of every call.
                    if !Box::pin(clean(attempt.take_leftovers(), &*ctx.kv)).await {
                        // Something of this call may remain (a `setup` every other worker
                        // waits on): give up the session, so that it goes within its TTL.
                        tracing::debug!("could not withdraw this call's keys; abandoning the session");
                        worker.retire_session();
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Makes `round` this worker's running round: tells what changed since the latest round it
    /// knew (`waited_behind`, or its last as a member), reports it, and starts its monitor.
    fn enter(
        &self,
        worker: &mut Worker,
        round: Completed,
        waited_behind: Option<KnownRound>,
        started: Instant,
    ) -> Result<RendezvousInfo> {
        let inner = &*self.inner;
        let ctx = &inner.ctx;
        // Waited behind a full round: a spare, promoted if that is the round compared with.
        let behind_full = waited_behind
            .as_ref()
            .filter(|known| known.members.len() >= ctx.params.max_workers)
            .map(|known| known.version);
        let baseline = KnownRound::latest(worker.last.as_ref(), waited_behind);
        let changes = RoundChanges::since(baseline.as_ref(), &round.participants);
        worker.last = Some(KnownRound {
            version: round.version,
            rank: Some(round.rank),
            members: round.participants.clone(),
        });
        let info = RendezvousInfo {
            run_id: ctx.params.run_id.clone(),
            version: round.version,
            rank: round.rank,
            world_size: round.participants.len(),
            participants: round.participants.clone(),
            store_prefix: ctx.keys.store(round.version),
            run_lease: round.run_lease,
            timings: round.timings,
            changes,
        };
        if let Some(lease) = round.run_lease {
            ctx.run_lease.adopt(lease);
        }
        self.report_formed(&info, started.elapsed(), behind_full);
        self.publish(Some(round.version), None);
        let Some(lost) = worker.session.as_ref().map(Session::lost) else {
            return Err(RendezvousError::LeaseLost);
        };
        let watched = Watched {
            kv: ctx.kv.clone(),
            keys: ctx.keys.clone(),
            version: round.version,
            world_size: round.participants.len(),
            final_revision: round.final_revision,
            members_from: round.members_from,
        };
        let monitor = Monitor::spawn(watched, lost, inner.status.clone(), self.report_broken(&info));
        worker.membership = Some((round, monitor));
        Ok(info)
    }

    /// This worker's session, started anew if there is none or it was lost. An unreachable
    /// backend is retried (the caller bounds it by its deadline).
    async fn live_session<'w>(&self, worker: &'w mut Worker) -> Result<&'w Session> {
        let ctx = &self.inner.ctx;
        if worker.session.as_ref().is_none_or(Session::is_lost) {
            worker.retire_session();
            let told = refresh_failures(&self.inner.events);
            let start =
                || Session::start_observed(ctx.kv.clone(), ctx.params.keep_alive_ttl, Some(told.clone()));
            worker.session = Some(RetryPolicy::PROTOCOL.run(None, KvError::is_retryable, start).await?);
        }
        worker.session.as_ref().ok_or(RendezvousError::LeaseLost)
    }

    fn timed_out(&self, phase: &str) -> RendezvousError {
        let params = &self.inner.ctx.params;
        RendezvousError::Timeout {
            run_id: params.run_id.clone(),
            phase: phase.to_string(),
            after: params.timeout,
        }
    }

    /// Resolves when the round this worker belongs to is over, with the reason: a member is
    /// gone, the round was ended, the run was closed, or this worker's lease was lost.
    /// Resolves at once with [`RoundBroken::NoRound`] if it is in no round, and with
    /// [`RoundBroken::Left`] if it leaves meanwhile.
    pub async fn round_broken(&self) -> RoundBroken {
        let mut status = self.inner.status.subscribe();
        loop {
            {
                let now = status.borrow_and_update();
                if let Some(reason) = &now.broken {
                    return reason.clone();
                }
                if now.version.is_none() {
                    return RoundBroken::NoRound;
                }
            }
            if status.changed().await.is_err() {
                return RoundBroken::Left;
            }
        }
    }

    /// How many waiting workers the next round could admit while the current one runs: the
    /// workers that wait, up to the room that `max_workers` leaves beside the members still
    /// alive (0 when no round is running, and 0 for a round that is full and intact: the
    /// workers beyond it are *spares*, which only a member's death or departure admits). An
    /// agent re-enters the rendezvous when this is above 0, to admit them; re-entering for
    /// spares would only trade one worker for another, for ever.
    ///
    /// A member of the running round whose monitor sees it intact answers a full round
    /// without a request. A member whose round is over (a member gone, its own lease lost, …)
    /// gets 0 at once, also while the backend does not answer: it re-forms anyway, and an
    /// agent polling this must not hang on an unreachable backend when it should be stopping
    /// its workers (see [`round_broken`](Self::round_broken)).
    pub async fn num_nodes_waiting(&self) -> Result<usize> {
        let max = self.inner.ctx.params.max_workers;
        let mut status = self.inner.status.subscribe();
        let (mine, intact) = {
            let now = status.borrow_and_update();
            (now.version, now.version.is_some() && now.broken.is_none())
        };
        let worker = self.inner.worker.try_lock().ok();
        let full_member = worker
            .as_ref()
            .and_then(|w| w.membership.as_ref())
            .is_some_and(|(round, _)| Some(round.version) == mine && round.participants.len() >= max);
        if intact && full_member {
            return Ok(0);
        }
        drop(worker);
        let broken = async move {
            let _ = status.wait_for(|s| s.version == mine && s.broken.is_some()).await;
        };
        tokio::select! {
            waiting = self.waiting() => Ok(waiting?.admissible),
            () = broken, if mine.is_some() => Ok(0),
        }
    }

    /// The workers waiting for the next round, in the order it would take them, and how many
    /// of them it could admit (see [`num_nodes_waiting`](Self::num_nodes_waiting), which is
    /// `admissible`). Reads the state, the running round's keep-alive keys and the waiting
    /// keys.
    pub async fn waiting(&self) -> Result<Waiting> {
        let ctx = &self.inner.ctx;
        Waiting::read(&*ctx.kv, &ctx.keys, Some(ctx.params.max_workers), ctx.params.segment_size).await
    }

    /// Whether the run is closed.
    pub async fn is_closed(&self) -> Result<bool> {
        Ok(matches!(self.state().await?, Some(State::Closed { .. })))
    }

    /// How the job ended, as the run's close says: `None` while the run is open, or when it
    /// was closed without saying ([`set_closed`](Self::set_closed)). Reads the state.
    pub async fn run_outcome(&self) -> Result<Option<RunOutcome>> {
        Ok(match self.state().await? {
            Some(State::Closed { outcome }) => outcome,
            _ => None,
        })
    }

    /// Closes the run for every worker: every current and future `next_rendezvous` of it
    /// fails with [`RendezvousError::Closed`]. The run stays closed for `run_ttl` after its
    /// last handler is gone; then its keys expire and the run id can be used again.
    pub async fn set_closed(&self) -> Result<()> {
        self.close(None).await
    }

    /// Closes the run as [`set_closed`](Self::set_closed) does, saying how the job ended: the
    /// workers still waiting learn it with their [`RendezvousError::Closed`] (a spare of a job
    /// that succeeded ends cleanly), and `rdzv status` shows it. A run already closed keeps
    /// the outcome it was closed with, except that `Failed` replaces `Succeeded`: a member whose
    /// workers failed after another closed the run as succeeded (under torchrun, whose exit
    /// barrier gives up on a slow node after 300 s) makes the job a failure. `Failed` is final.
    pub async fn set_closed_with(&self, outcome: RunOutcome) -> Result<()> {
        self.close(Some(outcome)).await
    }

    async fn close(&self, outcome: Option<RunOutcome>) -> Result<()> {
        let ctx = &self.inner.ctx;
        let closed = State::Closed { outcome }.to_bytes();
        let key = ctx.keys.state();
        // Before the write: the round's monitor may see the run closed before the write's
        // answer arrives, and this worker reports the close once, below.
        let was_closing = self.inner.closed.closing.swap(true, Ordering::SeqCst);
        let mut found = None;
        let written = cas_with_run_lease(&ctx.run_lease, &*ctx.kv, &key, |current| {
            let already = current.and_then(|kv| State::parse_header(&kv.key, &kv.value).ok());
            match already {
                Some(State::Closed { outcome: Some(RunOutcome::Succeeded) })
                    if outcome == Some(RunOutcome::Failed) =>
                {
                    Some(closed.clone())
                }
                Some(State::Closed { outcome: Some(before) }) => {
                    found = Some(before);
                    None
                }
                Some(State::Closed { outcome: None }) if outcome.is_none() => None,
                _ => Some(closed.clone()),
            }
        })
        .await;
        let written = match written {
            Ok(written) => written.is_some(),
            Err(e) => {
                self.inner.closed.closing.store(was_closing, Ordering::SeqCst);
                return Err(e.into());
            }
        };
        tracing::info!(run_id = %ctx.params.run_id, outcome = outcome.map(RunOutcome::as_str), "run closed");
        // Closed by someone else first: this worker learns the outcome they gave, unless its
        // round's monitor told already.
        let told_before = self.inner.closed.told.swap(true, Ordering::SeqCst);
        if written || !told_before {
            let outcome = if written { outcome } else { found };
            self.inner.events.emit(|| EventKind::RunClosed { outcome, by_this_worker: written });
        }
        Ok(())
    }

    /// Leaves: revokes this worker's session lease, so its keys vanish at once and the other
    /// members see it gone. Does **not** close the run. A pending
    /// [`next_rendezvous`](Self::next_rendezvous) ends at once with
    /// [`RendezvousError::Shutdown`], and so do later calls.
    pub async fn shutdown(&self) -> Result<()> {
        let inner = &*self.inner;
        inner.shut_down.cancel();
        let mut worker = inner.worker.lock().await;
        if worker.membership.take().is_some() {
            self.publish(None, Some(RoundBroken::Left));
        }
        inner.ctx.run_lease.release();
        if let Some(session) = worker.session.take() {
            session.close().await?;
        }
        Ok(())
    }

    /// Keeps this worker out of the run because its health check failed for `reason` (the
    /// check's words): docs/PROTOCOL.md "Health gates". Call it while no
    /// [`next_rendezvous`](Self::next_rendezvous) of this worker runs (it waits for one to
    /// end). If this worker is a member of a running round, it leaves it first: its session
    /// is given up (revoked, so that its keys vanish at once and the others see it gone, as
    /// after a death, without waiting for its TTL), [`round_broken`](Self::round_broken)
    /// tells [`RoundBroken::Unhealthy`], and an [`EventKind::Drained`] is reported. Then it
    /// writes its exclusion record `rdzv/excluded/<node>` (reason, address, since when),
    /// bound to its (new) session so that it goes with the worker; nobody waits on it. The
    /// first call of an exclusion reports [`EventKind::Excluded`]; later ones only update the
    /// reason (and write the record again, should it have gone with a lost session). Ends
    /// with [`readmit`](Self::readmit).
    ///
    /// Fails with [`RendezvousError::Shutdown`] after [`shutdown`](Self::shutdown), or with
    /// the backend's error if the record could not be written within the `timeout`
    /// parameter (the worker is still out: it joins nothing until readmitted).
    pub async fn exclude(&self, reason: &str) -> Result<()> {
        let inner = &*self.inner;
        let ctx = &inner.ctx;
        let mut worker = self.lock_worker().await?;
        if let Some((round, monitor)) = worker.membership.take() {
            drop(monitor);
            self.publish(None, Some(RoundBroken::Unhealthy { reason: reason.to_string() }));
            inner.events.emit(|| EventKind::Drained {
                version: round.version,
                rank: round.rank,
                reason: reason.to_string(),
            });
            tracing::warn!(run_id = %ctx.params.run_id, version = round.version, rank = round.rank, %reason, "left the round: this node failed its health check");
            if let Some(session) = worker.take_session() {
                // Revoked now, so that the others re-form now; failing that, it expires.
                let revoked = tokio::time::timeout(ctx.params.keep_alive_ttl, session.close()).await;
                if !matches!(revoked, Ok(Ok(()))) {
                    tracing::debug!(
                        "could not revoke the session of the round left; it expires within its TTL"
                    );
                }
            }
        }
        if worker.excluded.is_none() {
            worker.excluded = Some((SystemTime::now(), Instant::now()));
            inner.events.emit(|| EventKind::Excluded { reason: reason.to_string() });
        }
        let since = worker.excluded.map_or_else(SystemTime::now, |(since, _)| since);
        let record = Exclusion::new(&ctx.me.node, &ctx.me.addr, reason, since);
        let deadline = Instant::now() + ctx.params.timeout;
        let write = async {
            let session = self.live_session(&mut worker).await?.lease();
            let write = || record.write(&*ctx.kv, &ctx.keys, session);
            RetryPolicy::CLIENT.run(Some(deadline), KvError::is_retryable, write).await?;
            Ok(())
        };
        match tokio::time::timeout_at(deadline, write).await {
            Ok(written) => written,
            Err(_) => Err(self.timed_out("writing this node's exclusion record")),
        }
    }

    /// Ends this worker's exclusion ([`exclude`](Self::exclude)): its health check passed.
    /// Deletes its record and reports [`EventKind::Readmitted`]; nothing happens if it is
    /// not excluded. Should the delete fail, the session that holds the record is given up
    /// instead (the record goes with it), so no stale record outlives the exclusion. Fails
    /// only with [`RendezvousError::Shutdown`].
    pub async fn readmit(&self) -> Result<()> {
        let ctx = &self.inner.ctx;
        let mut worker = self.lock_worker().await?;
        let Some((_, since)) = worker.excluded.take() else { return Ok(()) };
        let key = ctx.keys.excluded(&ctx.me.node);
        let deadline = Instant::now() + ctx.params.keep_alive_ttl;
        let delete = || ctx.kv.delete(&key, DeleteMode::Any);
        if let Err(e) = RetryPolicy::CLIENT.run(Some(deadline), KvError::is_retryable, delete).await {
            tracing::warn!(
                "could not delete this node's exclusion record ({e}); giving up its session instead"
            );
            worker.retire_session();
        }
        self.inner
            .events
            .emit(|| EventKind::Readmitted { excluded_seconds: events::seconds(since.elapsed()) });
        Ok(())
    }

    /// The nodes that their health check keeps out of the run, by node id (reads
    /// `rdzv/excluded/`).
    pub async fn exclusions(&self) -> Result<Vec<Exclusion>> {
        let ctx = &self.inner.ctx;
        Exclusion::read_all(&*ctx.kv, &ctx.keys).await
    }

    /// Resolves once [`shutdown`](Self::shutdown) has been called (at once if it was): for
    /// what waits beside the handler's own calls (a health gate between its checks).
    pub async fn stopped(&self) {
        self.inner.shut_down.cancelled().await;
    }

    /// The worker's state, once no other call holds it; [`RendezvousError::Shutdown`] after
    /// [`shutdown`](Self::shutdown).
    async fn lock_worker(&self) -> Result<tokio::sync::MutexGuard<'_, Worker>> {
        let shut_down = self.inner.shut_down.clone();
        let worker = tokio::select! {
            worker = self.inner.worker.lock() => worker,
            _ = shut_down.cancelled() => return Err(RendezvousError::Shutdown),
        };
        if shut_down.is_cancelled() {
            return Err(RendezvousError::Shutdown);
        }
        Ok(worker)
    }

    /// Publishes `value` for round `version` of the run; readable by
    /// [`load_extra_data`](Self::load_extra_data). Lives as long as the run.
    pub async fn store_extra_data(&self, version: u64, key: &str, value: &[u8]) -> Result<()> {
        let ctx = &self.inner.ctx;
        let k = ctx.keys.extra_data(version, key);
        put_with_run_lease(&ctx.run_lease, &*ctx.kv, &k, value, PutMode::Overwrite).await?;
        Ok(())
    }

    /// Reads extra data of round `version`, waiting until it is published or `timeout`
    /// passes ([`RendezvousError::Timeout`]).
    pub async fn load_extra_data(&self, version: u64, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let ctx = &self.inner.ctx;
        let k = ctx.keys.extra_data(version, key);
        match ctx.kv.wait_for_key(&k, Instant::now() + timeout).await {
            Ok(kv) => Ok(kv.value.to_vec()),
            Err(KvError::Timeout { .. }) => Err(RendezvousError::Timeout {
                run_id: ctx.params.run_id.clone(),
                phase: format!("waiting for extra data `{key}` of round {version}"),
                after: timeout,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Calls `subscriber` with each [`Event`] of this worker from now on: rounds formed,
    /// spares promoted, members lost, the run closed, lease refreshes that failed (see
    /// [`events`]), and what an agent reports with [`emit`](Self::emit). A
    /// member lost is reported before [`round_broken`](Self::round_broken) returns it.
    ///
    /// It is called on the thread that reports the event — a runtime's, or the keep-alive
    /// thread's — so it must return at once and never block: hand the event to a channel for
    /// anything slow. A subscriber that holds this handler keeps it alive (it does not leave
    /// when its other clones are dropped).
    pub fn on_event(&self, subscriber: impl Fn(&Event) + Send + Sync + 'static) {
        self.inner.events.add(Arc::new(subscriber));
    }

    /// Reports `kind` as an event of this worker to its subscribers, stamped with the time,
    /// run id and node id: for an agent built on the handler (restarts, worker exits, nodes
    /// waiting), so that its events and the handler's reach the same subscribers in order.
    pub fn emit(&self, kind: EventKind) {
        self.inner.events.emit(|| kind);
    }

    /// Reports the round just formed (and the promotion of a spare that waited behind the
    /// full round `behind_full`).
    fn report_formed(&self, info: &RendezvousInfo, took: Duration, behind_full: Option<u64>) {
        let events = &self.inner.events;
        let changes = &info.changes;
        events.emit(|| EventKind::RoundFormed {
            version: info.version,
            rank: info.rank,
            world_size: info.world_size,
            previous_version: changes.previous_version,
            previous_rank: changes.previous_rank,
            left: changes.left.clone(),
            joined: changes.joined.clone(),
            seconds: events::seconds(took),
        });
        if let Some(waited_behind) = behind_full
            && changes.previous_rank.is_none()
            && changes.previous_version == Some(waited_behind)
        {
            events.emit(|| EventKind::SparePromoted {
                version: info.version,
                rank: info.rank,
                waited_behind,
            });
        }
    }

    /// What reports why the round of `info` is over, when its monitor tells (nothing when
    /// this worker leaves it first).
    fn report_broken(&self, info: &RendezvousInfo) -> impl FnOnce(&RoundBroken) + Send + 'static {
        let (events, closed) = (self.inner.events.clone(), self.inner.closed.clone());
        let (version, rank, members) = (info.version, info.rank, info.participants.clone());
        let formed = Instant::now();
        move |broken: &RoundBroken| {
            let lost = |reason, rank: Option<usize>| EventKind::MemberLost {
                version,
                reason,
                rank,
                member: rank.and_then(|r| members.get(r)).map(|p| p.node.clone()),
                after_seconds: events::seconds(formed.elapsed()),
            };
            match broken {
                RoundBroken::MemberGone { rank } => events.emit(|| lost(LostReason::MemberGone, *rank)),
                RoundBroken::Ended => events.emit(|| lost(LostReason::Ended, None)),
                RoundBroken::LeaseLost => events.emit(|| lost(LostReason::LeaseLost, Some(rank))),
                RoundBroken::Closed
                    if !closed.closing.load(Ordering::SeqCst)
                        && !closed.told.swap(true, Ordering::SeqCst) =>
                {
                    events.emit(|| EventKind::RunClosed { outcome: None, by_this_worker: false })
                }
                _ => {}
            }
        }
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.inner.ctx.params.run_id
    }

    /// This worker's descriptor (node id, address, pid).
    pub fn participant(&self) -> &Participant {
        &self.inner.ctx.me
    }

    /// The parameters.
    pub fn params(&self) -> &RendezvousParams {
        &self.inner.ctx.params
    }

    /// The backend's name (`"etcd"`, `"redis"`, `"mem"`, …).
    pub fn backend_name(&self) -> &'static str {
        self.inner.ctx.kv.name()
    }

    /// The backend, e.g. to open the round's Store on it.
    pub fn backend(&self) -> Arc<dyn Kv> {
        self.inner.ctx.kv.clone()
    }

    /// The key layout of this run.
    pub fn keys(&self) -> &RunKeys {
        &self.inner.ctx.keys
    }

    async fn state(&self) -> Result<Option<State>> {
        let ctx = &self.inner.ctx;
        Ok(Current::read(&*ctx.kv, &ctx.keys).await?.into_state())
    }

    fn publish(&self, version: Option<u64>, broken: Option<RoundBroken>) {
        self.inner.status.send_replace(RoundStatus { version, broken });
    }
}

/// Tells `events`' subscribers of each failed refresh of a session's lease.
fn refresh_failures(events: &Arc<Subscribers>) -> RefreshFailed {
    let events = events.clone();
    Arc::new(move |lease, what: &str| {
        events.emit(|| EventKind::LeaseRefreshFailed { lease, error: what.to_string() })
    })
}

/// `<host>-<pid>-<random>`: unique per process and handler. Characters of the host name
/// that the identifier rule ([`validate_id`](crate::ids::validate_id)) does not allow become `-`, and the host part
/// is cut so that the whole id fits.
fn default_node_id() -> String {
    let host: String = host_name()
        .chars()
        .map(|c| if crate::ids::is_id_char(c) { c } else { '-' })
        .take(crate::ids::MAX_ID_LEN - 20)
        .collect();
    format!("{host}-{}-{:06x}", std::process::id(), crate::ids::random_bits() & 0xff_ffff)
}

/// This machine's host name, or `localhost` if it cannot be found.
pub(crate) fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_node_id_follows_the_identifier_rule() {
        let id = default_node_id();
        assert!(crate::ids::validate_id("node_id", &id).is_ok(), "{id:?}");
        assert_ne!(id, default_node_id(), "two handlers got the same default id");
    }
}
