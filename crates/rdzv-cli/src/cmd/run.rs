//! `rdzv run`: a small elastic agent in the spirit of `torchrun` — rendezvous, run the
//! command with its rank in the environment, restart it when the group changes, close the
//! run when every rank succeeded.

use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use rdzv::{Rendezvous, Round, RoundBroken, Store};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::cmd::join::why;
use crate::exit::{CliError, FAILURE};
use crate::progress::Progress;
use crate::signals::{Received, Signals, signal_group};
use crate::target;

/// Store key (in the round's Store) where a rank whose command failed says so.
const FAILED_KEY: &str = "rdzv_run/failed";
/// Store key (in the round's Store) where an agent that saw workers waiting says that it
/// re-forms the group to admit them, so that the others do not count it as a restart.
const REGROUP_KEY: &str = "rdzv_run/regroup";
/// Store barrier that every rank whose command succeeded reaches.
const FINISHED_KEY: &str = "rdzv_run/finished";

const LONG_ABOUT: &str = "\
A small elastic agent, in the spirit of torchrun. It joins the run, then starts the command
with the round in its environment: RANK, WORLD_SIZE, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1,
GROUP_RANK, MASTER_ADDR, MASTER_PORT, RDZV_RUN_ID, RDZV_VERSION, RDZV_NODE_ID and
RDZV_RESTART_COUNT. The command runs in its own process group; SIGINT/SIGTERM sent to the
agent are forwarded to it (the agent then leaves the run and exits with the command's
status).

The command inherits the agent's environment without the backend's password: RDZV_PASSWORD
is removed, and RDZV_URL is passed on with its password replaced by *** (removed entirely
if it does not parse). None of the variables above carries the URL. A password written in
the URL on the command line stays visible to anyone who can list processes: prefer
  password_file=<path>  (URL option: the file holds the password; a trailing newline is
                         dropped)
  RDZV_PASSWORD=<pw>    (environment; used when the URL gives no password and names a
                         user, or is redis:// or rediss://)

While the command runs, the agent watches its round. When the round breaks (a peer died or
left), or a peer's command failed, or workers wait to join (checked every
--monitor-interval), it stops the command (SIGTERM to its process group, SIGKILL after
--grace-period) and re-rendezvous. Rounds broken by a death or a failure count as restarts
(at most --max-restarts); re-forming to admit waiting workers does not.

When the command exits 0, the agent reports success in the round's Store and waits (at most
--finish-timeout) until every rank of the round succeeded; then it closes the run and exits
0. When the command fails, the agent publishes the failure in the round's Store (so the
other agents stop their commands and re-rendezvous too) and re-rendezvous itself; once
its restarts are used up it closes the run (the other agents then exit with code 4, or 1
if their own restarts are used up too) and exits with the command's status (128+N if a
signal N ended it). An agent killed with SIGKILL cannot stop its command: the command keeps
running until it ends by itself.

Example:
  rdzv run 'etcd://10.0.0.5:2379/job42?min_workers=2&max_workers=4' -- python train.py --epochs 3";

/// Arguments of `rdzv run`.
#[derive(Debug, clap::Args)]
#[command(about = "Run a command on every worker, elastically (like torchrun)", long_about = LONG_ABOUT)]
pub struct RunArgs {
    /// The rendezvous URL (default: $RDZV_URL).
    #[arg(env = "RDZV_URL", hide_env_values = true, value_name = "URL")]
    url: String,
    /// How many times the group may be restarted after a death or a failure.
    #[arg(long, default_value_t = 3, value_name = "K")]
    max_restarts: u32,
    /// How often to check for workers waiting to join.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = crate::args::positive_duration)]
    monitor_interval: Duration,
    /// How long the command gets to exit after SIGTERM before it is killed.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::args::duration)]
    grace_period: Duration,
    /// How long a rank whose command succeeded waits for the others to succeed.
    #[arg(long, default_value = "30m", value_name = "DURATION", value_parser = crate::args::duration)]
    finish_timeout: Duration,
    /// This worker's node id (unique within the run; default: host-pid-random).
    #[arg(long, value_name = "ID", value_parser = crate::args::node_id)]
    node_id: Option<String>,
    /// The address this worker advertises (MASTER_ADDR when it is rank 0; default: host name).
    #[arg(long, value_name = "ADDR")]
    local_addr: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "CMD")]
    command: Vec<String>,
}

