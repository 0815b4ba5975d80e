//! `rdzv __exec --parent PID -- CMD…` (hidden): how `rdzv run` starts each worker. It asks
//! the kernel to SIGKILL it when its parent (the agent) dies, checks that the agent is still
//! its parent (it may have died before the request), then replaces itself with the command.
//! The request survives `execve` (for commands that are not set-uid), so a worker whose agent
//! was killed ends instead of training alone. This takes no `unsafe` code (no `pre_exec`).

use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use rustix::process::{Signal, getppid, set_parent_process_death_signal};

/// The exit status of a worker that could not be started, as shells use for "not found".
const CANNOT_EXEC: u8 = 127;

/// Arguments of `rdzv __exec`.
#[derive(Debug, clap::Args)]
#[command(about = "Internal: start one worker of `rdzv run`", hide = true)]
pub struct ExecArgs {
    /// The agent's process id: the worker does not start unless it is still the parent.
    #[arg(long, value_name = "PID")]
    parent: i32,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "CMD")]
    command: Vec<String>,
}

/// Runs `rdzv __exec`: returns only if the command could not be started.
pub fn run(args: ExecArgs) -> ExitCode {
    if let Err(e) = set_parent_process_death_signal(Some(Signal::KILL)) {
        eprintln!("rdzv: cannot ask to end with the agent: {e}");
        return ExitCode::from(CANNOT_EXEC);
    }
    // The agent may have died between starting this process and the request above; then
    // the request never fires, and this process has been handed to another parent.
    if getppid().map(|p| p.as_raw_nonzero().get()) != Some(args.parent) {
        eprintln!("rdzv: the agent (process {}) is gone; not starting the worker", args.parent);
        return ExitCode::from(CANNOT_EXEC);
    }
    let Some((program, rest)) = args.command.split_first() else {
        return ExitCode::from(CANNOT_EXEC);
    };
    let e = std::process::Command::new(program).args(rest).exec();
    eprintln!("rdzv: cannot start `{program}`: {e}");
    ExitCode::from(CANNOT_EXEC)
}
