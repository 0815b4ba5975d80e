//! `rdzv join`: become one worker of a run, print the round, stay a member, leave.

use std::process::ExitCode;
use std::time::Duration;

use rdzv::{Rendezvous, RoundBroken};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::exit::{CLOSED, CliError, FAILURE};
use crate::output::{JoinFormat, RoundView, print_flush};
use crate::progress::Progress;
use crate::signals::{Signals, stdin_closed};
use crate::target;

const LONG_ABOUT: &str = "\
Joins the run as one worker and prints the round once it forms: run id, round (version),
rank, world size, participants, MASTER_ADDR/MASTER_PORT and how long it took.

Then it stays a member: for --hold, or (without --hold) until its stdin closes or it gets
SIGINT/SIGTERM; then it leaves (the run stays open; others see their round broken). If the
round breaks meanwhile (a peer died or left), it joins the next round and prints that one
too: one line (json) or block (env, text) per round. If the run is closed while it holds, it
leaves and exits 4, as when it is closed while waiting. Without --hold and with stdin closed
or /dev/null, it leaves as soon as it printed the first round.

What each round tells (json fields; env names in brackets): run_id [RDZV_RUN_ID], version
[RDZV_VERSION], rank [RANK], world_size [WORLD_SIZE], participants in rank order
[RDZV_PARTICIPANTS: their node ids, comma-separated], master_addr [MASTER_ADDR], master_port [MASTER_PORT], elapsed_ms
[RDZV_ELAPSED_MS], and what changed since the last round this worker was in:
previous_version [RDZV_PREVIOUS_VERSION], previous_rank [RDZV_PREVIOUS_RANK] (null / empty
for a newcomer), left and joined, the ranks of that round that are gone and the ranks of
this round that are new [RDZV_LEFT_RANKS, RDZV_JOINED_RANKS: comma-separated].

Examples:
  rdzv join 'etcd://10.0.0.5:2379/job42?min_workers=4' --hold 1h
  eval \"$(rdzv join \"$URL\" --format env --hold 0s)\"   # sets RANK, WORLD_SIZE, MASTER_ADDR…
      # $(…) waits for rdzv to exit, so the hold must be 0s: it leaves once it printed.
  some_launcher | rdzv join \"$URL\"    # member as long as the pipe is open