/// How a supervised command ended, or why it was stopped.
enum Outcome {
    /// It exited by itself.
    Exited(ExitStatus),
    /// The agent got a signal, forwarded it, and the command then exited.
    Interrupted(Received, ExitStatus),
    /// The round is over (a member died or left, or the run was closed).
    Broken(RoundBroken),
    /// Another rank's command failed.
    PeerFailed(String),
    /// Workers wait to join (this agent saw `n` of them, or `None`: another agent did).
    Waiting(Option<usize>),
}

/// Runs `rdzv run`.
pub async fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let mut signals = Signals::catch().map_err(|e| CliError::other(format!("cannot catch signals: {e}")))?;
    let worker = target::worker(&args.url, args.node_id.clone(), args.local_addr.clone()).await?;
    let result = agent(&args, &worker, &mut signals).await;
    if let Err(e) = worker.shutdown().await {
        tracing::warn!("leaving the run: {e}");
    }
    result
}

async fn agent(args: &RunArgs, worker: &Rendezvous, signals: &mut Signals) -> Result<ExitCode, CliError> {
    let mut restarts = 0u32;
    loop {
        let started = Instant::now();
        let round = {
            let _progress = Progress::start(worker, started);
            tokio::select! {
                r = worker.next_rendezvous() => r?,
                s = signals.recv() => return Ok(ExitCode::from(s.exit_code())),
            }
        };
        eprintln!(
            "rdzv: round {} formed: rank {} of {}; starting {} (restart {restarts})",
            round.version, round.rank, round.world_size, args.command[0]
        );
        let mut child = match spawn(&args.command, worker, &round, restarts) {
            Ok(child) => child,
            Err(e) => {
                // Nothing ran, so there is nothing to restart: the job cannot work here.
                let message = format!("cannot start `{}`: {e}", args.command[0]);
                publish_failure(&round, &message).await;
                let _ = worker.set_closed().await;
                return Err(CliError { code: FAILURE, message });
            }
        };
        let outcome = supervise(args, worker, &round, &mut child, signals).await;
        let restart_reason = match outcome {
            Outcome::Interrupted(signal, status) => {
                eprintln!(
                    "rdzv: SIG{} forwarded; the command exited with {}",
                    signal.name(),
                    describe(status)
                );
                return Ok(exit_code(status));
            }
            Outcome::Waiting(seen) => {
                match seen {
                    Some(k) => {
                        eprintln!("rdzv: {k} worker(s) wait to join; re-forming the group to admit them")
                    }
                    None => eprintln!("rdzv: another agent re-forms the group to admit waiting workers"),
                }
                continue;
            }
            Outcome::Exited(status) if status.success() => match finish(args, worker, &round).await? {
                None => {
                    eprintln!("rdzv: every rank of round {} succeeded; closing the run", round.version);
                    worker.set_closed().await?;
                    return Ok(ExitCode::SUCCESS);
                }
                Some(reason) => reason,
            },
            Outcome::Exited(status) => {
                let what = format!(
                    "rank {} ({}) of round {}: the command exited with {}",
                    round.rank,
                    worker.participant().node,
                    round.version,
                    describe(status)
                );
                publish_failure(&round, &what).await;
                if restarts >= args.max_restarts {
                    eprintln!(
                        "rdzv: {what}; no restarts left (--max-restarts {}); closing the run",
                        args.max_restarts
                    );
                    worker.set_closed().await?;
                    return Ok(exit_code(status));
                }
                what
            }
            Outcome::Broken(RoundBroken::Closed) => {
                return Err(rdzv::RendezvousError::Closed { run_id: round.run_id.clone() }.into());
            }
            Outcome::Broken(reason) => format!("round {} is over: {}", round.version, why(&reason)),
            Outcome::PeerFailed(what) => what,
        };
        // A peer that left to admit waiting workers also breaks the round; that is no failure.
        let regroup = round.store.check([REGROUP_KEY]).await.unwrap_or(false);
        let failed = round.store.check([FAILED_KEY]).await.unwrap_or(true);
        if regroup && !failed {
            eprintln!("rdzv: {restart_reason}; re-forming the group to admit waiting workers");
            continue;
        }
        if restarts >= args.max_restarts {
            return Err(CliError::other(format!(
                "{restart_reason}; no restarts left (--max-restarts {})",
                args.max_restarts
            )));
        }
        restarts += 1;
        eprintln!(
            "rdzv: {restart_reason}; re-forming the group (restart {restarts} of {})",
            args.max_restarts
        );
    }
}

