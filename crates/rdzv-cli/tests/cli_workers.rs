//! How `rdzv run` handles its workers' processes: a worker's own children end with the agent
//! even when it is killed with SIGKILL, and a worker that exited is not reaped (its process
//! id, which is its process group's id, stays its own) until its group got its last signal;
//! the temporary directory of a SIGKILLed agent is removed by the next agent. One node on
//! the in-process backend: no server needed.

#![allow(clippy::unwrap_used)]

mod cli_support;

use std::time::Duration;

use cli_support::{Proc, field, run_id};
use tokio::time::Instant;

fn agent(name: &str, nproc: &str, script: &str) -> Proc {
    agent_with_env(name, nproc, script, &[])
}

fn agent_with_env(name: &str, nproc: &str, script: &str, env: &[(&str, &str)]) -> Proc {
    let url = format!("mem://workers/{}?min_workers=1&timeout=20s", run_id(name));
    Proc::spawn_with_env(
        name,
        &["run", &url, "--nproc-per-node", nproc, "--grace-period", "2s", "--", "sh", "-c", script],
        env,
    )
}

/// The agents' temporary directories in `parent`.
fn scratch_dirs(parent: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("rdzv-run-"))
        .collect()
}

/// The state letter of `/proc/<pid>/stat` (`None`: no such process), and its parent.
fn state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

async fn gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if state(pid).is_none_or(|(s, _)| s == 'Z') {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The agent is SIGKILLed: its worker dies of its parent-death signal, and the worker's own
/// child (in the worker's process group) must die too. It used to live on, orphaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_children_end_with_a_sigkilled_agent() {
    cli_support::bounded(async {
        let mut agent = agent("orphans", "1", r#"sleep 300 & echo "CHILD=$! PID=$$"; wait"#);
        let line = agent.line(Duration::from_secs(20)).await;
        let (worker, child): (u32, u32) =
            (field(&line, "PID").parse().unwrap(), field(&line, "CHILD").parse().unwrap());
        agent.also_kill(worker);
        assert!(state(child).is_some_and(|(s, _)| s != 'Z'), "the worker's child runs: {line}");
        agent.kill9();
        assert!(gone(worker, Duration::from_secs(5)).await, "the worker outlived its agent");
        assert!(gone(child, Duration::from_secs(5)).await, "the worker's child {child} outlived the agent");
    })
    .await;
}

/// A SIGKILLed agent cannot remove its temporary directory (where its workers' error files
/// go): the next agent to start on the machine removes it. Each killed agent used to leave
/// its directory in /tmp for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_agent_removes_the_directory_of_a_sigkilled_one() {
    cli_support::bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let env = [("TMPDIR", tmp.path().to_str().unwrap())];
        let mut killed = agent_with_env("scratch-killed", "1", r#"echo "PID=$$"; exec sleep 300"#, &env);
        let line = killed.line(Duration::from_secs(20)).await;
        let worker: u32 = field(&line, "PID").parse().unwrap();
        killed.also_kill(worker);
        let made = scratch_dirs(tmp.path());
        assert_eq!(made.len(), 1, "one directory while the agent runs: {made:?}");
        killed.kill9();
        assert_eq!(killed.exit_code(Duration::from_secs(5)).await, -1, "killed by a signal");
        assert!(gone(worker, Duration::from_secs(5)).await, "the worker outlived its agent");
        assert_eq!(scratch_dirs(tmp.path()), made, "left by the killed agent");

        let mut next = agent_with_env("scratch-next", "1", "exit 0", &env);
        assert_eq!(next.exit_code(Duration::from_secs(20)).await, 0, "{}", next.stderr());
        assert_eq!(scratch_dirs(tmp.path()), Vec::<String>::new(), "directories left");
    })
    .await;
}

/// Worker 0 exits at once, worker 1 runs on: until the group is stopped, worker 0 stays the
/// agent's unreaped child (a zombie), so the id of its process group, which the agent still
/// signals at stop, cannot be another program's. It used to be reaped at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_worker_keeps_its_group_id_until_its_group_is_stopped() {
    cli_support::bounded(async {
        let script = r#"echo "PID=$$ LOCAL=$LOCAL_RANK"; if [ "$LOCAL_RANK" = 1 ]; then sleep 3; fi"#;
        let mut agent = agent("zombie", "2", script);
        let agent_pid = agent.pid();
        let mut early = None;
        for _ in 0..2 {
            let line = agent.line(Duration::from_secs(20)).await;
            let pid: u32 = field(&line, "PID").parse().unwrap();
            agent.also_kill(pid);
            if field(&line, "LOCAL") == "0" {
                early = Some(pid);
            }
        }
        let early = early.unwrap();
        // Worker 0 has exited; worker 1 still sleeps.
        let deadline = Instant::now() + Duration::from_secs(2);
        while state(early).is_some_and(|(s, _)| s != 'Z') && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            state(early),
            Some(('Z', agent_pid)),
            "worker 0 ({early}) was reaped before its group was stopped"
        );
        assert_eq!(agent.exit_code(Duration::from_secs(20)).await, 0, "{}", agent.stderr());
        assert_eq!(state(early), None, "reaped by the end");
    })
    .await;
}
