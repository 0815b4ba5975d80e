//! The executor of one `next_rendezvous` call: performs the actions the protocol's state
//! machine (`machine/`) asks for against the [`Kv`], and feeds back what it observes. It
//! holds the call's I/O state — at most one watch of the state key and one of a prefix —
//! and decides nothing; the caller bounds the whole call by its deadline.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use crate::error::RendezvousError;
use crate::ext::{KvExt, Watch};
use crate::kv::{
    DeleteMode, EventKind, Kv, LeaseId, PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder, Revision,
    WatchScope,
};
use crate::params::RendezvousParams;
use crate::retry::RetryPolicy;

use super::changes::KnownRound;
use super::current::{Current, read_unless_replaced};
use super::deadline::{Deadline, Doing};
use super::decide::{Candidate, Sizing};
use super::forget::forget_old_rounds;
use super::keys::RunKeys;
use super::machine::{Action, Bind, Call, Completed, Input, Leaving, Leftovers, Machine, Observed};
use super::run_lease::{RunLease, put_with_run_lease};
use super::state::{Joiner, LastRound, Participant, State};

/// What is shared by every call of one handler.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) kv: Arc<dyn Kv>,
    pub(crate) params: RendezvousParams,
    pub(crate) sizing: Sizing,
    pub(crate) keys: RunKeys,
    pub(crate) me: Participant,
    pub(crate) run_lease: RunLease,
}

type Result<T> = std::result::Result<T, RendezvousError>;

/// What a handler remembers of the run from its earlier calls, for the next one.
#[derive(Clone, Debug, Default)]
pub(crate) struct History {
    /// The last round this worker was a member of, and its rank there.
    pub(crate) last: Option<LastRound>,
    /// When it first arrived in the run (the create revision of its first join or waiting
    /// key): newcomers are admitted in this order.
    pub(crate) since: Option<Revision>,
    /// The last few sessions it gave up, newest last: their keys are its own.
    pub(crate) retired: Vec<LeaseId>,
}

/// One `next_rendezvous` call in progress: the machine and the watches it asked for.
pub(crate) struct Attempt<'a> {
    ctx: &'a Context,
    machine: Machine,
    session: LeaseId,
    /// The watch of the state key the machine last asked for.
    states: Option<Watch>,
    /// The watch of a prefix (join keys, or a running round's keep-alive keys).
    prefix: Option<Watch>,
}

impl Drop for Attempt<'_> {
    /// A call cancelled by its caller (its future dropped) still withdraws what it wrote, in
    /// the background.
    fn drop(&mut self) {
        let leftovers = self.machine.take_leftovers();
        if leftovers.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let kv = self.ctx.kv.clone();
            runtime.spawn(async move {
                clean(leftovers, &*kv).await;
            });
        }
    }
}

impl<'a> Attempt<'a> {
    /// An attempt under `session`, started at `started`; it first leaves `leave` (this
    /// worker's running round) if given, and never hands back round `leaving`.
    pub(crate) fn new(
        ctx: &'a Context,
        session: LeaseId,
        started: Instant,
        leaving: Option<u64>,
        leave: Option<&Completed>,
        history: History,
    ) -> Self {
        let me = Participant { port: free_port().ok(), ..ctx.me.clone() };
        let leave_first = leave.map(|round| Leaving {
            version: round.version,
            rank: round.rank,
            final_revision: round.final_revision,
            participants: round.participants.clone(),
        });
        let History { last, since, retired } = history;
        let machine = Machine::new(Call {
            me,
            session,
            keys: ctx.keys.clone(),
            sizing: ctx.sizing,
            count_at_revision: ctx.kv.capabilities().count_at_revision,
            counted_create: ctx.kv.capabilities().counted_create,
            retired,
            run_id: ctx.params.run_id.clone(),
            started,
            leave_first,
            leaving,
            last,
            since,
            node_index: ctx.params.node_index,
        });
        Attempt { ctx, machine, session, states: None, prefix: None }
    }

    /// When this worker first arrived in the run, as far as this attempt knows.
    pub(crate) fn arrived(&self) -> Option<Revision> {
        self.machine.arrived()
    }

