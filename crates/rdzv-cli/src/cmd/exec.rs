//! `rdzv __exec --parent PID -- CMD…` (hidden): how `rdzv run` starts each worker. It asks
//! the kernel to SIGKILL it when its parent (the agent) dies, checks that the agent is still
//! its parent (it may have died before the request), waits for its guard (`rdzv __guard`)
//! to be in its process group, then replaces itself with the command. The request survives
//! `execve` (for commands that are not set-uid), so a worker whose agent was killed ends
//! instead of training alone. This takes no `unsafe` code (no `pre_exec`).

use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rustix::process::{Signal, getpid, getppid, set_parent_process_death_signal};

/// The exit status of a worker that could not be started, as shells use for "not found".
const CANNOT_EXEC: u8 = 127;

/// How long a worker waits for its guard before giving up (the agent starts it at once; a
/// machine under load may take a while).
const GUARD_WAIT: Duration = Duration::from_secs(30);

/// How many processes other than `leader` are in the process group `leader` leads, read
/// from `/proc` (`None`: `/proc` cannot be read). Processes that end while it reads are
/// skipped.
fn others_in_group(leader: i32) -> Option<usize> {
    let mut others = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        if pid == leader {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // The command name (field 2) may hold spaces and parentheses: count from its end.
        // After it: state, parent, process group.
        let group = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(2));
        if group.and_then(|g| g.parse::<i32>().ok()) == Some(leader) {
            others += 1;
        }
    }
    Some(others)
}

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
    // The agent starts this worker's guard in the worker's process group just after the
    // worker. Were the command to start first, an agent SIGKILLed in between left no guard
    // to end what the command started (its children outlived the agent: seen in
    // `cli_workers.rs` under load). The agent's death ends this wait by the signal above.
    let me = getpid().as_raw_nonzero().get();
    let deadline = Instant::now() + GUARD_WAIT;
    loop {
        match others_in_group(me) {
            Some(0) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Some(0) => {
                eprintln!(
                    "rdzv: the worker's guard did not join its process group within {GUARD_WAIT:?}; not starting the worker"
                );
                return ExitCode::from(CANNOT_EXEC);
            }
            // There, or no /proc to tell: start.
            Some(_) | None => break,
        }
    }
    let Some((program, rest)) = args.command.split_first() else {
        return ExitCode::from(CANNOT_EXEC);
    };
    let e = std::process::Command::new(program).args(rest).exec();
    eprintln!("rdzv: cannot start `{program}`: {e}");
    ExitCode::from(CANNOT_EXEC)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};

    use super::others_in_group;

    fn sleeper(group: u32) -> Child {
        let group = i32::try_from(group).expect("a process id");
        Command::new("sleep").arg("30").process_group(group).spawn().expect("sleep starts")
    }

    #[test]
    fn a_group_has_others_once_a_second_process_joins_it() {
        let mut leader = sleeper(0);
        let pgid = i32::try_from(leader.id()).expect("a process id");
        assert_eq!(others_in_group(pgid), Some(0), "the leader alone");
        let mut joined = sleeper(leader.id());
        assert_eq!(others_in_group(pgid), Some(1), "the leader and one more");
        for child in [&mut joined, &mut leader] {
            child.kill().expect("kill");
            child.wait().expect("wait");
        }
    }
}
