//! `rdzv`: the rendezvous from the command line, for jobs launched by shell scripts, Slurm
//! or Kubernetes (see `rdzv --help`).

mod agent;
mod args;
mod cmd;
mod event_log;
mod exit;
mod live;
mod metrics_server;
mod observe;
mod output;
mod progress;
mod ranks;
mod scratch;
mod signals;
mod slurm;
mod target;
mod workers;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::CliError;

const ABOUT: &str = "Rendezvous for distributed jobs over etcd, Redis or memory.";

const LONG_ABOUT: &str = "\
Rendezvous for distributed jobs over etcd, Redis or memory.

The workers of a job meet through a key-value store, agree on who is in, and each get a
rank and the world size. The backend and the rendezvous parameters are one URL:

  etcd://host:2379/<run_id>?min_workers=2&max_workers=8&last_call_timeout=30s
  redis://host:6379/<run_id>?min_workers=2
  mem://<name>/<run_id>?min_workers=2      (in-process: only useful for `demo` and `bench`)

RDZV_URL supplies the URL when none is given. Keep the password out of it with the URL
option password_file=<path> or the variable RDZV_PASSWORD (used when the URL gives no
password and names a user, or is redis/rediss). RUST_LOG controls logging to stderr
(default: warnings; errors only for `demo`), e.g. RUST_LOG=rdzv_core=debug.

Exit codes: 0 success, 2 usage or configuration error, 3 timeout, 4 run closed,
5 backend unreachable, 1 anything else.

Try it without any server:  rdzv demo";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "rdzv", version, about = ABOUT, long_about = LONG_ABOUT, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Join(cmd::join::JoinArgs),
    Run(Box<cmd::run::RunArgs>),
    Status(cmd::status::StatusArgs),
    Close(cmd::close::CloseArgs),
    Health(cmd::health::HealthArgs),
    Bench(cmd::bench::BenchArgs),
    Demo(cmd::demo::DemoArgs),
    #[command(name = "__exec")]
    Exec(cmd::exec::ExecArgs),
    #[command(name = "__guard")]
    Guard(cmd::guard::GuardArgs),
}

/// jemalloc instead of the system's malloc: cheaper for the many small, short-lived buffers of
/// thousands of handlers in one process (`rdzv bench`), with less memory than mimalloc took.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Usage errors exit with clap's own code 2, help and version with 0.
    let cli = Cli::parse();
    // A worker about to start: no runtime, no threads, nothing to log; it `exec`s at once.
    let cli = match cli.command {
        Command::Exec(args) => return cmd::exec::run(args),
        // A worker group's guard: its own small runtime, nothing to log.
        Command::Guard(args) => return cmd::guard::run(args),
        command => Cli { command },
    };
    // The demo crashes a worker on purpose: its lease warnings would only be noise.
    init_logging(if matches!(cli.command, Command::Demo(_)) { "error" } else { "warn" });
    // One worker, or one request, per process: a current-thread runtime starts no worker
    // threads, and its tasks wake each other without crossing threads — about half the CPU
    // a short `rdzv join` spent (thread start-up, cross-thread wake-ups) when many start at
    // once. `run` (an agent supervising its workers), `bench` and `demo` (many workers in
    // one process) keep a multi-thread runtime.
    let single =
        matches!(cli.command, Command::Join(_) | Command::Status(_) | Command::Close(_) | Command::Health(_));
    let mut builder = if single {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return exit::report(&CliError::other(format!("cannot start the async runtime: {e}"))),
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Join(args) => cmd::join::run(args).await,
            Command::Run(args) => cmd::run::run(*args).await,
            Command::Status(args) => cmd::status::run(args).await,
            Command::Close(args) => cmd::close::run(args).await,
            Command::Health(args) => cmd::health::run(args).await,
            Command::Bench(args) => cmd::bench::run(args).await,
            Command::Demo(args) => cmd::demo::run(args).await,
            Command::Exec(_) | Command::Guard(_) => {
                Err(CliError::other("`__exec` and `__guard` run before the runtime starts"))
            }
        }
    });
    // Background tasks (lease keep-alives, watches) must not delay the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => code,
        Err(e) => exit::report(&e),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: `default`), in colour on a terminal only.
fn init_logging(default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
