//! The local workers of `rdzv run`: started through `rdzv __exec` (so each ends when the
//! agent dies), each in its own process group (so stopping one stops its children too) with
//! a guard in it (`rdzv __guard`, so that the group ends when the agent dies), with
//! per-worker log files and error files, and stopped with SIGTERM then SIGKILL. A worker
//! is reaped only after its group's last signal, so that its group's id cannot have been
//! recycled for another program's processes when it is signalled.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use std::os::unix::process::ExitStatusExt;

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, waitid};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::scratch::ScratchDir;
use crate::signals::signal_group;

/// Where the workers' files go: `<root>/attempt_<k>/<local_rank>/{stdout.log, stderr.log,
/// error.json}` (`k` is the restart count, as with torchrun).
pub struct Logs {
    root: PathBuf,
    /// Whether the workers' stdout and stderr go to files (only with `--log-dir`; without it
    /// the root is a temporary directory that holds only the error files).
    to_files: bool,
    /// Whether their output is also copied to the agent's, each line prefixed `[<rank>]:`.
    tee: bool,
    /// The temporary root, removed when this is dropped.
    _temp: Option<ScratchDir>,
}

impl Logs {
    /// Files under `log_dir` when given, else error files only, in a temporary directory
    /// (see [`ScratchDir`]).
    pub fn new(log_dir: Option<&Path>, tee: bool) -> std::io::Result<Logs> {
        match log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                Ok(Logs { root: dir.to_path_buf(), to_files: true, tee, _temp: None })
            }
            None => {
                let temp = ScratchDir::create()?;
                Ok(Logs { root: temp.path().to_path_buf(), to_files: false, tee, _temp: Some(temp) })
            }
        }
    }

    /// The directory of one worker of one attempt.
    pub fn worker_dir(&self, attempt: u32, local_rank: usize) -> PathBuf {
        self.root.join(format!("attempt_{attempt}")).join(local_rank.to_string())
    }
}

