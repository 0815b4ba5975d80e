//! `rdzv health`: the built-in health checks, run once, alone.

use std::process::ExitCode;
use std::time::Duration;

use rdzv::health::{Check, Checks, Target};

use crate::exit::CliError;
use crate::output::print_flush;
use crate::target::RunTarget;

const LONG_ABOUT: &str = "\
Runs built-in health checks once, as `rdzv run --health-check builtin:…` does before each
join, and says in one line whether this node passes: exit code 0 when every check passes,
1 when one fails (the line says why), 2 for a check that does not exist.

The checks:
  gpu            nvidia-smi -L lists at least --nproc-per-node GPUs, none in an error state
                 (without nvidia-smi the node is unhealthy; RDZV_NVIDIA_SMI names another
                 program to ask)
  gpu:N          the same, at least N GPUs
  disk:PATH:MIN  at least MIN free on PATH's file system (bytes, or K, M, G, T: powers of
                 1024)
  store          a write, a read and a delete of a key of the run's Store within 5 s (needs
                 --url or RDZV_URL)
  store:BOUND    the same, within BOUND

Examples:
  rdzv health gpu disk:/tmp:10G --nproc-per-node 8
  rdzv health store --url 'etcd://10.0.0.5:2379/job42'
  rdzv run \"$RDZV_URL\" --health-check 'rdzv health gpu:8 && ./ib-check.sh' -- python train.py";

/// Arguments of `rdzv health`.
#[derive(Debug, clap::Args)]
#[command(about = "Run built-in health checks once (exit 0 healthy, 1 not)", long_about = LONG_ABOUT)]
pub struct HealthArgs {
    /// The checks (gpu, gpu:N, disk:PATH:MIN, store, store:BOUND), all of which must pass.
    #[arg(required = true, num_args = 1.., value_name = "CHECK", value_parser = builtin)]
    checks: Vec<String>,
    /// The run whose Store the `store` check writes to (default: $RDZV_URL).
    #[arg(long, env = "RDZV_URL", hide_env_values = true, value_name = "URL")]
    url: Option<String>,
    /// How many GPUs a bare `gpu` check expects.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    nproc_per_node: u32,
    /// How long all the checks may take together.
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = crate::args::positive_duration)]
    timeout: Duration,
}

/// A check's name as given (a leading `builtin:` is optional), if it is a built-in.
fn builtin(name: &str) -> Result<String, String> {
    let spec = format!("builtin:{}", name.strip_prefix("builtin:").unwrap_or(name));
    crate::args::health_check(&spec)
}

/// Runs `rdzv health`.
pub async fn run(args: HealthArgs) -> Result<ExitCode, CliError> {
    let gpus = usize::try_from(args.nproc_per_node).unwrap_or(usize::MAX);
    let checks =
        Checks::parse(&args.checks, args.timeout).map_err(rdzv::RendezvousError::from)?.expecting_gpus(gpus);
    let target = match (&args.url, checks.needs_target()) {
        (Some(url), true) => Some(target(url).await?),
        (None, true) => {
            return Err(CliError {
                code: crate::exit::CONFIG,
                message: "the store check needs the run's URL: give --url or set RDZV_URL".into(),
            });
        }
        (_, false) => None,
    };
    let verdict = checks.run(target.as_ref()).await;
    let names: Vec<String> = checks.list().iter().map(name).collect();
    if verdict.passed() {
        print_flush(&format!("healthy: {} passed\n", names.join(", ")));
        Ok(ExitCode::SUCCESS)
    } else {
        print_flush(&format!("unhealthy: {}\n", verdict.reason()));
        Ok(ExitCode::FAILURE)
    }
}

/// The run `url` names, as the target of a `store` check.
async fn target(url: &str) -> Result<Target, CliError> {
    let run = RunTarget::connect(url).await?;
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let node = format!("health-{}-{nanos:x}", std::process::id());
    Ok(Target { kv: run.kv, keys: run.keys, node })
}

/// A check as the command line names it.
fn name(check: &Check) -> String {
    match check {
        Check::Command(cmd) => format!("`{cmd}`"),
        Check::Gpu { at_least: Some(n) } => format!("gpu:{n}"),
        Check::Gpu { at_least: None } => "gpu".into(),
        Check::Disk { path, .. } => format!("disk:{}", path.display()),
        Check::Store { .. } => "store".into(),
    }
}
