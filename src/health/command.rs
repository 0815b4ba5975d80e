//! A shell command as a health check: run with `sh -c` in a process group of its own, so
//! that at the timeout (or when the check is abandoned) the whole group is killed, not only
//! the shell; its output (stdout and stderr together) is kept for the reason of a failure.

use std::os::fd::OwnedFd;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::check::Verdict;

/// How much of a check's output is kept (its end).
const KEPT_OUTPUT: usize = 4096;
/// How many of its last lines a failure's reason quotes.
const QUOTED_LINES: usize = 3;
/// How long the output is still read after the shell exited (a background process that
/// kept the pipe open must not hold the check).
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

/// Runs `cmd` with `sh -c` until it exits or `deadline` (then its process group is killed and
/// it fails as timed out after `timeout`).
pub(crate) async fn run(cmd: &str, deadline: Instant, timeout: Duration) -> Verdict {
    let (reader, writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(e) => {
            return Verdict::CannotRun(format!("check `{cmd}`: cannot make a pipe for its output: {e}"));
        }
    };
    let child = writer.try_clone().and_then(|stderr| {
        tokio::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
    });
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return Verdict::CannotRun(format!("check `{cmd}`: cannot start `sh`: {e}")),
    };
    // Dropped (the check abandoned, or timed out) before the shell is reaped: kill the group.
    let group = GroupGuard(child.id().and_then(|id| Pid::from_raw(id as i32)));
    let mut output = Tail::new(reader);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            // Read meanwhile, so that a check that writes much never blocks on a full pipe.
            () = output.read_until_eof(), if !output.is_done() => {}
            () = tokio::time::sleep_until(deadline) => {
                drop(group);
                let _ = child.wait().await;
                return Verdict::Failed(format!(
                    "check `{cmd}`: timed out after {} (killed){}",
                    humantime::format_duration(timeout),
                    output.quoted()
                ));
            }
        }
    };
    group.disarm();
    let _ = tokio::time::timeout(OUTPUT_GRACE, output.read_until_eof()).await;
    match status {
        Ok(status) => verdict(cmd, status, &output.quoted()),
        Err(e) => Verdict::Failed(format!("check `{cmd}`: cannot wait for it: {e}")),
    }
}

/// What the shell's exit status says: 0 passes; 126 and 127 are the shell's own "cannot
/// execute" and "not found"; anything else, or a signal, fails.
fn verdict(cmd: &str, status: ExitStatus, output: &str) -> Verdict {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Verdict::Passed,
        (Some(code @ (126 | 127)), _) => {
            let what = if code == 127 { "not found" } else { "not executable" };
            Verdict::CannotRun(format!("check `{cmd}`: exit status {code} (a command {what}){output}"))
        }
        (Some(code), _) => Verdict::Failed(format!("check `{cmd}`: exit status {code}{output}")),
        (None, Some(signal)) => Verdict::Failed(format!("check `{cmd}`: killed by signal {signal}{output}")),
        (None, None) => Verdict::Failed(format!("check `{cmd}`: ended with an unknown status{output}")),
    }
}

/// Kills a process group when dropped, unless disarmed.
struct GroupGuard(Option<Pid>);

impl GroupGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = kill_process_group(pid, Signal::KILL);
        }
    }
}

/// The end of a check's output, read as it comes.
struct Tail {
    pipe: Option<tokio::net::unix::pipe::Receiver>,
    kept: Vec<u8>,
}

impl Tail {
    fn new(reader: std::io::PipeReader) -> Tail {
        let pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader)).ok();
        Tail { pipe, kept: Vec::new() }
    }

    /// Whether every writer closed the pipe (or reading it failed).
    fn is_done(&self) -> bool {
        self.pipe.is_none()
    }

    /// Reads until every writer closed the pipe (or it fails), keeping the last bytes.
    async fn read_until_eof(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else { return };
        let mut buf = [0u8; 4096];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.kept.extend_from_slice(&buf[..n]);
                    if self.kept.len() > 2 * KEPT_OUTPUT {
                        self.kept.drain(..self.kept.len() - KEPT_OUTPUT);
                    }
                }
            }
        }
        self.pipe = None;
    }

    /// The last lines of the output, as `: line | line | line` (nothing when it wrote none).
    fn quoted(&self) -> String {
        let text = String::from_utf8_lossy(&self.kept);
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let last = &lines[lines.len().saturating_sub(QUOTED_LINES)..];
        if last.is_empty() { String::new() } else { format!(": {}", last.join(" | ")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn check(cmd: &str, timeout: Duration) -> Verdict {
        run(cmd, Instant::now() + timeout, timeout).await
    }

    #[tokio::test]
    async fn exit_status_and_last_lines_make_the_reason() {
        assert_eq!(check("true", Duration::from_secs(10)).await, Verdict::Passed);
        let failed =
            check("echo one; echo two >&2; echo three; echo four; exit 3", Duration::from_secs(10)).await;
        assert_eq!(
            failed,
            Verdict::Failed("check `echo one; echo two >&2; echo three; echo four; exit 3`: exit status 3: two | three | four".into())
        );
        let signalled = check("kill -9 $$", Duration::from_secs(10)).await;
        assert!(matches!(&signalled, Verdict::Failed(why) if why.contains("signal 9")), "{signalled:?}");
    }

    #[tokio::test]
    async fn a_missing_command_cannot_run() {
        let verdict = check("rdzv-no-such-command-here", Duration::from_secs(10)).await;
        assert!(
            matches!(&verdict, Verdict::CannotRun(why) if why.contains("127") && why.contains("not found")),
            "{verdict:?}"
        );
    }

    /// A check that hangs is killed at its timeout with everything it started, and says so.
    #[tokio::test]
    async fn a_hung_check_is_killed_with_its_group_at_the_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("pid");
        let cmd = format!("echo started; sleep 60 & echo $! > {}; wait", pid_file.display());
        let started = std::time::Instant::now();
        let verdict = check(&cmd, Duration::from_millis(1500)).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "the check took {took:?}");
        assert!(
            matches!(&verdict, Verdict::Failed(why) if why.contains("timed out after 1s 500ms (killed): started")),
            "{verdict:?}"
        );
        let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid").trim().parse().expect("a pid");
        // Gone, or a zombie nobody reaped yet (killed all the same).
        let gone = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit_once(") ").is_none_or(|(_, rest)| rest.starts_with('Z'))
        });
        assert!(gone, "the check's background `sleep` outlived the timeout");
    }

    /// A background process that keeps the output open does not hold a check that exited.
    #[tokio::test]
    async fn a_lingering_child_does_not_hold_an_ended_check() {
        let started = std::time::Instant::now();
        let verdict = check("sleep 4 & exit 1", Duration::from_secs(20)).await;
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        assert_eq!(verdict, Verdict::Failed("check `sleep 4 & exit 1`: exit status 1".into()));
    }
}