/// One worker to start.
pub struct WorkerSpec {
    /// Its local rank.
    pub local_rank: usize,
    /// Its global rank (for messages and the `--tee` prefix).
    pub rank: usize,
    /// Variables set on top of the agent's environment.
    pub env: Vec<(&'static str, String)>,
}

/// How a worker ended.
#[derive(Clone, Debug)]
pub struct WorkerExit {
    /// Its local rank.
    pub local_rank: usize,
    /// Its global rank.
    pub rank: usize,
    /// Its exit status.
    pub status: ExitStatus,
    /// Its error file (`TORCHELASTIC_ERROR_FILE`), which may not exist.
    pub error_file: PathBuf,
}

struct Running {
    spec_rank: usize,
    /// Its process id, which is also its process group's id.
    pid: Pid,
    error_file: PathBuf,
    status: Option<ExitStatus>,
    /// Whether it was reaped. Until then an exited worker is this process's zombie, whose pid
    /// — its group's id — the kernel gives to no other process: its group is signalled only
    /// while that holds, never after (a recycled id could be another program's group).
    reaped: bool,
}

impl Running {
    /// Collects its exit status (it exited, or was just sent SIGKILL), freeing its pid.
    fn reap(&mut self) {
        if self.reaped {
            return;
        }
        self.reaped = true;
        match waitid(WaitId::Pid(self.pid), WaitIdOptions::EXITED) {
            Ok(Some(status)) => self.status = self.status.or(Some(exit_status(&status))),
            Ok(None) => {}
            Err(e) => tracing::warn!("reaping the worker of rank {} (pid {}): {e}", self.spec_rank, self.pid),
        }
    }
}

/// The running workers of one attempt.
pub struct Group {
    workers: Vec<Running>,
    exits: mpsc::UnboundedReceiver<(usize, ExitStatus)>,
    watcher: JoinHandle<()>,
    copies: Vec<JoinHandle<()>>,
    /// One guard per worker (`rdzv __guard`), a member of its group, which kills the group
    /// when this agent ends (see [`GuardPipe`]).
    guards: Vec<tokio::process::Child>,
    /// Closed when this agent is done with the group, also when it dies.
    _guard_pipe: GuardPipe,
}

/// The pipe the guards read: this agent holds its only write end (close-on-exec, so no
/// worker inherits it). When the agent ends — even by SIGKILL — the kernel closes it, the
/// guards read the end of their stdin and kill their groups: what a worker started (its
/// children, in its group) ends with it. A worker itself also gets a parent-death signal
/// (`rdzv __exec`).
struct GuardPipe {
    read: std::io::PipeReader,
    _write: std::io::PipeWriter,
}

impl Group {
    /// Starts `command` once per spec, through `rdzv __exec` (`exe`), each in its own
    /// process group with a guard (`rdzv __guard`) in it; `hide` removes what the workers
    /// must not inherit (the password). Workers started before an error are killed when the
    /// returned error drops them.
    pub fn start(
        exe: &Path,
        command: &[String],
        specs: Vec<WorkerSpec>,
        logs: &Logs,
        attempt: u32,
        hide: impl Fn(&mut Command),
    ) -> std::io::Result<Group> {
        let (tx, exits) = mpsc::unbounded_channel();
        // Before any worker starts, so that no exit goes unnoticed.
        let children = signal(SignalKind::child()).ok();
        let (read, write) = std::io::pipe()?;
        let mut group = Group {
            workers: Vec::new(),
            exits,
            watcher: tokio::spawn(async {}),
            copies: Vec::new(),
            guards: Vec::new(),
            _guard_pipe: GuardPipe { read, _write: write },
        };
        for spec in specs {
            let dir = logs.worker_dir(attempt, spec.local_rank);
            std::fs::create_dir_all(&dir)?;
            let error_file = dir.join("error.json");
            // A stale error file from an earlier group would be taken for this one's.
            match std::fs::remove_file(&error_file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let mut cmd = Command::new(exe);
            cmd.arg("__exec")
                .arg("--parent")
                .arg(std::process::id().to_string())
                .arg("--")
                .args(command)
                .envs(spec.env.iter().map(|(k, v)| (*k, v.as_str())))
                .env("TORCHELASTIC_ERROR_FILE", &error_file)
                .process_group(0);
            hide(&mut cmd);
            let (stdout, stderr) = if logs.tee {
                (Stdio::piped(), Stdio::piped())
            } else if logs.to_files {
                (
                    std::fs::File::create(dir.join("stdout.log"))?.into(),
                    std::fs::File::create(dir.join("stderr.log"))?.into(),
                )
            } else {
                (Stdio::inherit(), Stdio::inherit())
            };
            cmd.stdout(stdout).stderr(stderr);
            // Spawned without tokio, which would reap it as soon as it exits (see
            // `Running::reaped`). The parent-death signal of `__exec` fires when the
            // *thread* that started it ends: this runs on the runtime's main thread or a
            // worker thread, which live as long as the agent.
            let mut child = cmd.into_std().spawn()?;
            let pid = i32::try_from(child.id())
                .ok()
                .and_then(Pid::from_raw)
                .ok_or_else(|| std::io::Error::other("the worker got no usable process id"))?;
            group.workers.push(Running {
                spec_rank: spec.rank,
                pid,
                error_file,
                status: None,
                reaped: false,
            });
            group.guards.push(guard(exe, pid, &group._guard_pipe.read)?);
            if logs.tee {
                let file = |name: &str| -> std::io::Result<Option<std::fs::File>> {
                    if logs.to_files { std::fs::File::create(dir.join(name)).map(Some) } else { Ok(None) }
                };
                let prefix = format!("[{}]:", spec.rank);
                if let Some(out) = child.stdout.take() {
                    let out = tokio::process::ChildStdout::from_std(out)?;
                    group.copies.push(tokio::spawn(copy_lines(
                        out,
                        file("stdout.log")?,
                        prefix.clone(),
                        false,
                    )));
                }
                if let Some(err) = child.stderr.take() {
                    let err = tokio::process::ChildStderr::from_std(err)?;
                    group.copies.push(tokio::spawn(copy_lines(err, file("stderr.log")?, prefix, true)));
                }
            }
        }
        let pids: Vec<Pid> = group.workers.iter().map(|w| w.pid).collect();
        group.watcher.abort();
        group.watcher = tokio::spawn(watch_exits(pids, children, tx));
        Ok(group)
    }

    /// The next worker to exit, or `None` once all have.
    pub async fn next_exit(&mut self) -> Option<WorkerExit> {
        if self.workers.iter().all(|w| w.status.is_some()) {
            return None;
        }
        let (index, status) = self.exits.recv().await?;
        let w = &mut self.workers[index];
        w.status = Some(status);
        Some(WorkerExit { local_rank: index, rank: w.spec_rank, status, error_file: w.error_file.clone() })
    }

    /// Sends `signal` to every worker's process group (also those whose worker exited:
    /// children it left behind are still in it). Only groups whose worker is not reaped yet
    /// are signalled, which until [`Group::stop`] is all of them.
    pub fn signal(&self, signal: Signal) {
        for w in self.workers.iter().filter(|w| !w.reaped) {
            if let Err(e) = signal_group(w.pid.as_raw_nonzero().get().unsigned_abs(), signal) {
                tracing::warn!("signalling the process group {} of rank {}: {e}", w.pid, w.spec_rank);
            }
        }
    }

    /// Stops every worker: `first` to every process group, up to `grace` for the workers to
    /// exit, then SIGKILL to every group (what the workers left behind, and the guards,
    /// included), and only then reaps them. Returns the first failure among the workers, in
    /// local rank order (`None`: all exited 0).
    pub async fn stop(&mut self, first: Signal, grace: Duration) -> Option<ExitStatus> {
        if self.workers.iter().any(|w| w.status.is_none()) {
            self.signal(first);
            let _ = tokio::time::timeout(grace, async { while self.next_exit().await.is_some() {} }).await;
        }
        self.signal(Signal::KILL);
        while self.next_exit().await.is_some() {}
        for w in &mut self.workers {
            w.reap();
        }
        for guard in &mut self.guards {
            let _ = tokio::time::timeout(Duration::from_secs(2), guard.wait()).await;
        }
        // The output copies end when the last writer of each pipe is gone.
        for copy in self.copies.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), copy).await;
        }
        self.workers.iter().filter_map(|w| w.status).find(|s| !s.success())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.watcher.abort();
        // The agent is leaving without stopping its workers (an error): no worker outlives
        // it. Their groups are killed while their ids are still theirs, then reaped.
        if self.workers.iter().any(|w| !w.reaped) {
            self.signal(Signal::KILL);
            for w in &mut self.workers {
                w.reap();
            }
        }
    }
}

