//! The driver of one `next_rendezvous` call: performs the actions that `decide.rs` chooses,
//! phase by phase (docs/PROTOCOL.md "The phases"), and feeds back what it observes. Every wait
//! is a watch from a known revision; the caller bounds the whole call by its deadline.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{KvError, RendezvousError};
use crate::ext::KvExt;
use crate::kv::{
    DeleteMode, EventKind, KeyValue, Kv, LeaseId, PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder,
    Revision, WatchScope, WatchStream,
};
use crate::params::RendezvousParams;

use super::decide::{
    self, ConfirmAction, FreezeAction, InitAction, JoinRole, JoinedAction, Viewer, WaitingAction,
};
use super::keys::RunKeys;
use super::run_lease::{RunLease, cas_with_run_lease, put_with_run_lease};
use super::state::{Participant, State};

/// How long the creator of a round keeps trying to delete the round before the previous
/// one, when the backend fails it.
pub(crate) const FORGET_RETRY_FOR: Duration = Duration::from_secs(60);

/// How long a `frozen` state lives if confirmation stalls (the reference's 10 s).
pub(crate) const FROZEN_TTL: Duration = Duration::from_secs(10);

/// What is shared by every call of one handler.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) kv: Arc<dyn Kv>,
    pub(crate) params: RendezvousParams,
    pub(crate) keys: RunKeys,
    pub(crate) me: Participant,
    pub(crate) run_lease: RunLease,
}

/// A round this worker completed.
#[derive(Clone, Debug)]
pub(crate) struct Completed {
    pub(crate) version: u64,
    pub(crate) rank: usize,
    pub(crate) participants: Vec<Participant>,
    /// Revision of the `final` state value (to destroy exactly this round, and to watch
    /// for its end from here).
    pub(crate) final_revision: Revision,
    /// Watch the members' keep-alive keys for deaths after this revision: the last
    /// member's keep-alive key (`confirmed` in the `final` value), or, from an older writer,
    /// this worker's own. The last confirmer saw every keep-alive key alive as of its own,
    /// so this misses no death, even one just before `final`; and as every keep-alive key
    /// was created by then, the watch replays no creations (N monitors replaying N creations
    /// each would cost O(N²) events per round).
    pub(crate) members_from: Revision,
    /// The run lease the `final` value is bound to, for this worker to help keep alive.
    pub(crate) run_lease: Option<LeaseId>,
    pub(crate) timings: RoundTimings,
}

/// How long the phases of a completed `next_rendezvous` took, from the call's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTimings {
    /// Until this worker's join key was written (in the round it completed).
    pub joined: Duration,
    /// Until the round was frozen with this worker in it.
    pub frozen: Duration,
    /// Until the round was final: the whole call.
    pub completed: Duration,
}

/// The state as seen at a revision.
#[derive(Clone, Debug)]
struct Observed {
    state: Option<State>,
    /// `mod_revision` of the state key (0 when absent).
    mod_revision: Revision,
    /// The store revision at which this was seen: watch from here + 1 to miss nothing.
    seen: Revision,
    /// The lease the state key is bound to (for `final`: the run lease).
    lease: Option<LeaseId>,
}

enum Flow {
    Done(Completed),
    /// Start over from Init; with what is already known of the state, if anything.
    Restart(Option<Observed>),
}

/// One `next_rendezvous` call in progress.
pub(crate) struct Attempt<'a> {
    ctx: &'a Context,
    /// This worker's descriptor for this call, with a freshly found free port.
    me: Participant,
    session: LeaseId,
    started: Instant,
    /// What this worker is doing, for the timeout error.
    pub(crate) phase: &'static str,
    /// The round this call is leaving: never handed back, whatever fails meanwhile.
    leaving: Option<u64>,
    /// What this call wrote that must not outlive it if it fails.
    leftovers: Leftovers,
    timings: RoundTimings,
}

