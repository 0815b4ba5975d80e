//! `rdzv run`: an elastic agent in the spirit of `torchrun` — one rendezvous member per
//! node, which starts the node's local workers with torchrun's environment, restarts them
//! when the group changes, and closes the run when every worker succeeded.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use rdzv::{ConfigError, HealthParams, Rendezvous, RendezvousParams, Round, Store, StoreError};
use rdzv_core::RendezvousUrl;
use rdzv_core::retry::RetryPolicy;
use tokio::process::Command;
use tokio::time::Instant;

use crate::agent::{Agent, Config, Decision, Event, describe};
use crate::exit::{CliError, one_line};
use crate::observe::Observe;
use crate::progress::Progress;
use crate::ranks::{Assignment, NProc, RoleInfo};
use crate::signals::{Caught, Signals};
use crate::slurm::{self, SlurmStep};
use crate::target;
use crate::workers::{Group, Logs, WorkerExit, WorkerSpec, read_error_file};

/// Store key (in the round's Store) where an agent whose worker failed says so.
const FAILED_KEY: &str = "rdzv_run/failed";
/// Store key (in the round's Store) where an agent that saw nodes waiting says that it
/// re-forms the group to admit them, so that the others do not count it as a restart.
const REGROUP_KEY: &str = "rdzv_run/regroup";
/// Store barrier that every agent whose workers all succeeded reaches.
const FINISHED_KEY: &str = "rdzv_run/finished";

const LONG_ABOUT: &str = "\
An elastic agent, in the spirit of torchrun: run one per node. The agents are the members
of the rendezvous; each starts --nproc-per-node local workers (the command, N times) with
torchrun's environment, so an unmodified torchrun training script runs under it:
  RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,
  ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
  TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE=False,
  TORCHELASTIC_ERROR_FILE (one per worker), TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and
  OMP_NUM_THREADS=1 (with more than one worker; both unless already set), and
  RDZV_RUN_ID, RDZV_VERSION, RDZV_NODE_ID, RDZV_SEGMENT (empty without one),
  RDZV_RESTART_COUNT, and what changed since the
  round before as this node knew it: RDZV_PREVIOUS_VERSION (empty in its first round),
  RDZV_PREVIOUS_GROUP_RANK and RDZV_PREVIOUS_RANK (this node's and this worker's rank then;
  empty if the node was not a member), RDZV_LEFT_GROUP_RANKS and RDZV_JOINED_GROUP_RANKS
  (comma-separated group ranks of the nodes gone since, and of the nodes new in this round).
A node that was a member keeps its GROUP_RANK while it is below the new number of nodes;
spares and new nodes take the free group ranks, in order of arrival.
GROUP_RANK is the agent's rank in the round; the workers of group rank g get the global
ranks after those of the nodes before it (RANK = that offset + LOCAL_RANK), so nodes may run
different numbers of workers. Each agent writes its number of workers once to the round's
Store. --nproc-per-node auto is the number of entries in CUDA_VISIBLE_DEVICES when set, else
the GPUs that `nvidia-smi -L` lists, else the number of CPUs.