/// Starts the command in its own process group with the round in its environment and
/// without the backend's password (see [`hide_credentials`]).
fn spawn(command: &[String], worker: &Rendezvous, round: &Round, restarts: u32) -> std::io::Result<Child> {
    let (program, rest) = command.split_first().ok_or_else(|| std::io::Error::other("no command given"))?;
    let mut cmd = Command::new(program);
    cmd.args(rest).envs(child_env(worker, round, restarts)).process_group(0).kill_on_drop(true);
    hide_credentials(&mut cmd, std::env::var_os("RDZV_URL"));
    cmd.spawn()
}

/// The command inherits the agent's environment, which may hold the backend's password:
/// `RDZV_PASSWORD` is removed, and `RDZV_URL` (`rdzv_url`, the agent's own value) is
/// passed on with its password replaced by `***` — or removed if it does not parse, since
/// then where a password ends cannot be told.
fn hide_credentials(cmd: &mut Command, rdzv_url: Option<std::ffi::OsString>) {
    cmd.env_remove(rdzv::core::url::PASSWORD_ENV);
    let Some(url) = rdzv_url else { return };
    match url.to_str().and_then(rdzv::core::url::redact_url_text) {
        Some(redacted) => cmd.env("RDZV_URL", redacted),
        None => cmd.env_remove("RDZV_URL"),
    };
}

/// The environment the command gets.
fn child_env(worker: &Rendezvous, round: &Round, restarts: u32) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", round.rank.to_string()),
        ("WORLD_SIZE", round.world_size.to_string()),
        ("GROUP_RANK", round.rank.to_string()),
        ("LOCAL_RANK", "0".into()),
        ("LOCAL_WORLD_SIZE", "1".into()),
        ("MASTER_ADDR", round.bootstrap.master_addr.clone()),
        ("MASTER_PORT", round.bootstrap.master_port.to_string()),
        ("RDZV_RUN_ID", round.run_id.clone()),
        ("RDZV_VERSION", round.version.to_string()),
        ("RDZV_NODE_ID", worker.participant().node.clone()),
        ("RDZV_RESTART_COUNT", restarts.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", restarts.to_string()),
    ]
}

/// Waits for the command to end or for a reason to stop it (then stops it).
async fn supervise(
    args: &RunArgs,
    worker: &Rendezvous,
    round: &Round,
    child: &mut Child,
    signals: &mut Signals,
) -> Outcome {
    let mut tick = tokio::time::interval_at(Instant::now() + args.monitor_interval, args.monitor_interval);
    let broken = worker.round_broken();
    let failed = peer_failure(round.store.clone());
    let regroup = key_appears(round.store.clone(), REGROUP_KEY);
    tokio::pin!(broken, failed, regroup);
    let stop_reason = loop {
        tokio::select! {
            status = child.wait() => return match status {
                Ok(status) => Outcome::Exited(status),
                Err(e) => Outcome::PeerFailed(format!("cannot wait for the command: {e}")),
            },
            reason = &mut broken => break Outcome::Broken(reason),
            what = &mut failed => break Outcome::PeerFailed(what),
            _ = &mut regroup => break Outcome::Waiting(None),
            _ = tick.tick() => match worker.num_nodes_waiting().await {
                Ok(0) => {}
                Ok(k) => {
                    if let Err(e) = round.store.set(REGROUP_KEY, k.to_string()).await {
                        tracing::warn!("telling the other agents about the regroup: {e}");
                    }
                    break Outcome::Waiting(Some(k));
                }
                Err(e) => tracing::warn!("checking for waiting workers: {e}"),
            },
            signal = signals.recv() => {
                if let Some(pid) = child.id() {
                    signal_group(pid, signal.name()).await;
                }
                let status = stop(child, args.grace_period).await;
                return Outcome::Interrupted(signal, status);
            }
        }
    };
    if let Some(pid) = child.id() {
        signal_group(pid, "TERM").await;
    }
    stop(child, args.grace_period).await;
    stop_reason
}