/// Starts the guard of the group `pid` leads, as a member of that group, reading `pipe`.
fn guard(exe: &Path, pid: Pid, pipe: &std::io::PipeReader) -> std::io::Result<tokio::process::Child> {
    let group = pid.as_raw_nonzero().get();
    Command::new(exe)
        .arg("__guard")
        .process_group(group)
        .stdin(Stdio::from(pipe.try_clone()?))
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
}

/// Sends the exit status of each worker (by its index in `pids`) once it exits, without
/// reaping it: woken by SIGCHLD (`children`), and every 250 ms in case a signal was missed.
async fn watch_exits(
    pids: Vec<Pid>,
    mut children: Option<tokio::signal::unix::Signal>,
    exits: mpsc::UnboundedSender<(usize, ExitStatus)>,
) {
    let mut waiting: Vec<(usize, Pid)> = pids.into_iter().enumerate().collect();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while !waiting.is_empty() {
        waiting.retain(|&(index, pid)| {
            let options = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG;
            match waitid(WaitId::Pid(pid), options) {
                Ok(Some(status)) if status.exited() || status.killed() || status.dumped() => {
                    let _ = exits.send((index, exit_status(&status)));
                    false
                }
                Ok(_) => true,
                // Not our child any more (cannot happen while unreaped): count it as killed.
                Err(_) => {
                    let _ = exits.send((index, ExitStatus::from_raw(9)));
                    false
                }
            }
        });
        match children.as_mut() {
            Some(children) => {
                tokio::select! {
                    _ = children.recv() => {}
                    _ = tick.tick() => {}
                }
            }
            None => {
                tick.tick().await;
            }
        }
    }
}