/// Keys a call wrote for itself that must not outlive a failed call: a join key (it would
/// be frozen into a round as a ghost), a waiting key (it would count in
/// `num_nodes_waiting`), and a `setup` value (every other worker waits for it to turn
/// `joinable`). All are bound to the session, so they also vanish with it.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    keys: Vec<Vec<u8>>,
    /// The state key and the revision of this call's `setup` value.
    setup: Option<(Vec<u8>, Revision)>,
}

impl Leftovers {
    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.setup.is_none()
    }

    /// Deletes what is left, each by its own bound; `false` if something may remain.
    pub(crate) async fn clean(self, kv: &dyn Kv) -> bool {
        const BOUND: Duration = Duration::from_millis(500);
        let mut clean = true;
        if let Some((key, revision)) = &self.setup {
            let undo = kv.delete(key, DeleteMode::IfRevision(*revision));
            clean &= matches!(tokio::time::timeout(BOUND, undo).await, Ok(Ok(_)));
        }
        for key in &self.keys {
            let undo = kv.delete(key, DeleteMode::Any);
            clean &= matches!(tokio::time::timeout(BOUND, undo).await, Ok(Ok(_)));
        }
        clean
    }
}

impl Drop for Attempt<'_> {
    /// A call cancelled by its caller (its future dropped) still withdraws what it wrote, in
    /// the background.
    fn drop(&mut self) {
        let leftovers = std::mem::take(&mut self.leftovers);
        if leftovers.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let kv = self.ctx.kv.clone();
            runtime.spawn(async move {
                leftovers.clean(&*kv).await;
            });
        }
    }
}

type Result<T> = std::result::Result<T, RendezvousError>;

impl<'a> Attempt<'a> {
    /// An attempt under `session`, started at `started`, leaving round `leaving` if given.
    pub(crate) fn new(ctx: &'a Context, session: LeaseId, started: Instant, leaving: Option<u64>) -> Self {
        let me = Participant { port: free_port(), ..ctx.me.clone() };
        Attempt {
            ctx,
            me,
            session,
            started,
            phase: "starting",
            leaving,
            leftovers: Leftovers::default(),
            timings: RoundTimings::default(),
        }
    }

    /// What a failed call must withdraw; the attempt forgets it.
    pub(crate) fn take_leftovers(&mut self) -> Leftovers {
        std::mem::take(&mut self.leftovers)
    }

    /// Leaves `round` (this worker's running round) and, in the same write, starts the next
    /// one (see [`Attempt::replace_final`]). If that write fails, at least withdraw our
    /// keep-alive key so that the others notice.
    async fn leave(&mut self, round: &Completed) -> Result<Flow> {
        self.phase = "leaving the previous round";
        tracing::debug!(version = round.version, "leaving the running round");
        match self.replace_final(round.final_revision).await {
            Err(e) => {
                let rank_key = self.ctx.keys.rank(round.version, round.rank);
                let _ = self.ctx.kv.delete(&rank_key, DeleteMode::Any).await;
                Err(e)
            }
            flow => flow,
        }
    }

