//! `rdzv __guard` (hidden): the guard `rdzv run` starts in each worker's process group. It
//! waits for the end of its stdin — a pipe whose only write end the agent holds, so the end
//! comes when the agent is done with the group or dies, even by SIGKILL — and then kills
//! its whole process group: the worker (which its own parent-death signal may have ended
//! already) and every process the worker started in its group. Without it, a worker's
//! children outlived an agent killed with SIGKILL. Being a member of the group, it also keeps
//! the group's id from being given to another program while anything of the group lives.

use std::process::ExitCode;

use rustix::process::{Signal, kill_current_process_group};
use tokio::signal::unix::{SignalKind, signal};

use crate::signals::stdin_closed;

/// Arguments of `rdzv __guard` (none).
#[derive(Debug, clap::Args)]
#[command(about = "Internal: end a worker's process group with its agent", hide = true)]
pub struct GuardArgs {}

/// Runs `rdzv __guard` until the agent is done, then kills the group (this process too).
pub fn run(_: GuardArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_io().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rdzv: the guard of a worker group cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        // The agent stops a group with SIGTERM (or SIGINT) to all of it, then SIGKILL: the
        // first is for the worker to handle; the guard stays until the SIGKILL, or until
        // the agent is gone. Caught signals are merely ignored here, the notices the agent
        // passes on to the group (SIGUSR1, SIGUSR2) too.
        let caught: Vec<_> = [
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::hangup(),
            SignalKind::quit(),
            SignalKind::user_defined1(),
            SignalKind::user_defined2(),
        ]
        .into_iter()
        .filter_map(|kind| signal(kind).ok())
        .collect();
        stdin_closed().await;
        drop(caught);
    });
    if let Err(e) = kill_current_process_group(Signal::KILL) {
        eprintln!("rdzv: the guard could not end its worker's process group: {e}");
    }
    ExitCode::FAILURE
}