/// A `waitid` status as an [`ExitStatus`] (a wait status: the code in the second byte, or
/// the signal in the low bits, 0x80 for a core dump).
fn exit_status(status: &rustix::process::WaitIdStatus) -> ExitStatus {
    if let Some(code) = status.exit_status() {
        return ExitStatus::from_raw((code & 0xff) << 8);
    }
    let signal = status.terminating_signal().unwrap_or(9);
    ExitStatus::from_raw(signal | if status.dumped() { 0x80 } else { 0 })
}

/// Copies lines from a worker's pipe to `file` (if any) and, prefixed, to the agent's
/// stdout or stderr. Lines are copied as bytes: the worker's output need not be UTF-8.
async fn copy_lines(
    pipe: impl AsyncRead + Unpin,
    mut file: Option<std::fs::File>,
    prefix: String,
    to_stderr: bool,
) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if let Some(f) = file.as_mut()
            && let Err(e) = f.write_all(&line)
        {
            tracing::warn!("writing a worker's log: {e}");
            file = None;
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        // One write per line, under the lock, so lines of different workers do not mix.
        let mut out = Vec::with_capacity(prefix.len() + line.len());
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(&line);
        let _ = if to_stderr {
            std::io::stderr().lock().write_all(&out)
        } else {
            std::io::stdout().lock().write_all(&out).and_then(|()| std::io::stdout().lock().flush())
        };
    }
}

/// What a worker's error file says (the JSON PyTorch's `@record` writes:
/// `{"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}`,
/// or `{"message": "..."}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReport {
    /// The error, e.g. `ValueError: boom`.
    pub message: String,
    /// The traceback, when the file has one.
    pub traceback: Option<String>,
}

/// Reads `path` if the worker wrote it. A file that is not the expected JSON is reported as
/// its text (at most 4 KiB), since it is still what the worker had to say.
pub fn read_error_file(path: &Path) -> Option<ErrorReport> {
    let bytes = std::fs::read(path).ok()?;
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        match &v["message"] {
            serde_json::Value::Object(m) => {
                let message = m.get("message").and_then(|s| s.as_str()).unwrap_or("").to_string();
                let traceback = m
                    .get("extraInfo")
                    .and_then(|x| x.get("py_callstack"))
                    .and_then(|s| s.as_str())
                    .map(str::to_string);
                return Some(ErrorReport { message, traceback });
            }
            serde_json::Value::String(s) => return Some(ErrorReport { message: s.clone(), traceback: None }),
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).trim().to_string();
    (!text.is_empty()).then_some(ErrorReport { message: text, traceback: None })
}

/// The path of `program` as `execvp` would find it (through `PATH` when it has no `/`),
/// checked before joining so that a node that cannot run the command does not join.
pub fn find_program(program: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable =
        |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        let p = PathBuf::from(program);
        return if runnable(&p) {
            Ok(p)
        } else {
            Err(std::io::Error::new(std::io::ErrorKind::NotFound, "no such executable file"))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
        let candidate = dir.join(program);
        if runnable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::NotFound, "not found in PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_files_of_record_are_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("error.json");
        assert_eq!(read_error_file(&path), None);
        let record = r#"{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: boom\n", "timestamp": "1700000000"}}}"#;
        std::fs::write(&path, record).expect("write");
        let report = read_error_file(&path).expect("report");
        assert_eq!(report.message, "ValueError: boom");
        assert!(report.traceback.expect("traceback").contains("train.py"));
        std::fs::write(&path, r#"{"message": "plain"}"#).expect("write");
        assert_eq!(read_error_file(&path), Some(ErrorReport { message: "plain".into(), traceback: None }));
        std::fs::write(&path, "not json\n").expect("write");
        assert_eq!(read_error_file(&path).map(|r| r.message), Some("not json".into()));
    }

    #[test]
    fn programs_are_found_like_execvp() {
        assert!(find_program("sh").is_ok());
        assert!(find_program("/bin/sh").is_ok());
        assert!(find_program("rdzv-no-such-program").is_err());
        assert!(find_program("/etc/hostname-no-such").is_err());
    }
}