    /// Runs the phases, after leaving `leaving` if given, until a round completes, the run is closed, or an error that
    /// retrying cannot fix. Retryable backend errors restart from Init after a backoff; the
    /// caller's deadline bounds it all.
    pub(crate) async fn run(&mut self, mut leaving: Option<&Completed>) -> Result<Completed> {
        let mut backoff = backoff();
        let mut known: Option<Observed> = None;
        loop {
            let step = match leaving.take() {
                Some(round) => self.leave(round).await,
                None => self.step(known.take()).await,
            };
            match step {
                Ok(Flow::Done(done)) => return Ok(done),
                Ok(Flow::Restart(observed)) => known = observed,
                // Our session is gone on the server: the caller starts a new one.
                Err(RendezvousError::Backend(KvError::LeaseNotFound(lease))) if lease == self.session => {
                    return Err(RendezvousError::LeaseLost);
                }
                // A short-lived lease (a `frozen` value's, or the run lease) expired between
                // its grant and its use: the round moved on; start over.
                Err(RendezvousError::Unavailable(e))
                | Err(RendezvousError::Backend(
                    e @ (KvError::Compacted { .. } | KvError::LeaseNotFound(_)),
                )) => {
                    let delay = backoff.next().unwrap_or(Duration::from_secs(2));
                    tracing::debug!(error = %e, ?delay, "backend error; starting over");
                    self.phase = "retrying after a backend error";
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn step(&mut self, known: Option<Observed>) -> Result<Flow> {
        let observed = match known {
            Some(o) => o,
            None => self.read_state().await?,
        };
        let params = &self.ctx.params;
        let viewer = Viewer {
            me: &self.me,
            setup_is_mine: matches!(observed.state, Some(State::Setup))
                && observed.lease == Some(self.session),
            leaving: self.leaving,
        };
        match decide::on_state(observed.state.as_ref(), viewer) {
            InitAction::Closed => Err(self.closed()),
            InitAction::ResumeSetup => {
                tracing::debug!("resuming the setup this call wrote before it failed");
                self.phase = "creating a round";
                self.leftovers.setup = Some((self.ctx.keys.state(), observed.mod_revision));
                self.open_round(observed.mod_revision).await
            }
            InitAction::Leave { version } => {
                tracing::debug!(version, "ending the round this call is leaving, again");
                self.phase = "leaving the previous round";
                self.replace_final(observed.mod_revision).await
            }
            InitAction::CreateRound => {
                let span =
                    tracing::debug_span!("create_round", run_id = %params.run_id, node = %self.ctx.me.node);
                self.create_round().instrument(span).await
            }
            InitAction::Join { version } => {
                let span =
                    tracing::debug_span!("join", run_id = %params.run_id, version, node = %self.ctx.me.node);
                self.join(version, observed).instrument(span).await
            }
            InitAction::AwaitNextRound { version, world_size } => {
                let span = tracing::debug_span!("wait_next_round", run_id = %params.run_id, version, node = %self.ctx.me.node);
                self.await_next_round(version, world_size, observed).instrument(span).await
            }
            InitAction::ResumeConfirm { version, rank } => {
                let participants = match &observed.state {
                    Some(State::Frozen { participants, .. }) => participants.clone(),
                    _ => return Ok(Flow::Restart(None)),
                };
                let states = self.watch_state(observed.seen + 1).await?;
                self.confirm(version, rank, participants, observed, states).await
            }
            InitAction::ResumeMember { version, rank, world_size } => {
                // Still a member only if our keep-alive key is there under our session.
                let key = self.ctx.keys.rank(version, rank);
                let ours = self.ctx.kv.get(&key).await?.kv.filter(|kv| kv.lease == Some(self.session));
                match (&observed.state, ours) {
                    (Some(State::Final { participants, confirmed, .. }), Some(mine)) => {
                        let participants = participants.clone();
                        let members_from = confirmed.unwrap_or(mine.create_revision);
                        let (revision, lease) = (observed.mod_revision, observed.lease);
                        Ok(self.done(version, rank, participants, revision, members_from, lease))
                    }
                    _ => self.await_next_round(version, world_size, observed).await,
                }
            }
            InitAction::AwaitChange => {
                self.phase = "waiting for another worker to finish setting up or freezing a round";
                let mut states = self.watch_state(observed.seen + 1).await?;
                Ok(Flow::Restart(Some(self.next_state(&mut states).await?)))
            }
        }
    }

    /// Phase 1: no round exists. Claim it with `setup` (create-if-absent), then open it.
    async fn create_round(&mut self) -> Result<Flow> {
        self.phase = "creating a round";
        self.claim_setup(PutMode::Create).await
    }

    /// Ends the round this worker is leaving, or a broken one a waiter found, by swapping
    /// its `final` value (still at `final_revision`) for `setup`: the others learn at once,
    /// and the winner of the swap opens the next round with no further contention.
    async fn replace_final(&mut self, final_revision: Revision) -> Result<Flow> {
        self.claim_setup(PutMode::Update(final_revision)).await
    }

    /// Writes `setup` (bound to this worker's session: if it dies now, the value vanishes)
    /// under `mode`; the winner opens the round, a loser acts on the value that beat it.
    async fn claim_setup(&mut self, mode: PutMode) -> Result<Flow> {
        let kv = &*self.ctx.kv;
        let setup = PutOptions { mode, lease: Some(self.session) };
        let key = self.ctx.keys.state();
        match kv.put(&key, &State::Setup.to_bytes(), setup).await? {
            PutOutcome::Written { revision, .. } => {
                self.leftovers.setup = Some((key, revision));
                self.open_round(revision).await
            }
            PutOutcome::Conflict { current } => Ok(Flow::Restart(Some(self.observe(current, None)?))),
        }
    }

    /// Bumps the version counter and swaps `setup` → `joinable`, then joins the new round.
    async fn open_round(&mut self, setup_revision: Revision) -> Result<Flow> {
        let kv = &*self.ctx.kv;
        let key = self.ctx.keys.state();
        let counter = self.ctx.keys.version_counter();
        let counter_key = counter.clone();
        let mut bad_counter = None;
        let written = cas_with_run_lease(&self.ctx.run_lease, kv, &counter, |current| {
            let last = match current {
                None => 0,
                Some(kv) => match std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse::<u64>().ok()) {
                    Some(v) => v,
                    None => {
                        bad_counter = Some(kv.value.clone());
                        return None;
                    }
                },
            };
            Some((last + 1).to_string().into_bytes())
        })
        .await?;
        let version = match written {
            Some((value, _)) => String::from_utf8_lossy(&value).parse::<u64>().unwrap_or_default(),
            None => {
                let _ = kv.delete(&key, DeleteMode::IfRevision(setup_revision)).await;
                return Err(RendezvousError::State {
                    key: String::from_utf8_lossy(&counter_key).into_owned(),
                    reason: format!(
                        "the version counter is not a number: {:?}",
                        String::from_utf8_lossy(&bad_counter.unwrap_or_default())
                    ),
                });
            }
        };
        let joinable = State::Joinable { version };
        // A lost answer leaves the version counter bumped: resuming bumps it again, and
        // that version is skipped, which is harmless (versions only need to grow).
        let outcome = put_with_run_lease(
            &self.ctx.run_lease,
            kv,
            &key,
            &joinable.to_bytes(),
            PutMode::Update(setup_revision),
        )
        .await?;
        self.leftovers.setup = None;
        match outcome {
            PutOutcome::Written { revision, .. } => {
                tracing::debug!(version, "created a round");
                self.forget_old_round(version);
                let observed =
                    Observed { state: Some(joinable), mod_revision: revision, seen: revision, lease: None };
                self.join(version, observed).await
            }
            PutOutcome::Conflict { current } => Ok(Flow::Restart(Some(self.observe(current, None)?))),
        }
    }

    /// Phase 2: join round `version`; freeze it when this worker is the one responsible;
    /// wait until it is frozen.
    async fn join(&mut self, version: u64, observed: Observed) -> Result<Flow> {
        self.phase = "joining";
        let ctx = self.ctx;
        let params = &ctx.params;
        // Watch before writing: a watch from a revision still in the future streams live,
        // whereas one opened after our own write would start in the past (on etcd, a
        // catch-up that costs up to 100 ms).
        let mut states = self.watch_state(observed.seen + 1).await?;
        let join_key = ctx.keys.join(version, &ctx.me.node);
        let my_revision = match self.put_own(&join_key).await? {
            Owned::Mine(create_revision) => create_revision,
            Owned::Taken(holder) => return self.await_release(join_key, holder).await,
        };
        self.leftovers.keys.push(join_key.clone());
        self.timings.joined = self.started.elapsed();
        let position = count_up_to(&*ctx.kv, &ctx.keys.joins(version), my_revision).await?;
        tracing::debug!(position, "joined");
        let role = decide::join_role(
            position,
            params.min_workers,
            params.max_workers,
            params.last_call_timeout,
            params.keep_alive_ttl,
        );
        let mut freeze_at = match role {
            JoinRole::FreezeNow => Some(Instant::now()),
            JoinRole::FreezeAfter(delay) => Some(Instant::now() + delay),
            JoinRole::Wait => None,
        };
        self.phase = "waiting for enough workers to join";
        let mut state_revision = observed.mod_revision;
        let mut joiners: Option<JoinCounter> = None;
        loop {
            let wake = tokio::select! {
                seen = self.next_state(&mut states) => Wake::State(seen?),
                _ = sleep_until(freeze_at) => Wake::FreezeTimer,
                count = next_count(&mut joiners) => Wake::JoinCount(count?),
            };
            match wake {
                Wake::State(seen) => {
                    match decide::on_state_while_joined(seen.state.as_ref(), version, &self.me) {
                        JoinedAction::KeepWaiting => state_revision = seen.mod_revision,
                        JoinedAction::Confirm { rank, participants } => {
                            self.leftovers.keys.retain(|k| *k != join_key);
                            self.timings.frozen = self.started.elapsed();
                            return self.confirm(version, rank, participants, seen, states).await;
                        }
                        // Too late for this round: our join key in it is harmless (the round's
                        // membership is fixed), so it is left to our lease.
                        JoinedAction::Withdraw | JoinedAction::Restart => {
                            self.leftovers.keys.retain(|k| *k != join_key);
                            return Ok(Flow::Restart(Some(seen)));
                        }
                        JoinedAction::Closed => return Err(self.closed()),
                    }
                }
                Wake::FreezeTimer => {
                    freeze_at = None;
                    // `None`: frozen, or the state changed; the state watch tells which.
                    if let Some(counter) = self.try_freeze(version, state_revision).await? {
                        tracing::debug!(
                            count = counter.count,
                            "too few joiners to freeze; watching the join keys"
                        );
                        joiners = Some(counter);
                    }
                }
                Wake::JoinCount(count) => {
                    let (min, max) = (params.min_workers, params.max_workers);
                    if let Some(delay) = decide::retry_delay(count, min, max, params.last_call_timeout) {
                        joiners = None;
                        freeze_at = Some(Instant::now() + delay);
                    }
                }
            }
        }
    }

    /// Reads the first `max` joiners and swaps `joinable` → `frozen`. Returns a counter of
    /// the join keys when there are too few to freeze.
    async fn try_freeze(&mut self, version: u64, state_revision: Revision) -> Result<Option<JoinCounter>> {
        let ctx = self.ctx;
        let params = &ctx.params;
        let prefix = ctx.keys.joins(version);
        let options = RangeOptions {
            limit: Some(params.max_workers),
            order: RangeOrder::ByCreateRevision,
            ..RangeOptions::default()
        };
        let read = ctx.kv.range(&prefix, options).await?;
        let joiners =
            read.kvs.iter().map(|kv| Participant::parse(&kv.key, &kv.value)).collect::<Result<Vec<_>>>()?;
        match decide::freeze(
            joiners,
            read.count,
            params.min_workers,
            params.max_workers,
            params.last_call_timeout,
        ) {
            FreezeAction::AwaitJoiners { count, .. } => {
                let events = ctx.kv.watch(&prefix, WatchScope::Prefix, read.revision + 1).await?;
                Ok(Some(JoinCounter { count, events }))
            }
            FreezeAction::Freeze(participants) => {
                let frozen = State::Frozen { version, participants };
                let lease = ctx.kv.lease_grant(FROZEN_TTL).await?;
                let options = PutOptions { mode: PutMode::Update(state_revision), lease: Some(lease) };
                let outcome = ctx.kv.put(&ctx.keys.state(), &frozen.to_bytes(), options).await?;
                tracing::debug!(won = outcome.is_written(), "freeze attempted");
                Ok(None)
            }
        }
    }

    /// Phase 3: confirm membership with a keep-alive key; the worker that sees all of them
    /// swaps `frozen` → `final`.
    async fn confirm(
        &mut self,
        version: u64,
        rank: usize,
        participants: Vec<Participant>,
        frozen: Observed,
        mut states: WatchStream,
    ) -> Result<Flow> {
        self.phase = "confirming membership";
        let ctx = self.ctx;
        let world_size = participants.len();
        let mine = match self.put_own(&ctx.keys.rank(version, rank)).await? {
            Owned::Mine(create_revision) => create_revision,
            // Another live process with this node id confirmed this rank: the round is not
            // ours to take. Wait for it to end.
            Owned::Taken(_) => {
                self.phase = "waiting for a round that another process with this node id holds";
                return Ok(Flow::Restart(Some(self.next_state(&mut states).await?)));
            }
        };
        // Counting only the keys created up to ours, exactly one member (the last to confirm)
        // sees them all: one swap attempt per round, not a storm of them.
        let confirmed = count_up_to(&*ctx.kv, &ctx.keys.ranks(version), mine).await?;
        if confirmed as usize >= world_size {
            // Ours is the last keep-alive key: every member was alive at its revision.
            let fin = State::Final { version, participants: participants.clone(), confirmed: Some(mine) };
            let outcome = put_with_run_lease(
                &ctx.run_lease,
                &*ctx.kv,
                &ctx.keys.state(),
                &fin.to_bytes(),
                PutMode::Update(frozen.mod_revision),
            )
            .await?;
            if let PutOutcome::Written { revision, .. } = outcome {
                let lease = ctx.run_lease.id().await.ok();
                return Ok(self.done(version, rank, participants, revision, mine, lease));
            }
        }
        self.phase = "waiting for every member to confirm";
        loop {
            let seen = self.next_state(&mut states).await?;
            match decide::on_state_while_confirming(seen.state.as_ref(), version) {
                ConfirmAction::Done => {
                    let members_from = match &seen.state {
                        Some(State::Final { confirmed: Some(confirmed), .. }) => *confirmed,
                        _ => mine,
                    };
                    return Ok(self.done(
                        version,
                        rank,
                        participants,
                        seen.mod_revision,
                        members_from,
                        seen.lease,
                    ));
                }
                ConfirmAction::KeepWaiting => {}
                ConfirmAction::Restart => return Ok(Flow::Restart(Some(seen))),
                ConfirmAction::Closed => return Err(self.closed()),
            }
        }
    }

    fn done(
        &mut self,
        version: u64,
        rank: usize,
        participants: Vec<Participant>,
        final_revision: Revision,
        members_from: Revision,
        run_lease: Option<LeaseId>,
    ) -> Flow {
        self.timings.completed = self.started.elapsed();
        tracing::debug!(version, rank, world_size = participants.len(), "round complete");
        Flow::Done(Completed {
            version,
            rank,
            participants,
            final_revision,
            members_from,
            run_lease,
            timings: self.timings,
        })
    }

    /// Phase 5: round `version` is running without us. Register as waiting; destroy the
    /// round when one of its members is gone; start over when the state changes.
    async fn await_next_round(
        &mut self,
        version: u64,
        world_size: usize,
        observed: Observed,
    ) -> Result<Flow> {
        self.phase = "waiting for the running round to end";
        let ctx = self.ctx;
        let mut states = self.watch_state(observed.seen + 1).await?;
        let mut members =
            ctx.kv.watch(&ctx.keys.ranks(version), WatchScope::Prefix, observed.seen + 1).await?;
        let waiter = ctx.keys.waiter(version, &ctx.me.node);
        ctx.kv.put(&waiter, &self.me.to_bytes(), self.session_put()).await?;
        if !self.leftovers.keys.contains(&waiter) {
            self.leftovers.keys.push(waiter);
        }
        // A member may have died before we started watching: the count settles that.
        let alive = ctx.kv.count(&ctx.keys.ranks(version), None).await?;
        let mut action = decide::on_change_while_waiting(observed.state.as_ref(), version, alive, world_size);
        loop {
            match action {
                WaitingAction::KeepWaiting => {}
                WaitingAction::Closed => return Err(self.closed()),
                WaitingAction::Restart => return Ok(Flow::Restart(None)),
                WaitingAction::DestroyRound => {
                    tracing::debug!(version, "a member of the running round is gone; ending it");
                    return self.replace_final(observed.mod_revision).await;
                }
            }
            action = tokio::select! {
                seen = self.next_state(&mut states) => {
                    let seen = seen?;
                    let action = decide::on_change_while_waiting(seen.state.as_ref(), version, world_size as u64, world_size);
                    if matches!(action, WaitingAction::Restart) {
                        return Ok(Flow::Restart(Some(seen)));
                    }
                    action
                }
                event = members.next() => match event {
                    Some(Ok(event)) if event.kind == EventKind::Delete => {
                        decide::on_change_while_waiting(observed.state.as_ref(), version, world_size as u64 - 1, world_size)
                    }
                    Some(Ok(_)) => WaitingAction::KeepWaiting,
                    Some(Err(e)) => return Err(e.into()),
                    None => return Err(watch_ended(&*ctx.kv)),
                },
            };
        }
    }

    async fn read_state(&self) -> Result<Observed> {
        let read = self.ctx.kv.get(&self.ctx.keys.state()).await?;
        self.observe(read.kv, Some(read.revision))
    }

    /// Parses a state key (or its absence) seen at `seen` (default: its mod revision).
    fn observe(&self, kv: Option<KeyValue>, seen: Option<Revision>) -> Result<Observed> {
        match kv {
            None => Ok(Observed { state: None, mod_revision: 0, seen: seen.unwrap_or(0), lease: None }),
            Some(kv) => Ok(Observed {
                state: Some(State::parse(&kv.key, &kv.value)?),
                mod_revision: kv.mod_revision,
                seen: seen.unwrap_or(kv.mod_revision),
                lease: kv.lease,
            }),
        }
    }

    async fn watch_state(&self, from: Revision) -> Result<WatchStream> {
        Ok(self.ctx.kv.watch(&self.ctx.keys.state(), WatchScope::Key, from.max(1)).await?)
    }

    /// The next change of the state key.
    async fn next_state(&self, states: &mut WatchStream) -> Result<Observed> {
        match states.next().await {
            Some(Ok(event)) => {
                let revision = event.revision();
                match event.kind {
                    EventKind::Put => self.observe(Some(event.kv), Some(revision)),
                    EventKind::Delete => {
                        Ok(Observed { state: None, mod_revision: 0, seen: revision, lease: None })
                    }
                }
            }
            Some(Err(e)) => Err(e.into()),
            None => Err(watch_ended(&*self.ctx.kv)),
        }
    }

    fn session_put(&self) -> PutOptions {
        PutOptions { mode: PutMode::Overwrite, lease: Some(self.session) }
    }

    /// Creates `key` (this worker's descriptor, under its session), or finds it already
    /// ours (an earlier step wrote it and lost the answer). A key under another session is
    /// another live process using this node id: never overwritten.
    async fn put_own(&self, key: &[u8]) -> Result<Owned> {
        let options = PutOptions { mode: PutMode::Create, lease: Some(self.session) };
        match self.ctx.kv.put(key, &self.me.to_bytes(), options).await? {
            PutOutcome::Written { create_revision, .. } => Ok(Owned::Mine(create_revision)),
            PutOutcome::Conflict { current: Some(kv) } if kv.lease == Some(self.session) => {
                Ok(Owned::Mine(kv.create_revision))
            }
            PutOutcome::Conflict { current: Some(kv) } => Ok(Owned::Taken(kv)),
            // Deleted in between: try again from the start.
            PutOutcome::Conflict { current: None } => Err(RendezvousError::Unavailable(KvError::backend(
                self.ctx.kv.name(),
                "a key vanished while it was being created",
            ))),
        }
    }

    /// Our join key is held by another live process with this node id: wait until it is
    /// gone (its process ended, or its session expired), then start over. If it never goes,
    /// the call's deadline ends the wait with this phase in the error.
    async fn await_release(&mut self, key: Vec<u8>, holder: KeyValue) -> Result<Flow> {
        let other = Participant::parse(&holder.key, &holder.value).ok();
        tracing::warn!(
            node = %self.ctx.me.node,
            other = ?other,
            "another live worker uses this node id; waiting for it to go away"
        );
        self.phase = "waiting for another live worker with the same node id to go away (give each worker its own node id)";
        let deadline = Instant::now() + self.ctx.params.timeout;
        self.ctx.kv.wait_for_delete(&key, holder.mod_revision, deadline).await?;
        Ok(Flow::Restart(None))
    }

    /// Deletes what is left of round `version - 2` (its join, keep-alive and waiting keys,
    /// extra data and Store): no worker can be in it any more, since round `version - 1`
    /// was opened after it ended. One write per round keeps the number of keys under a run
    /// bounded however many rounds pass. In the background, off the round's critical path
    /// (on etcd a range delete takes tens of milliseconds), retried with a backoff for up to
    /// [`FORGET_RETRY_FOR`] (no later round deletes this one); if that is not enough, or this
    /// worker dies first, the keys go with their workers' sessions and the run lease.
    fn forget_old_round(&self, version: u64) {
        let Some(old) = version.checked_sub(2).filter(|v| *v > 0) else { return };
        let prefix = self.ctx.keys.round(old).into_bytes();
        let kv = self.ctx.kv.clone();
        let give_up = Instant::now() + FORGET_RETRY_FOR;
        tokio::spawn(async move {
            let mut delays = backoff();
            loop {
                match kv.delete_prefix(&prefix).await {
                    Ok(_) => return,
                    Err(e) if Instant::now() < give_up => {
                        tracing::debug!(error = %e, old, "could not delete an old round's keys yet");
                        tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(2))).await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, old, "gave up deleting an old round's keys");
                        return;
                    }
                }
            }
        });
    }