    /// The latest running round this attempt waited behind.
    pub(crate) fn waited_behind(&self) -> Option<KnownRound> {
        let (version, members) = self.machine.waited_on()?.clone();
        Some(KnownRound { version, rank: None, members })
    }

    /// What the worker is doing, in words (for a timeout error).
    pub(crate) fn doing(&self) -> &'static str {
        self.machine.doing()
    }

    /// The call succeeded or gave up on its keys otherwise: nothing is withdrawn on drop.
    pub(crate) fn disarm(&mut self) {
        self.machine.take_leftovers();
    }

    /// What a failed call must withdraw; the attempt forgets it.
    pub(crate) fn take_leftovers(&mut self) -> Leftovers {
        self.machine.take_leftovers()
    }

    /// Runs the machine until a round completes, the run is closed, `deadline` passes, or an
    /// error that retrying cannot fix. The deadline is told what the worker does before each
    /// action (it does not run while the worker waits as a spare: `deadline.rs`). Each phase runs
    /// in a `rdzv_phase` tracing span (phase, run id, node, round once known) whose last
    /// event says what came of it: the next phase, the completed round, or the error.
    pub(crate) async fn run(&mut self, deadline: &mut Deadline) -> Result<Completed> {
        // Made at the first pause: most calls never pause, and inline the schedule would
        // add its 120 bytes to every call's future.
        let mut pauses = None;
        let mut backoff = std::iter::from_fn(move || {
            pauses.get_or_insert_with(|| Box::new(RetryPolicy::PROTOCOL.pauses())).next()
        });
        let mut phase = self.machine.phase_name();
        let (mut span, mut has_version) = self.phase_span();
        let mut action = span.in_scope(|| self.machine.start());
        loop {
            let input = match action {
                Action::Done(done) => {
                    span.in_scope(|| {
                        tracing::debug!(version = done.version, rank = done.rank, "round complete")
                    });
                    return Ok(done);
                }
                Action::Fail(error) => {
                    span.in_scope(|| tracing::debug!(%error, "call failed"));
                    return Err(error);
                }
                action => {
                    use tracing::Instrument;
                    deadline.observe(Doing::of(&self.machine), Instant::now());
                    let performed = self.perform(action, &mut backoff).instrument(span.clone());
                    match deadline.at() {
                        None => performed.await,
                        Some(at) => match tokio::time::timeout_at(at, performed).await {
                            Ok(input) => input,
                            Err(_) => return Err(self.timed_out()),
                        },
                    }
                }
            };
            action = span.in_scope(|| self.machine.on(input, Instant::now()));
            if matches!(action, Action::Done(_) | Action::Fail(_)) {
                continue;
            }
            let now = self.machine.phase_name();
            if now != phase {
                span.in_scope(|| tracing::debug!(next = now, "phase over"));
                phase = now;
                (span, has_version) = self.phase_span();
            } else if let Some(version) = self.machine.version().filter(|_| !has_version) {
                span.record("version", version);
                has_version = true;
            }
        }
    }

    /// The call's deadline passed while the worker was doing what the machine says.
    fn timed_out(&self) -> RendezvousError {
        let params = &self.ctx.params;
        RendezvousError::Timeout {
            run_id: params.run_id.clone(),
            phase: self.machine.doing().to_string(),
            after: params.timeout,
        }
    }

    /// A span for the machine's current phase, and whether it has the round's version yet.
    fn phase_span(&self) -> (tracing::Span, bool) {
        let span = tracing::debug_span!(
            "rdzv_phase",
            phase = self.machine.phase_name(),
            run_id = %self.ctx.params.run_id,
            node = %self.ctx.me.node,
            version = tracing::field::Empty,
        );
        let version = self.machine.version();
        if let Some(version) = version {
            span.record("version", version);
        }
        (span, version.is_some())
    }

    /// Carries out one action; every outcome, failures included, is the machine's input.
    /// Not an `async fn`: that would keep a second copy of `action` in every call's future.
    fn perform<'s>(
        &'s mut self,
        action: Action,
        backoff: &'s mut impl Iterator<Item = Duration>,
    ) -> impl Future<Output = Input> + 's {
        self.try_perform(action, backoff).map(|performed| performed.unwrap_or_else(Input::Failed))
    }

    async fn try_perform(
        &mut self,
        action: Action,
        backoff: &mut impl Iterator<Item = Duration>,
    ) -> Result<Input> {
        let ctx = self.ctx;
        let kv = &*ctx.kv;
        Ok(match action {
            Action::ReadState => Input::State(Observed::current(Current::read(kv, &ctx.keys).await?)),
            Action::WatchState { from } => {
                self.states = Some(kv.watch_from(&ctx.keys.state(), WatchScope::Key, from).await?);
                Input::Ack
            }
            Action::WatchPrefix { prefix, from } => {
                self.prefix = None;
                self.prefix = Some(kv.watch_from(&prefix, WatchScope::Prefix, from).await?);
                Input::Ack
            }
            Action::Await { until, prefix } => {
                if !prefix {
                    self.prefix = None;
                }
                self.next_wake(until).await?
            }
            Action::Put { key, value, mode, bind } => {
                put(ctx, self.session, &key, &value, mode, bind).await?
            }
            // Boxed: one writer per round takes it, and inline it would size every call's future.
            Action::PutState { key, state, mode, bind } => {
                Box::pin(put_state(ctx, self.session, &key, &state, mode, bind)).await?
            }
            Action::CreateCounted { key, value, tally, tally_lease } => Input::Counted(
                kv.create_counted(&key, &value, Some(self.session), &tally, tally_lease).await?,
            ),
            Action::CountAtRevision { prefix, revision } => {
                Input::Count(kv.count_at_revision(&prefix, revision).await?)
            }
            Action::Count { prefix, created_up_to } => Input::Count(kv.count(&prefix, created_up_to).await?),
            Action::ReadJoiners { prefix } => {
                let options = RangeOptions { order: RangeOrder::ByCreateRevision, ..RangeOptions::default() };
                let read = kv.range(&prefix, options).await?;
                let candidates = read
                    .kvs
                    .iter()
                    .map(|kv| {
                        Ok(Candidate {
                            joiner: Joiner::parse(&kv.key, &kv.value)?,
                            created: kv.create_revision,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Input::Joiners(candidates, read.revision)
            }
            Action::ReadMembers { prefix } => {
                let read = kv.range(&prefix, RangeOptions::default()).await?;
                let members = read
                    .kvs
                    .iter()
                    .map(|kv| Participant::parse(&kv.key, &kv.value))
                    .collect::<Result<Vec<_>>>()?;
                Input::Members(members)
            }
            Action::Get { key } => Input::Key(kv.get(&key).await?.kv),
            Action::Delete { key, mode } => Input::Deleted(kv.delete(&key, mode).await?),
            Action::ProcessAlive { pid } => Input::Alive(process_alive(pid)),
            Action::AwaitDelete { key, after } => {
                kv.wait_for_delete(&key, after, Instant::now() + ctx.params.timeout).await?;
                Input::Ack
            }
            Action::ForgetRounds { version, previous, run_lease } => {
                forget_old_rounds(ctx.kv.clone(), &ctx.keys, version, previous, run_lease);
                Input::Ack
            }
            Action::Backoff => {
                tokio::time::sleep(backoff.next().unwrap_or(RetryPolicy::PROTOCOL.longest)).await;
                Input::Timer
            }
            Action::Done(_) | Action::Fail(_) => unreachable!("the run loop ends the call on these"),
        })
    }

    /// The first of: a change of the state key, an event under the watched prefix, `until`.
    async fn next_wake(&mut self, until: Option<Instant>) -> Result<Input> {
        let Attempt { ctx, states, prefix, .. } = self;
        let Some(states) = states.as_mut() else {
            return Err(RendezvousError::Internal("waiting without a watch of the state".into()));
        };
        loop {
            tokio::select! {
                event = states.next() => {
                    let event = event?;
                    let revision = event.revision();
                    let observed = match event.kind {
                        // Boxed (freed at once unless a member list is read): inline, it
                        // would size the future of every call waiting here.
                        EventKind::Put => match Box::pin(read_unless_replaced(&*ctx.kv, &ctx.keys, &event.kv)).await? {
                            Some(state) => Observed::of(state, &event.kv, Some(revision)),
                            // Replaced since: a later event of this watch brings what did.
                            None => continue,
                        },
                        EventKind::Delete => Observed::absent(revision),
                    };
                    return Ok(Input::State(observed));
                }
                event = next_event(prefix) => {
                    let event = event?;
                    return Ok(Input::KeyEvent { kind: event.kind, created: event.kv.version == 1 });
                }
                _ = sleep_until(until) => return Ok(Input::Timer),
            }
        }
    }
}

/// Writes `value` under `key` (with precondition `mode`), bound to the lease `bind` says
/// (`session`: this call's).
async fn put(
    ctx: &Context,
    session: LeaseId,
    key: &[u8],
    value: &[u8],
    mode: PutMode,
    bind: Bind,
) -> Result<Input> {
    let kv = &*ctx.kv;
    let (outcome, lease) = match bind {
        Bind::Session => {
            let options = PutOptions { mode, lease: Some(session) };
            (kv.put(key, value, options).await?, Some(session))
        }
        // Boxed: a few writes per round take it, and inline it would size every call's future.
        Bind::RunLease => Box::pin(put_with_run_lease(&ctx.run_lease, kv, key, value, mode)).await?,
        Bind::Fresh(ttl) => {
            let lease = kv.lease_grant(ttl).await?;
            (kv.put(key, value, PutOptions { mode, lease: Some(lease) }).await?, Some(lease))
        }
    };
    Ok(Input::Put(outcome, lease))
}

/// Writes `state` under `key` as [`put`] does, its member list first where the list is long
/// (`State::value_to_write`); the pieces written for a value that lost are deleted again.
async fn put_state(
    ctx: &Context,
    session: LeaseId,
    key: &[u8],
    state: &State,
    mode: PutMode,
    bind: Bind,
) -> Result<Input> {
    let kv = &*ctx.kv;
    let inline = ctx.params.members_inline_bytes;
    let (value, pieces) = state.value_to_write(kv, &ctx.keys, inline, &ctx.run_lease).await?;
    let input = put(ctx, session, key, &value, mode, bind).await?;
    if let (Input::Put(PutOutcome::Conflict { .. }, _), Some(pieces)) = (&input, pieces) {
        // Another value won: nobody will read these. Best effort: what remains goes with the
        // round.
        let _ = kv.delete_prefix(&pieces).await;
    }
    Ok(input)
}

/// Deletes what a failed call left: each key that is still bound to the call's session (a
/// read, then a delete by revision, within one bound per key); `false` if something may remain.
pub(crate) async fn clean(leftovers: Leftovers, kv: &dyn Kv) -> bool {
    const BOUND: Duration = Duration::from_millis(500);
    let mut clean = true;
    for key in &leftovers.keys {
        let undo = async {
            match kv.get(key).await?.kv {
                Some(found) if found.lease == Some(leftovers.session) => {
                    kv.delete(key, DeleteMode::IfRevision(found.mod_revision)).await.map(|_| ())
                }
                _ => Ok(()),
            }
        };
        clean &= matches!(tokio::time::timeout(BOUND, undo).await, Ok(Ok(())));
    }
    clean
}

/// Whether process `pid` runs on this machine, as Linux's `/proc` tells; `true` wherever that
/// cannot be told (no `/proc`): the caller then waits, as it would for a live process.
fn process_alive(pid: u32) -> bool {
    let proc = std::path::Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// The next event of `watch` (pending forever without one).
async fn next_event(watch: &mut Option<Watch>) -> crate::kv::KvResult<crate::kv::Event> {
    match watch {
        Some(watch) => watch.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A TCP port free on this machine now: what a worker offers in its descriptor, and rank
/// 0's becomes `MASTER_PORT`. The one place rdzv picks a port. Fails only if no port can
/// be bound at all.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("0.0.0.0", 0))?.local_addr()?.port())
}