/// Waits up to `grace` for the (signalled) command to exit, then kills its process group.
async fn stop(child: &mut Child, grace: Duration) -> ExitStatus {
    if let Ok(Ok(status)) = tokio::time::timeout(grace, child.wait()).await {
        return status;
    }
    if let Some(pid) = child.id() {
        signal_group(pid, "KILL").await;
    }
    let _ = child.start_kill();
    match child.wait().await {
        Ok(status) => status,
        Err(_) => std::os::unix::process::ExitStatusExt::from_raw(9),
    }
}

/// Resolves with the message of the first rank that published a failure in `store`.
async fn peer_failure(store: Store) -> String {
    String::from_utf8_lossy(&key_appears(store, FAILED_KEY).await).into_owned()
}

/// Resolves with the value of `key` in `store` once it exists (never, if the store fails).
async fn key_appears(store: Store, key: &str) -> Vec<u8> {
    loop {
        match store.get(key).await {
            Ok(v) => return v,
            Err(e) if e.is_timeout() => continue,
            Err(e) => {
                tracing::warn!("watching the round's Store for `{key}`: {e}");
                return std::future::pending().await;
            }
        }
    }
}

async fn publish_failure(round: &Round, what: &str) {
    if let Err(e) = round.store.set(FAILED_KEY, what).await {
        tracing::warn!("publishing the failure to the other ranks: {e}");
    }
}

/// After this rank's command succeeded: waits until every rank's did (`Ok(None)`), or
/// returns why the group must restart (`Ok(Some(reason))`).
async fn finish(args: &RunArgs, worker: &Rendezvous, round: &Round) -> Result<Option<String>, CliError> {
    let barrier = round.store.barrier(FINISHED_KEY, round.world_size, args.finish_timeout);
    let failed = peer_failure(round.store.clone());
    tokio::pin!(barrier, failed);
    let broken = tokio::select! {
        biased;
        done = &mut barrier => {
            done.map_err(|e| CliError::from(e).context("waiting for the other ranks to finish"))?;
            return Ok(None);
        }
        what = &mut failed => return Ok(Some(what)),
        reason = worker.round_broken() => reason,
    };
    // Ranks that passed the barrier close the run and leave: that breaks the round too, so
    // give the barrier a moment to report that everyone got there.
    if let Ok(done) = tokio::time::timeout(Duration::from_secs(2), &mut barrier).await {
        done.map_err(|e| CliError::from(e).context("waiting for the other ranks to finish"))?;
        return Ok(None);
    }
    if broken == RoundBroken::Closed && !round.store.check([FAILED_KEY]).await.unwrap_or(true) {
        return Ok(None);
    }
    Ok(Some(format!("round {} is over before every rank finished: {}", round.version, why(&broken))))
}

/// The exit code for a command's status: its code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(FAILURE)),
        (None, Some(signal)) => ExitCode::from(u8::try_from(128 + signal).unwrap_or(FAILURE)),
        (None, None) => ExitCode::from(FAILURE),
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "an unknown status".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    #[test]
    fn exit_codes_follow_the_command() {
        // Raw wait statuses: exit code N is N << 8; a signal N is N.
        assert_eq!(exit_code(ExitStatus::from_raw(0)), ExitCode::SUCCESS);
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), ExitCode::from(7));
        assert_eq!(exit_code(ExitStatus::from_raw(15)), ExitCode::from(143));
        assert_eq!(describe(ExitStatus::from_raw(9)), "signal 9");
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "status 3");
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
        assert!(Cli::try_parse_from(["rdzv", "mem://a/b?min_workers=1"]).is_err());
    }
}