    fn closed(&self) -> RendezvousError {
        RendezvousError::Closed { run_id: self.ctx.params.run_id.clone() }
    }
}

/// Whether a key this worker creates for itself is its own.
enum Owned {
    /// Ours, created at this revision.
    Mine(Revision),
    /// Held by another session.
    Taken(KeyValue),
}

/// What woke a joiner up.
enum Wake {
    State(Observed),
    FreezeTimer,
    JoinCount(u64),
}

/// Counts the live join keys of a round from a watch, after a freeze found too few.
struct JoinCounter {
    count: u64,
    events: WatchStream,
}

/// The join count after the next change (pending forever without a counter).
async fn next_count(counter: &mut Option<JoinCounter>) -> Result<u64> {
    let Some(counter) = counter else { return std::future::pending().await };
    loop {
        match counter.events.next().await {
            Some(Ok(event)) => {
                match event.kind {
                    EventKind::Put if event.kv.version == 1 => counter.count += 1,
                    EventKind::Put => continue,
                    EventKind::Delete => counter.count = counter.count.saturating_sub(1),
                }
                return Ok(counter.count);
            }
            Some(Err(e)) => return Err(e.into()),
            None => return Err(RendezvousError::Unavailable(KvError::backend("watch", "watch ended"))),
        }
    }
}

/// How many keys under `prefix` came before or with ours (created at `revision`): the
/// count as of that revision where the backend can read the past cheaply (etcd), else the
/// live keys created up to it. Either way, in a burst of creations each count is taken by
/// exactly one worker; deaths can repeat or skip a count, which the swaps and the backup
/// timers absorb.
async fn count_up_to(kv: &dyn Kv, prefix: &[u8], revision: Revision) -> Result<u64> {
    match kv.count_at_revision(prefix, revision).await {
        Ok(Some(count)) => Ok(count),
        Ok(None) | Err(_) => Ok(kv.count(prefix, Some(revision)).await?),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn watch_ended(kv: &dyn Kv) -> RendezvousError {
    RendezvousError::Unavailable(KvError::Unavailable {
        backend: kv.name(),
        endpoint: String::new(),
        message: "a watch ended unexpectedly".into(),
        source: None,
    })
}

/// A port free on this machine now (`None` if none can be bound): what rank 0 offers as
/// `MASTER_PORT`.
fn free_port() -> Option<u16> {
    let listener = std::net::TcpListener::bind(("0.0.0.0", 0)).ok()?;
    listener.local_addr().ok().map(|a| a.port())
}

pub(crate) fn backoff() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .build()
}