Passwords: rather than user:password@ in the URL (visible to anyone who can list
processes), use the URL option password_file=<path> (the file holds the password; a
trailing newline is dropped) or the environment variable RDZV_PASSWORD (used when the URL
gives no password and names a user, or is redis:// or rediss://), e.g.
  RDZV_PASSWORD=\"$(cat /run/secrets/etcd)\" rdzv join 'etcd://trainer@10.0.0.5:2379/job42?min_workers=4'

Exit codes: 0 joined and left, 2 bad URL or option, 3 no round formed by the timeout,
4 the run is closed, 5 the backend is unreachable, 1 anything else.";

/// Arguments of `rdzv join`.
#[derive(Debug, clap::Args)]
#[command(about = "Join a run, print the round, stay a member, then leave", long_about = LONG_ABOUT)]
pub struct JoinArgs {
    /// The rendezvous URL, e.g. etcd://host:2379/job42?min_workers=2 (default: $RDZV_URL).
    #[arg(env = "RDZV_URL", hide_env_values = true, value_name = "URL")]
    url: String,
    /// Stay a member this long after the round formed (e.g. 30s, 10m, 2h), then leave.
    /// Default: until stdin closes or SIGINT/SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = crate::args::duration)]
    hold: Option<Duration>,
    /// How to print each round.
    #[arg(long, value_enum, default_value = "json")]
    format: JoinFormat,
    /// This worker's node id (unique within the run; default: host-pid-random).
    #[arg(long, value_name = "ID", value_parser = crate::args::node_id)]
    node_id: Option<String>,
    /// The address this worker advertises to the others (default: its host name).
    #[arg(long, value_name = "ADDR")]
    local_addr: Option<String>,
}

/// Runs `rdzv join`.
pub async fn run(args: JoinArgs) -> Result<ExitCode, CliError> {
    let mut signals = Signals::catch().map_err(|e| CliError::other(format!("cannot catch signals: {e}")))?;
    let worker = target::worker(&args.url, args.node_id, args.local_addr).await?;
    let stdin_done = watch_stdin(args.hold.is_none());
    let mut hold_until: Option<Instant> = None;
    let mut printed = false;
    loop {
        let started = Instant::now();
        let waited = {
            let _progress = Progress::start(&worker, started);
            tokio::select! {
                r = worker.next_rendezvous() => Some(r),
                s = signals.recv() => {
                    leave(&worker).await;
                    return Err(CliError {
                        code: FAILURE,
                        message: format!("interrupted by SIG{} while waiting for a round; left the run", s.name()),
                    });
                }
                _ = sleep_until(hold_until) => None,
                // After the first round, a closed stdin ends the membership as in holding.
                _ = wait_closed(stdin_done.clone()), if printed => None,
            }
        };
        let Some(result) = waited else {
            // The hold ended while re-joining after a broken round.
            leave(&worker).await;
            return Ok(ExitCode::SUCCESS);
        };
        let round = match result {
            Ok(round) => round,
            Err(e) => {
                leave(&worker).await;
                return Err(e.into());
            }
        };
        print_flush(&RoundView::of(&round, started.elapsed()).render(args.format));
        printed = true;
        if hold_until.is_none() {
            hold_until = args.hold.map(|hold| Instant::now() + hold);
        }
        let broken = tokio::select! {
            reason = worker.round_broken() => Some(reason),
            _ = signals.recv() => None,
            _ = wait_closed(stdin_done.clone()) => None,
            _ = sleep_until(hold_until) => None,
        };
        match broken {
            None => {
                leave(&worker).await;
                return Ok(ExitCode::SUCCESS);
            }
            Some(RoundBroken::Closed) => {
                leave(&worker).await;
                return Err(CliError {
                    code: CLOSED,
                    message: format!(
                        "the run `{}` was closed while this worker held round {}; left",
                        round.info.run_id, round.info.version
                    ),
                });
            }
            Some(reason) => {
                eprintln!(
                    "rdzv: round {} is over ({}); joining the next round",
                    round.info.version,
                    why(&reason)
                )
            }
        }
    }
}

/// Whether stdin has closed, if `watch` (else never).
fn watch_stdin(watch: bool) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    if watch {
        tokio::spawn(async move {
            stdin_closed().await;
            let _ = tx.send(true);
        });
    } else {
        // Keep the sender alive forever so that `wait_for` never ends on a closed channel.
        std::mem::forget(tx);
    }
    rx
}

async fn wait_closed(mut stdin_done: watch::Receiver<bool>) {
    let _ = stdin_done.wait_for(|closed| *closed).await;
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn leave(worker: &Rendezvous) {
    if let Err(e) = worker.shutdown().await {
        tracing::warn!("leaving the run: {e}");
    }
}

/// Why a round is over, in words.
pub fn why(reason: &RoundBroken) -> String {
    match reason {
        RoundBroken::MemberGone { rank: Some(rank) } => format!("the member of rank {rank} is gone"),
        RoundBroken::MemberGone { rank: None } => "a member is gone".into(),
        RoundBroken::Ended => {
            "it was ended (a member left or died, and a waiting or leaving worker ended it)".into()
        }
        RoundBroken::Closed => "the run was closed".into(),
        RoundBroken::LeaseLost => "this worker's lease was lost".into(),
        RoundBroken::Left => "this worker left".into(),
        RoundBroken::NoRound => "this worker is in no round".into(),
        RoundBroken::Unhealthy { reason } => format!("this node failed its health check ({reason})"),
    }
}
