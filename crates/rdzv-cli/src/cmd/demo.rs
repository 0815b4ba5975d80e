//! `rdzv demo`: the main job in a few seconds, in one process — N workers form a round,
//! one crashes, the survivors are told, and with a newcomer they form the next round.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rdzv::{Rendezvous, RendezvousParams, Round};
use rdzv_core::layer::FaultyKv;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cmd::join::why;
use crate::exit::{CliError, TIMEOUT};
use crate::output::{participant_table, print_flush, seconds};
use crate::target::RunTarget;

/// The embedded default: an in-process store, a short keep-alive TTL so that a crash is
/// noticed within two seconds.
const DEFAULT_URL: &str = "mem://demo/demo?keep_alive_ttl=2s&last_call_timeout=1s&timeout=20s";

const LONG_ABOUT: &str = "\
Shows the main job of a rendezvous in a few seconds, with no server: N workers (default 8)
form a round and get ranks; one of them crashes (its connection to the backend fails, so its
lease runs out); the survivors are told that their round is broken, and together with a
newcomer that was waiting they form the next round. Each round is printed as a table.

The default backend is in-process (mem://demo/demo?keep_alive_ttl=2s&…), with
min_workers = N-1 and max_workers = N. Give a URL to watch the same on a real server
(a unique suffix is added to its run id; the run is closed at the end).

Examples:
  rdzv demo
  rdzv demo --workers 4 'etcd://127.0.0.1:2379/demo?keep_alive_ttl=2s'";

/// Arguments of `rdzv demo`.
#[derive(Debug, clap::Args)]
#[command(about = "Watch N workers form a round, lose one, and re-form (no server needed)", long_about = LONG_ABOUT)]
pub struct DemoArgs {
    /// How many workers (at least 2).
    #[arg(long, short = 'n', default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=1000))]
    workers: u32,
    /// Where to run it (default: in-process, mem://demo/demo?keep_alive_ttl=2s&…).
    #[arg(value_name = "URL")]
    url: Option<String>,
}

/// One demo worker: its handle and the fault switch of its backend connection.
struct Worker {
    node: String,
    rdzv: Rendezvous,
    link: Arc<FaultyKv>,
}

/// Runs `rdzv demo`.
pub async fn run(args: DemoArgs) -> Result<ExitCode, CliError> {
    let n = args.workers as usize;
    let url = args.url.as_deref().unwrap_or(DEFAULT_URL);
    let target = RunTarget::connect(url).await?;
    let run_id = format!("{}-{}", target.address.run_id, std::process::id());
    let params = target.params(n - 1, n, Some(&run_id))?;
    let bounded = tokio::time::timeout(Duration::from_secs(60), demo(&target, params, n)).await;
    bounded.unwrap_or_else(|_| {
        Err(CliError { code: TIMEOUT, message: "the demo did not finish within 60 s".into() })
    })
}

async fn demo(target: &RunTarget, params: RendezvousParams, n: usize) -> Result<ExitCode, CliError> {
    print_flush(&format!(
        "rdzv demo: {n} workers on {} (run {}), min_workers {}, max_workers {}, keep-alive TTL {}\n\n",
        target.address.url,
        params.run_id,
        params.min_workers,
        params.max_workers,
        seconds(params.keep_alive_ttl),
    ));
    let mut workers = Vec::new();
    for i in 0..n {
        workers.push(worker(target, &params, i).await?);
    }

    // Round 1: everyone joins at once.
    let started = Instant::now();
    let rounds = join_all(workers.iter().map(|w| w.rdzv.clone())).await?;
    let first = rounds.first().ok_or_else(|| CliError::other("no worker returned a round"))?;
    print_round(first, started.elapsed(), "all workers started together");

    // A crash: the victim's connection fails for good, so its lease runs out.
    let victim_index = 3.min(n - 1);
    let victim = workers.remove(victim_index);
    let victim_rank = first.info.participants.iter().position(|p| p.node == victim.node);
    victim.link.set_failure_probability(1.0);
    victim.link.drop_open_watches();
    let crashed = Instant::now();
    print_flush(&format!(
        "worker {} (rank {}) crashes: its backend connection fails and its lease runs out within {}\n",
        victim.node,
        victim_rank.map_or("?".to_string(), |r| r.to_string()),
        seconds(params.keep_alive_ttl),
    ));

    // A newcomer arrives meanwhile and waits for the next round.
    let newcomer = worker(target, &params, n).await?;
    print_flush(&format!("worker {} arrives and waits for the next round\n", newcomer.node));
    let late = newcomer.rdzv.clone();
    let newcomer_round = tokio::spawn(async move { late.next_rendezvous().await });

    // The survivors learn that their round is broken, then re-rendezvous.
    let mut set = JoinSet::new();
    for w in &workers {
        let rdzv = w.rdzv.clone();
        set.spawn(async move {
            let reason = rdzv.round_broken().await;
            let told = crashed.elapsed();
            let round = rdzv.next_rendezvous().await;
            (told, reason, round)
        });
    }
    let mut told = Vec::new();
    let mut second = None;
    while let Some(done) = set.join_next().await {
        let (after, reason, round) =
            done.map_err(|e| CliError::other(format!("a demo worker failed: {e}")))?;
        told.push((after, reason));
        second = Some(round?);
    }
    let slowest = told.iter().map(|(after, _)| *after).max().unwrap_or_default();
    let reason = told.first().map(|(_, r)| why(r)).unwrap_or_default();
    print_flush(&format!(
        "worker {} died; the {} survivors were told after {} at most ({reason})\n\n",
        victim.node,
        told.len(),
        seconds(slowest),
    ));
    let second = second.ok_or_else(|| CliError::other("no survivor returned a round"))?;
    let newcomer_in = second.info.participants.iter().any(|p| p.node == newcomer.node);
    let how = if newcomer_in {
        if let Ok(joined) = tokio::time::timeout(Duration::from_secs(5), newcomer_round).await {
            joined.map_err(|e| CliError::other(format!("the newcomer failed: {e}")))??;
        }
        format!("survivors plus {}, after the crash", newcomer.node)
    } else {
        // It came after the last call: it would be admitted in the round after.
        newcomer_round.abort();
        format!("survivors, after the crash ({} came too late for it)", newcomer.node)
    };
    print_round(&second, crashed.elapsed(), &how);

    // The job is done: close the run, everyone leaves.
    workers.push(newcomer);
    if let Some(w) = workers.first() {
        w.rdzv.set_closed().await?;
    }
    for w in &workers {
        let _ = w.rdzv.shutdown().await;
    }
    drop(victim);
    print_flush(&format!(
        "run {} closed. Try it across processes: rdzv join '<url>' (see rdzv join --help)\n",
        params.run_id
    ));
    Ok(ExitCode::SUCCESS)
}

async fn worker(target: &RunTarget, params: &RendezvousParams, i: usize) -> Result<Worker, CliError> {
    let node = format!("node{i}");
    let link = FaultyKv::new(target.kv.clone(), i as u64);
    let mut params = params.clone();
    params.node_id = Some(node.clone());
    params.local_addr = Some(format!("10.0.0.{}", i + 1));
    let rdzv = Rendezvous::new(link.clone(), params).await?;
    Ok(Worker { node, rdzv, link })
}

/// Every worker's round, all joined at once.
async fn join_all(workers: impl Iterator<Item = Rendezvous>) -> Result<Vec<Round>, CliError> {
    let mut set = JoinSet::new();
    for w in workers {
        set.spawn(async move { w.next_rendezvous().await });
    }
    let mut rounds = Vec::new();
    while let Some(done) = set.join_next().await {
        rounds.push(done.map_err(|e| CliError::other(format!("a demo worker failed: {e}")))??);
    }
    Ok(rounds)
}

fn print_round(round: &Round, took: Duration, how: &str) {
    print_flush(&format!(
        "round {}: {} workers, formed {} after {how}; master {}:{}\n{}\n",
        round.info.version,
        round.info.world_size,
        seconds(took),
        round.bootstrap.master_addr,
        round.bootstrap.master_port,
        participant_table(&round.info.participants, None, None),
    ));
}
