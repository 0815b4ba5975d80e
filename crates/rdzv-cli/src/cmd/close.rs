//! `rdzv close`: end the run for everyone.

use std::process::ExitCode;

use crate::exit::CliError;
use crate::output::print_flush;
use crate::target::RunTarget;

const LONG_ABOUT: &str = "\
Closes the run: every worker waiting in or for a round fails with \"closed\" (`rdzv join`
exits with code 4; `rdzv run` with 4, or 0 on a node that never was a member), members
holding a round are told, and no round of this run id forms again while the run is closed.
Closing a closed run is fine. Needs no min_workers in the URL.

How long `closed` lasts: the closed state is bound to the run lease, which every live worker
of the run keeps alive. When the last worker is gone, the run's keys (closed state included)
expire run_ttl later (2 h unless the URL's run_ttl says otherwise); after that the run id
starts afresh at round 1.

Example:
  rdzv close 'etcd://10.0.0.5:2379/job42'";

/// Arguments of `rdzv close`.
#[derive(Debug, clap::Args)]
#[command(about = "Close a run for every worker", long_about = LONG_ABOUT)]
pub struct CloseArgs {
    /// The rendezvous URL (min_workers is not needed; default: $RDZV_URL).
    #[arg(env = "RDZV_URL", hide_env_values = true, value_name = "URL")]
    url: String,
}

/// Runs `rdzv close`: a short-lived handler (min_workers defaulted to 1 when absent) that
/// swaps the state to closed, bound to the run's lease like any other close, and leaves.
pub async fn run(args: CloseArgs) -> Result<ExitCode, CliError> {
    let target = RunTarget::connect(&args.url).await?;
    // The closer joins no round, so any size does; the URL's other options (prefix, TTLs)
    // still apply.
    let params = target.address.params_or(1, 1).map_err(rdzv::RendezvousError::from)?;
    let closer = rdzv::Rendezvous::new(target.kv.clone(), params).await?;
    let closed = closer.set_closed().await;
    if let Err(e) = closer.shutdown().await {
        tracing::warn!("leaving after close: {e}");
    }
    closed?;
    print_flush(&format!("closed run {}\n", target.address.run_id));
    Ok(ExitCode::SUCCESS)
}