The workers inherit the agent's environment without the backend's password: RDZV_PASSWORD
is removed, and RDZV_URL is passed on with its password replaced by *** (removed entirely
if it does not parse). None of the variables above carries the URL. A password written in
the URL on the command line stays visible to anyone who can list processes: prefer
  password_file=<path>  (URL option: the file holds the password; a trailing newline is
                         dropped)
  RDZV_PASSWORD=<pw>    (environment; used when the URL gives no password and names a
                         user, or is redis:// or rediss://)

Process control: each worker runs in its own process group; stopping it sends SIGTERM to
the group (its children too), then SIGKILL after --grace-period. SIGINT is passed on to the
workers as SIGINT; SIGTERM, SIGHUP and SIGQUIT as SIGTERM; the agent then leaves the run
and exits with the workers' status (or 128+N for signal N). SIGUSR1 and SIGUSR2 are passed on
to the workers' process groups and change nothing else (Slurm's --signal=USR1@120 warns of
the job's end so: a script can checkpoint); one that comes while no workers run is dropped,
said on stderr. A worker whose agent dies (even
by SIGKILL) is killed, with everything it started in its process group (a parent-death
signal, and a guard process in each group that kills the group when the agent is gone), so
no worker trains alone; only processes a worker moved to another process group are not
covered.

Logs: without --log-dir the workers write to the agent's stdout and stderr. With
--log-dir DIR each worker writes DIR/attempt_<k>/<local_rank>/stdout.log and stderr.log (k
is the restart count; a group re-formed to admit waiting nodes reuses its attempt's files),
and its error file is DIR/attempt_<k>/<local_rank>/error.json (else in a temporary
directory). --tee also copies every line to the agent's output, prefixed with [<rank>]:.

While the workers run, the agent watches its round. When the round breaks (a node died or
left), or a worker failed here or on another node, or nodes wait to be admitted (checked
every --monitor-interval), it stops its workers and re-rendezvous. Rounds broken by a death
or a failure count as restarts (at most --max-restarts); re-forming to admit waiting nodes
does not. A node cut off from the backend for longer than keep_alive_ttl is no member any
more: it stops its workers at once (fencing: SIGTERM, then SIGKILL after --grace-period) and
rejoins when it can reach the backend again, without counting a restart. A failure is reported with the worker's rank, its exit status or signal, and the
error and traceback from its error file when it wrote one (PyTorch's @record does).

Nodes beyond max_workers wait as spares: a full round is not re-formed for them; when a node
dies or leaves, the spare that came first takes its place (and its group rank), and the
other nodes keep theirs. A spare waits as long as the run lasts (its timeout does not run
while the round it waits behind is full).

Health gates: --health-check CMD (or the URL's health_check) runs CMD with `sh -c` before
each join, every --health-check-interval while the node waits, and every interval while its
workers run (--health-check builtin:gpu,disk:/tmp:10G,store for the built-in checks, see
`rdzv health --help`; repeat the flag to combine). A failed check (exit status not 0, a
signal, or still running at --health-check-timeout: then it is killed with its process
group) keeps the node out: it does not join, says why on stderr, records itself as excluded
(`rdzv status` shows it, with the reason) and checks again every interval; a waiting node or
spare that fails withdraws. A member that fails --health-check-failures checks in a row stops
its workers (SIGTERM, --grace-period, SIGKILL), leaves its round at once (the others re-form
without waiting for its TTL, a spare taking its group rank) and rejoins once healthy, counting
no restart. A check that cannot run at all the first time (`not found`) is an error (exit 2).

When all its workers exit 0, the agent reports success in the round's Store and waits (at
most --finish-timeout) until every node's did; then it closes the run (as succeeded) and
exits 0; spares and nodes still waiting to join then exit 0 too. When a worker fails and no
restarts are left, the agent closes the run (as failed) and exits with that worker's status
(128+N if a signal N ended it); the other members then exit with code 4 (or 1 if their own
restarts are used up too), a spare that never was a member with 0. A closed run stays closed
for run_ttl (2 h unless the URL says otherwise) after its last node is gone.

Observability (docs/OBSERVABILITY.md): --metrics-addr HOST:PORT serves Prometheus metrics
at http://HOST:PORT/metrics (rounds formed and how long they took, members lost, restarts by
cause, worker exits by status, members, spares and waiting nodes, backend operations and
their latency, lease refresh failures); --events FILE appends one JSON line per event (round
formed, spare promoted, member lost, restart, worker exited, nodes waiting, run closed,
lease refresh failed), or writes them to stderr with --events -.

Under Slurm (SLURM_JOB_ID and SLURMD_NODENAME set, as in `srun --ntasks-per-node=1 rdzv run
...`): the node id defaults to NODE-JOB.STEP (-rN added after the job's N-th requeue, so a
requeued job's nodes are new nodes while an agent restarted within its step keeps its place),
the address to the node's NodeAddr (`scontrol show node`), the URL's node_index to the node's
place in SLURM_JOB_NODELIST, and rank_order to `slurm` (newcomers in Slurm's node order)
unless the URL names a rank_order or the node a segment. --node-id, --local-addr and the
URL's options replace each default; the agent says on stderr what it took (docs/SLURM.md).

torchrun flags: --nnodes MIN:MAX is min_workers/max_workers in the URL (they count nodes),
--rdzv-id is the URL's run id, --rdzv-endpoint its host:port; --nproc-per-node, --max-restarts,
--monitor-interval, --role, --log-dir and --tee are the same here.

Example:
  rdzv run 'etcd://10.0.0.5:2379/job42?min_workers=2&max_workers=4' --nproc-per-node 8 -- python train.py";

/// Arguments of `rdzv run`.
#[derive(Debug, clap::Args)]
#[command(about = "Run workers on every node, elastically (like torchrun)", long_about = LONG_ABOUT)]
pub struct RunArgs {
    /// The rendezvous URL (default: $RDZV_URL); its min_workers/max_workers count nodes.
    #[arg(env = "RDZV_URL", hide_env_values = true, value_name = "URL")]
    url: String,
    /// How many workers to start on this node: a number, or `auto` (one per visible GPU,
    /// else one per CPU).
    #[arg(long, default_value = "1", value_name = "N|auto", value_parser = crate::ranks::parse_nproc)]
    nproc_per_node: NProc,
    /// The workers' role (ROLE_NAME); ROLE_RANK counts the workers of this role only.
    #[arg(long, default_value = "default", value_name = "NAME", value_parser = crate::args::role)]
    role: String,
    /// How many times the group may be restarted after a death or a failure.
    #[arg(long, default_value_t = 3, value_name = "K")]
    max_restarts: u32,
    /// How often to check for nodes waiting to join.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = crate::args::positive_duration)]
    monitor_interval: Duration,
    /// How long the workers get to exit after SIGTERM before they are killed.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::args::duration)]
    grace_period: Duration,
    /// How long a node whose workers succeeded waits for the other nodes' to succeed.
    #[arg(long, default_value = "30m", value_name = "DURATION", value_parser = crate::args::duration)]
    finish_timeout: Duration,
    /// Write each worker's stdout and stderr to DIR/attempt_K/LOCAL_RANK/stdout.log and
    /// stderr.log (K: the restart count). Without it only the error files are kept, in
    /// $TMPDIR/rdzv-run-* (else /tmp), removed at exit, or by the next agent to start on the
    /// machine if this one is killed.
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Also copy the workers' output to this agent's, each line prefixed with the worker's
    /// rank in brackets and a colon.
    #[arg(long)]
    tee: bool,
    /// This node's id (unique within the run; default: host-pid-random; under Slurm:
    /// NODE-JOB.STEP, with -rN after the job's N-th requeue).
    #[arg(long, value_name = "ID", value_parser = crate::args::node_id)]
    node_id: Option<String>,
    /// The address this node advertises (MASTER_ADDR when it is group rank 0; default: host
    /// name; under Slurm: the node's NodeAddr, from `scontrol show node`).
    #[arg(long, value_name = "ADDR")]
    local_addr: Option<String>,
    /// The segment of the hardware this node is in (an NVLink domain, a rack): the nodes of a
    /// segment get consecutive group ranks. `auto`: the GPUs' NVLink domain, from
    /// `nvidia-smi -q`. Replaces the URL's segment; empty is none.
    #[arg(long, env = "RDZV_SEGMENT", value_name = "LABEL|auto", value_parser = crate::args::segment)]
    segment: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (port 0: a free port, printed).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    /// Append one JSON line per event to FILE (`-`: write them to stderr).
    #[arg(long, value_name = "FILE|-")]
    events: Option<PathBuf>,
    /// Check this node's health before each join, every interval while it waits, and every
    /// interval while it is a member: a shell command (healthy when it exits 0), or
    /// `builtin:` and built-in checks joined by `,` or `+` (gpu, gpu:N, disk:PATH:MIN,
    /// store, store:BOUND). Repeat to combine. Replaces the URL's health_check; empty is none.
    #[arg(long, env = "RDZV_HEALTH_CHECK", value_name = "CMD|builtin:LIST", value_parser = crate::args::health_check)]
    health_check: Vec<String>,
    /// How long the checks may take, together, before they are killed and count as failed
    /// [default: the URL's health_check_timeout, else 60s].
    #[arg(long, value_name = "DURATION", value_parser = crate::args::positive_duration)]
    health_check_timeout: Option<Duration>,
    /// How often the checks run while the node waits, is excluded, or is a member
    /// [default: the URL's health_check_interval, else 30s].
    #[arg(long, value_name = "DURATION", value_parser = crate::args::positive_duration)]
    health_check_interval: Option<Duration>,
    /// How many failed checks in a row make a member stop its workers and leave its round
    /// [default: the URL's health_check_failures, else 2].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    health_check_failures: Option<u32>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "CMD")]
    command: Vec<String>,
}

/// What stays the same across the agent's rounds.
struct Setup {
    /// This binary, which starts each worker (`rdzv __exec`).
    exe: PathBuf,
    /// How many workers this node runs.
    nproc: usize,
    logs: Logs,
    /// The agent's own `RDZV_URL`, to pass on redacted.
    rdzv_url: Option<std::ffi::OsString>,
    /// Whether SIGUSR1 and SIGUSR2 reach the workers without the agent: Slurm signals every
    /// process of a step (unless its process tracking is by process group).
    notices_reach_workers: bool,
}

/// Runs `rdzv run`.
pub async fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let mut signals =
        Signals::catch_with_notices().map_err(|e| CliError::other(format!("cannot catch signals: {e}")))?;
    let step = SlurmStep::from_env(|name| std::env::var(name).ok());
    let slurm = slurm::Defaults::of(step.as_ref(), args.local_addr.is_some()).await;
    let setup = prepare(&args, slurm.notices_reach_workers)?;
    let observe = Observe::start(args.metrics_addr.as_deref(), args.events.as_deref()).await?;
    let url_orders =
        RendezvousUrl::parse(&args.url).is_ok_and(|u| u.rendezvous_options.contains_key("rank_order"));
    let place = |params: &mut RendezvousParams| {
        flags_over_url(&args, setup.nproc, params)?;
        slurm.fill(params, url_orders);
        Ok(())
    };
    let worker = target::worker_on(&args.url, args.node_id.clone(), args.local_addr.clone(), place, |kv| {
        observe.instrument(kv)
    })
    .await?;
    if let Some(step) = &step {
        eprintln!("rdzv: {}", step.taken(worker.params(), worker.participant()));
    }
    observe.attach(&worker);
    let result = agent(&args, &setup, &worker, &observe, &mut signals).await;
    if let Err(e) = worker.shutdown().await {
        tracing::warn!("leaving the run: {e}");
    }
    observe.finish();
    result
}

/// The command line's flags over the URL's options: the segment, and the health gate.
fn flags_over_url(args: &RunArgs, nproc: usize, params: &mut RendezvousParams) -> Result<(), ConfigError> {
    if let Some(segment) = args.segment.as_ref().filter(|s| !s.is_empty()) {
        params.segment = Some(segment.clone());
    }
    health_from_flags(args, nproc, params)
}

/// The health gate of the URL (`health_check*` options) with the command line's flags over
/// it; a bare `gpu` check expects `nproc` GPUs. A timing flag without any check is an error.
fn health_from_flags(args: &RunArgs, nproc: usize, params: &mut RendezvousParams) -> Result<(), ConfigError> {
    let checks: Vec<String> = args.health_check.iter().filter(|c| !c.is_empty()).cloned().collect();
    if !checks.is_empty() {
        let health = params.health.get_or_insert_with(|| HealthParams::new(""));
        health.checks = checks;
    }
    let flags = [
        ("--health-check-timeout", args.health_check_timeout.is_some()),
        ("--health-check-interval", args.health_check_interval.is_some()),
        ("--health-check-failures", args.health_check_failures.is_some()),
    ];
    let Some(health) = params.health.as_mut() else {
        return match flags.into_iter().find(|(_, given)| *given) {
            Some((flag, _)) => Err(ConfigError::InvalidValue {
                option: flag.into(),
                value: String::new(),
                reason: "has no effect without --health-check (or the URL's health_check)".into(),
            }),
            None => Ok(()),
        };
    };
    health.timeout = args.health_check_timeout.unwrap_or(health.timeout);
    health.interval = args.health_check_interval.unwrap_or(health.interval);
    health.failures = args.health_check_failures.unwrap_or(health.failures);
    health.gpus = nproc;
    Ok(())
}

/// Checks what can be checked before joining: a node that cannot start its workers must
/// not join and make the others wait for it. `notices_reach_workers`: see [`Setup`].
fn prepare(args: &RunArgs, notices_reach_workers: bool) -> Result<Setup, CliError> {
    let program = &args.command[0];
    crate::workers::find_program(program)
        .map_err(|e| CliError::other(format!("cannot start `{program}`: {e}")))?;
    let exe = std::env::current_exe().map_err(|e| {
        CliError::other(format!("cannot find the rdzv binary to start the workers with: {e}"))
    })?;
    let nproc = match args.nproc_per_node {
        NProc::Count(n) => n,
        NProc::Auto => {
            let (n, from) = crate::ranks::detect();
            eprintln!("rdzv: --nproc-per-node auto: {n} worker(s), from {from}");
            n
        }
    };
    let logs = Logs::new(args.log_dir.as_deref(), args.tee).map_err(|e| {
        let dir = args.log_dir.as_ref().map_or("a temporary directory".into(), |d| d.display().to_string());
        CliError::other(format!("cannot create the log directory {dir}: {e}"))
    })?;
    Ok(Setup { exe, nproc, logs, rdzv_url: std::env::var_os("RDZV_URL"), notices_reach_workers })
}

/// The agent: carries out what [`Agent`] decides, one decision at a time, and tells it what
/// came of each.
async fn agent(
    args: &RunArgs,
    setup: &Setup,
    worker: &Rendezvous,
    observe: &Observe,
    signals: &mut Signals,
) -> Result<ExitCode, CliError> {
    let config = Config {
        run_id: worker.params().run_id.clone(),
        max_restarts: args.max_restarts,
        nproc: setup.nproc,
        program: args.command[0].clone(),
    };
    let (mut agent, mut decision) = Agent::new(config);
    let me = RoleInfo { role: args.role.clone(), local_world_size: setup.nproc };
    // The round this node is a member of, and its workers' ranks there.
    let mut round: Option<Round> = None;
    let mut assignment: Option<Assignment> = None;
    // This node's place in its last round.
    let mut previous: Option<Placement> = None;
    loop {
        tracing::debug!(?decision, "agent decision");
        observe.decision(worker, &decision, agent.restarts(), args.max_restarts);
        if let Some(say) = decision.say() {
            eprintln!("rdzv: {say}");
        }
        let event = match decision {
            Decision::Join { .. } => {
                (round, assignment) = (None, None);
                match form_round(worker, signals).await {
                    Ok(formed) => {
                        let info = &formed.info;
                        let event = Event::Formed {
                            version: info.version,
                            rank: info.rank,
                            world_size: info.world_size,
                        };
                        round = Some(formed);
                        event
                    }
                    Err(event) => event,
                }
            }
            Decision::ExchangeRanks => {
                let (event, assigned) = exchange_ranks(worker, held(&round)?, &me, signals).await;
                assignment = assigned;
                event
            }
            Decision::StartWorkers { .. } => {
                let assigned =
                    assignment.as_ref().ok_or_else(|| internal("no ranks to start the workers with"))?;
                let round = held(&round)?;
                let before = previous.filter(|p| p.is_compared_with(round));
                previous = Some(Placement { version: round.info.version, base_rank: assigned.base_rank });
                let restarts = agent.restarts();
                let launch = Launch { args, setup, worker, round, assignment: assigned, restarts, before };
                run_workers(&launch, observe, signals).await
            }
            Decision::AwaitFinish => finish(args, worker, held(&round)?, signals).await,
            Decision::CheckFailure => Event::FailureMark {
                published: held(&round)?.store.check([FAILED_KEY]).await.unwrap_or(true),
            },
            Decision::CheckRegroup => {
                let store = &held(&round)?.store;
                let regroup = store.check([REGROUP_KEY]).await.unwrap_or(false);
                let failed = store.check([FAILED_KEY]).await.unwrap_or(true);
                Event::RegroupMarks { regroup, failed }
            }
            Decision::PublishFailure { summary, .. } => {
                publish_failure(held(&round)?, &summary).await;
                Event::FailurePublished
            }
            Decision::Close { outcome, .. } => Event::RunClosed(worker.set_closed_with(outcome).await),
            Decision::Exit { exit, .. } => return exit.map(ExitCode::from),
        };
        decision = agent.on(event);
    }
}

/// The round a decision is about (every decision after [`Event::Formed`] has one).
fn held(round: &Option<Round>) -> Result<&Round, CliError> {
    round.as_ref().ok_or_else(|| internal("no round to act in"))
}

fn internal(what: &str) -> CliError {
    CliError::other(format!("internal error: the agent has {what}; please report it"))
}

/// Forms the next round (with a progress line meanwhile).
async fn form_round(worker: &Rendezvous, signals: &mut Signals) -> Result<Round, Event> {
    let _progress = Progress::start(worker, Instant::now());
    tokio::select! {
        r = worker.next_rendezvous() => r.map_err(Event::JoinFailed),
        s = signals.recv() => Err(Event::Signal(s)),
    }
}

/// Tells the other nodes this node's number of workers and learns theirs: this node's
/// workers' ranks, unless the round broke meanwhile.
async fn exchange_ranks(
    worker: &Rendezvous,
    round: &Round,
    me: &RoleInfo,
    signals: &mut Signals,
) -> (Event, Option<Assignment>) {
    let info = &round.info;
    let exchanged = tokio::select! {
        infos = crate::ranks::exchange(&round.store, info.rank, info.world_size, me, worker.params().timeout) => infos,
        reason = worker.round_broken() => return (Event::BrokenBeforeStart(reason), None),
        s = signals.recv() => return (Event::Signal(s), None),
    };
    match exchanged {
        Ok(infos) => match crate::ranks::assign(&infos, info.rank) {
            Some(assignment) => {
                let event =
                    Event::Assigned { base_rank: assignment.base_rank, world_size: assignment.world_size };
                (event, Some(assignment))
            }
            None => (Event::RankOutOfRange, None),
        },
        Err(what) => (Event::ExchangeFailed(what), None),
    }
}

/// This node's place in a round it was a member of: the round, and the global rank of its
/// local rank 0 there (what `RDZV_PREVIOUS_RANK` counts from).
#[derive(Clone, Copy, Debug)]
struct Placement {
    version: u64,
    base_rank: usize,
}

impl Placement {
    /// Whether `round`'s changes are counted from this one, with this node a member of it.
    fn is_compared_with(&self, round: &Round) -> bool {
        let changes = &round.info.changes;
        changes.previous_rank.is_some() && changes.previous_version == Some(self.version)
    }
}

/// One start of this node's workers in a round: what their environment and their
/// supervision need.
struct Launch<'a> {
    args: &'a RunArgs,
    setup: &'a Setup,
    worker: &'a Rendezvous,
    round: &'a Round,
    /// Their ranks.
    assignment: &'a Assignment,
    /// Restarts used so far (`TORCHELASTIC_RESTART_COUNT`).
    restarts: u32,
    /// This node's place in the round the changes are counted from, if it was a member.
    before: Option<Placement>,
}

/// Starts this node's workers and watches them until they end or must be stopped (then
/// stops them).
async fn run_workers(launch: &Launch<'_>, observe: &Observe, signals: &mut Signals) -> Event {
    let Launch { args, setup, assignment, restarts, .. } = *launch;
    let specs = (0..setup.nproc)
        .map(|local_rank| WorkerSpec {
            local_rank,
            rank: assignment.base_rank + local_rank,
            env: launch.worker_env(local_rank),
        })
        .collect();
    let hide = |cmd: &mut Command| hide_credentials(cmd, setup.rdzv_url.clone());
    match Group::start(&setup.exe, &args.command, specs, &setup.logs, restarts, hide) {
        Ok(mut group) => supervise(launch, observe, &mut group, signals).await,
        Err(e) => Event::StartFailed(format!("cannot start the workers (`{}`): {e}", args.command[0])),
    }
}

/// A worker's failure: one line for the other agents, and the full report for this agent's
/// stderr (with the error and traceback from its error file, when it wrote one).
fn failure_report(exit: &WorkerExit, node: &str, round: &Round, restarts: u32) -> (String, String) {
    let mut what = format!(
        "rank {} (local rank {} on node {node}) of round {} failed (restart {restarts}): it exited with {}",
        exit.rank,
        exit.local_rank,
        round.info.version,
        describe(exit.status)
    );
    let mut report = what.clone();
    if let Some(error) = read_error_file(&exit.error_file) {
        if !error.message.is_empty() {
            what.push_str(&format!(": {}", one_line(&error.message)));
            report.push_str(&format!("\n  error: {}", error.message));
        }
        if let Some(traceback) = error.traceback {
            report.push_str(&format!("\n  traceback (from {}):\n", exit.error_file.display()));
            for line in traceback.trim_end().lines() {
                report.push_str(&format!("    {line}\n"));
            }
            report.truncate(report.trim_end().len());
        }
    }
    (what, report)
}

/// The command inherits the agent's environment, which may hold the backend's password:
/// `RDZV_PASSWORD` is removed, and `RDZV_URL` (`rdzv_url`, the agent's own value) is
/// passed on with its password replaced by `***` — or removed if it does not parse, since
/// then where a password ends cannot be told.
fn hide_credentials(cmd: &mut Command, rdzv_url: Option<std::ffi::OsString>) {
    cmd.env_remove(rdzv_core::url::PASSWORD_ENV);
    let Some(url) = rdzv_url else { return };
    match url.to_str().and_then(rdzv_core::url::redact_url_text) {
        Some(redacted) => cmd.env("RDZV_URL", redacted),
        None => cmd.env_remove("RDZV_URL"),
    };
}

impl Launch<'_> {
    /// The environment of local worker `local_rank` (torchrun's names, then rdzv's; the error
    /// file is added by [`Group::start`]).
    fn worker_env(&self, local_rank: usize) -> Vec<(&'static str, String)> {
        let Launch { args, setup, worker, round, assignment: a, restarts, before } = *self;
        let changes = &round.info.changes;
        let ranks = crate::output::rank_list;
        let mut env = vec![
            ("RANK", (a.base_rank + local_rank).to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("WORLD_SIZE", a.world_size.to_string()),
            ("LOCAL_WORLD_SIZE", setup.nproc.to_string()),
            ("GROUP_RANK", round.info.rank.to_string()),
            ("GROUP_WORLD_SIZE", round.info.world_size.to_string()),
            ("ROLE_RANK", (a.base_role_rank + local_rank).to_string()),
            ("ROLE_WORLD_SIZE", a.role_world_size.to_string()),
            ("ROLE_NAME", args.role.clone()),
            ("MASTER_ADDR", round.bootstrap.master_addr.clone()),
            ("MASTER_PORT", round.bootstrap.master_port.to_string()),
            ("TORCHELASTIC_RUN_ID", round.info.run_id.clone()),
            ("TORCHELASTIC_RESTART_COUNT", restarts.to_string()),
            ("TORCHELASTIC_MAX_RESTARTS", args.max_restarts.to_string()),
            // The workers make their own store at MASTER_ADDR:MASTER_PORT (rank 0 hosts it).
            ("TORCHELASTIC_USE_AGENT_STORE", "False".into()),
            ("RDZV_RUN_ID", round.info.run_id.clone()),
            ("RDZV_VERSION", round.info.version.to_string()),
            ("RDZV_NODE_ID", worker.participant().node.clone()),
            ("RDZV_SEGMENT", worker.participant().segment.clone().unwrap_or_default()),
            ("RDZV_RESTART_COUNT", restarts.to_string()),
            ("RDZV_PREVIOUS_VERSION", changes.previous_version.map_or(String::new(), |v| v.to_string())),
            ("RDZV_PREVIOUS_GROUP_RANK", changes.previous_rank.map_or(String::new(), |r| r.to_string())),
            ("RDZV_PREVIOUS_RANK", before.map_or(String::new(), |p| (p.base_rank + local_rank).to_string())),
            ("RDZV_LEFT_GROUP_RANKS", ranks(&changes.left)),
            ("RDZV_JOINED_GROUP_RANKS", ranks(&changes.joined)),
        ];
        // As torchrun does, unless the user chose otherwise.
        if std::env::var_os("TORCH_NCCL_ASYNC_ERROR_HANDLING").is_none() {
            env.push(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".into()));
        }
        if setup.nproc > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
            env.push(("OMP_NUM_THREADS", "1".into()));
        }
        env
    }
}

/// Waits for the workers to end or for a reason to stop them (then stops them).
async fn supervise(
    launch: &Launch<'_>,
    observe: &Observe,
    group: &mut Group,
    signals: &mut Signals,
) -> Event {
    let Launch { args, setup, worker, round, restarts, .. } = *launch;
    let over = round_over(worker, round, args.monitor_interval);
    // Only read when observed; never resolves.
    let reported = observe.nodes_waiting(worker, args.monitor_interval);
    tokio::pin!(over, reported);
    for notice in signals.stale_notices() {
        eprintln!("rdzv: {} came while no workers ran: not passed on", notice.name());
    }
    let stop_reason = loop {
        // Signals first: Slurm's scancel signals the agent and its workers together, and a
        // worker ended by it is no failure to report when the agent is told to stop.
        tokio::select! {
            biased;
            caught = signals.recv_or_notice() => match caught {
                Caught::End(signal) => {
                    let status = group.stop(signal.forwarded(), args.grace_period).await;
                    return Event::Interrupted { signal, status };
                }
                Caught::Notice(notice) if setup.notices_reach_workers => {
                    eprintln!("rdzv: {} reaches the workers from Slurm itself: not passed on again", notice.name());
                }
                Caught::Notice(notice) => {
                    eprintln!("rdzv: passing {} on to the workers", notice.name());
                    group.signal(notice.signal());
                }
            },
            exit = group.next_exit() => match exit {
                Some(exit) => {
                    observe.worker_exited(worker, &exit);
                    if !exit.status.success() {
                        break Err(exit);
                    }
                }
                None => break Ok(Event::WorkersSucceeded),
            },
            () = &mut reported => {}
            event = &mut over => break Ok(event),
        }
    };
    group.stop(rustix::process::Signal::TERM, args.grace_period).await;
    stop_reason.unwrap_or_else(|exit| {
        let (summary, report) = failure_report(&exit, &worker.participant().node, round, restarts);
        Event::WorkerFailed { rank: exit.rank, status: exit.status, summary, report }
    })
}

/// Resolves with why the workers of `round` must stop, as the round tells: it broke
/// ([`Event::Broken`]), a peer's worker failed ([`Event::PeerFailed`]), or the group re-forms
/// to admit waiting nodes ([`Event::NodesWaiting`]: found here every `interval`, and the other
/// agents told, or told by one of them). Each wait is polled beside the others: a check or a
/// write stuck on an unreachable backend must not keep the agent from seeing its round broken
/// (or its lease lost: fencing) meanwhile.
async fn round_over(worker: &Rendezvous, round: &Round, interval: Duration) -> Event {
    tokio::select! {
        reason = worker.round_broken() => Event::Broken(reason),
        what = peer_failure(round.store.clone()) => Event::PeerFailed(what),
        _ = key_appears(round.store.clone(), REGROUP_KEY) => Event::NodesWaiting(None),
        k = tell_regroup(round, nodes_waiting(worker, interval)) => Event::NodesWaiting(Some(k)),
    }
}

/// Resolves with how many nodes wait to be admitted, once a check every `interval` finds
/// some (spares behind a full round are not counted: see `num_nodes_waiting`).
async fn nodes_waiting(worker: &Rendezvous, interval: Duration) -> usize {
    let mut tick = tokio::time::interval_at(Instant::now() + interval, interval);
    loop {
        tick.tick().await;
        match worker.num_nodes_waiting().await {
            Ok(0) => {}
            Ok(k) => return k,
            Err(e) => tracing::warn!("checking for waiting nodes: {e}"),
        }
    }
}

/// Resolves with what `waiting` finds (how many nodes wait), once the other agents of `round`
/// are told that this one re-forms the group to admit them (or telling them failed): they
/// then do not count it as a restart.
async fn tell_regroup(round: &Round, waiting: impl std::future::Future<Output = usize>) -> usize {
    let k = waiting.await;
    if let Err(e) = round.store.set(REGROUP_KEY, k.to_string()).await {
        tracing::warn!("telling the other agents about the regroup: {e}");
    }
    k
}

/// Resolves with the message of the first node that published a failure in `store`.
async fn peer_failure(store: Store) -> String {
    String::from_utf8_lossy(&key_appears(store, FAILED_KEY).await).into_owned()
}

/// The pauses of [`key_appears`] after a retryable Store error: 100 ms growing to 2 s.
const KEY_RETRY: RetryPolicy = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(2));

/// Resolves with the value of `key` in `store` once it exists. The Store's own timeout (the
/// backend answered; nobody wrote the key yet) asks again; a retryable error
/// ([`StoreError::is_retryable`]: a leader election's `Busy`, a dropped connection's
/// `Unavailable`, an ended watch) is retried after [`KEY_RETRY`]'s pauses, so that a peer's
/// failure published after an election is still seen; only an error that retrying cannot fix
/// stops the watch (logged), and then this never resolves.
async fn key_appears(store: Store, key: &str) -> Vec<u8> {
    let mut failing = false;
    let retry = |e: &StoreError| {
        if e.is_timeout() {
            failing = false;
            return true;
        }
        if !e.is_retryable() {
            return false;
        }
        if std::mem::replace(&mut failing, true) {
            tracing::debug!("watching the round's Store for `{key}`: {e}; retrying");
        } else {
            tracing::warn!("watching the round's Store for `{key}`: {e}; retrying");
        }
        true
    };
    match KEY_RETRY.run(None, retry, || store.get(key)).await {
        Ok(value) => value,
        Err(e) => {
            tracing::warn!("watching the round's Store for `{key}` stopped: {e}");
            std::future::pending().await
        }
    }
}

async fn publish_failure(round: &Round, what: &str) {
    if let Err(e) = round.store.set(FAILED_KEY, what).await {
        tracing::warn!("publishing the failure to the other nodes: {e}");
    }
}

/// After this node's workers succeeded: waits until every node's did, or for what keeps
/// them from it.
async fn finish(args: &RunArgs, worker: &Rendezvous, round: &Round, signals: &mut Signals) -> Event {
    let barrier = round.store.barrier(FINISHED_KEY, round.info.world_size, args.finish_timeout);
    let failed = peer_failure(round.store.clone());
    tokio::pin!(barrier, failed);
    let broken = tokio::select! {
        biased;
        done = &mut barrier => return finished(done),
        what = &mut failed => return Event::PeerFailed(what),
        reason = worker.round_broken() => reason,
        s = signals.recv() => return Event::Signal(s),
    };
    // Ranks that passed the barrier close the run and leave: that breaks the round too, so
    // give the barrier a moment to report that everyone got there.
    match tokio::time::timeout(Duration::from_secs(2), &mut barrier).await {
        Ok(done) => finished(done),
        Err(_) => Event::BrokenWhileFinishing(broken),
    }
}

/// What the finish barrier's end means.
fn finished(done: Result<(), StoreError>) -> Event {
    match done {
        Ok(()) => Event::Finished,
        Err(e) => Event::FinishFailed(e),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rdzv_core::Kv;
    use rdzv_core::layer::FaultyKv;

    use super::*;

    /// Issue 23, item 1: a read of the round's Store that fails retryably (a leader election,
    /// a dropped connection) used to stop the watch for good, so the agent never saw a peer's
    /// failure published afterwards. Every call fails for 10 s (paused clock), then the key is
    /// set: it must be returned, after retries with pauses (neither one try nor a busy loop).
    #[tokio::test(start_paused = true)]
    async fn a_key_set_after_retryable_failures_still_appears() {
        let faulty = FaultyKv::new(Arc::new(rdzv::mem::MemKv::new()), 23);
        let store = Store::new(faulty.clone() as Arc<dyn Kv>, "s/").with_timeout(Duration::from_secs(30));
        faulty.set_failure_probability(1.0);
        let waiting = tokio::spawn(key_appears(store.clone(), FAILED_KEY));
        tokio::time::sleep(Duration::from_secs(10)).await;
        let tries = faulty.calls();
        // Pauses of 100 ms growing to 2 s (up to twice that with jitter): about 10 tries.
        assert!((3..=100).contains(&tries), "{tries} reads in 10 s of failures");
        faulty.clear();
        store.set(FAILED_KEY, "node b: exit 1").await.expect("set");
        let found = tokio::time::timeout(2 * 2 * KEY_RETRY.longest, waiting)
            .await
            .expect("the key was not seen after the failures ended")
            .expect("joined");
        assert_eq!(found, b"node b: exit 1");
    }

    /// Issue 39, defect 6: while this agent's write telling the others of a regroup hangs (a
    /// request stuck on a silent connection: etcd's client holds it for its request timeout
    /// per member tried), its lease lost must still end the round for it within the TTL —
    /// fencing is not late by that write. `a` finds `c` waiting, its write hangs, then it is
    /// cut off. (With the write awaited inside the select's arm, as before, this hung.)
    #[tokio::test(start_paused = true)]
    async fn a_hung_regroup_write_does_not_delay_a_lost_lease() {
        use rdzv::{RendezvousParams, RoundBroken};
        const TTL: Duration = Duration::from_secs(2);
        let kv: Arc<dyn Kv> = Arc::new(rdzv::mem::MemKv::new());
        let params = |node: &str| {
            let mut p = RendezvousParams::new("regroup", 2, 3).expect("params");
            p.node_id = Some(node.into());
            p.keep_alive_ttl = TTL;
            p.last_call_timeout = Duration::from_secs(1);
            p
        };
        let link = FaultyKv::new(kv.clone(), 39);
        let a = Rendezvous::new(link.clone(), params("a")).await.expect("a");
        let b = Rendezvous::new(kv.clone(), params("b")).await.expect("b");
        let (round, other) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
        let (round, _other) = (round.expect("a's round"), other.expect("b's round"));
        link.hang_next(rdzv_core::kv::Op::Put);
        let c = Rendezvous::new(kv.clone(), params("c")).await.expect("c");
        let _waits = tokio::spawn(async move { c.next_rendezvous().await });
        let over = tokio::spawn(async move { round_over(&a, &round, Duration::from_millis(500)).await });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!over.is_finished(), "the round was over before the write hung");
        assert!(link.calls() > 0);
        link.set_failure_probability(1.0);
        let event = tokio::time::timeout(TTL + Duration::from_secs(2), over)
            .await
            .expect("the lost lease waited for the hung write")
            .expect("joined");
        // Whichever the agent learns first: its own keep-alive key gone, or its lease lost.
        let over = matches!(event, Event::Broken(RoundBroken::LeaseLost | RoundBroken::MemberGone { .. }));
        assert!(over, "{event:?}");
    }

    #[test]
    fn the_command_line_needs_a_command() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let parsed = Cli::try_parse_from(["rdzv", "mem://a/b?min_workers=1", "--", "sh", "-c", "echo -n hi"]);
        let run = parsed.expect("parses").run;
        assert_eq!(run.command, ["sh", "-c", "echo -n hi"]);
        assert_eq!(run.max_restarts, 3);
        assert_eq!(run.monitor_interval, Duration::from_secs(5));
        assert_eq!(run.nproc_per_node, NProc::Count(1));
        assert_eq!(run.role, "default");
        let parsed =
            Cli::try_parse_from(["rdzv", "u", "--nproc-per-node", "auto", "--role", "trainer", "--", "x"]);
        let run = parsed.expect("parses").run;
        assert_eq!((run.nproc_per_node, run.role.as_str()), (NProc::Auto, "trainer"));
        assert!(Cli::try_parse_from(["rdzv", "u", "--nproc-per-node", "0", "--", "x"]).is_err());
        assert!(Cli::try_parse_from(["rdzv", "mem://a/b?min_workers=1"]).is_err());
    }
}
