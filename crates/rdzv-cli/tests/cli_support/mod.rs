//! Driving the built `rdzv` binary from tests: processes whose output is read line by line
//! with deadlines, killed (with their process group) when dropped; and the multi-process
//! scenarios shared by the etcd and Redis suites.

#![allow(dead_code, clippy::unwrap_used)]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The binary under test.
pub const RDZV: &str = env!("CARGO_BIN_EXE_rdzv");

/// A running `rdzv` process.
pub struct Proc {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_done: Option<tokio::task::JoinHandle<()>>,
    /// Other process groups to kill on drop (e.g. the commands of a SIGKILLed `rdzv run`).
    also_kill: Vec<u32>,
}

impl Proc {
    /// Starts `rdzv <args>` with stdin a pipe that stays open until [`Proc::close_stdin`].
    pub fn spawn(name: &str, args: &[&str]) -> Proc {
        Proc::spawn_with_env(name, args, &[])
    }

    /// [`Proc::spawn`] with these environment variables set.
    pub fn spawn_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(RDZV)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("RDZV_URL")
            .env("RUST_LOG", "warn")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("start the rdzv binary");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut out = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = out.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let stderr_done = tokio::spawn(async move {
            let mut err = BufReader::new(stderr_pipe).lines();
            while let Ok(Some(line)) = err.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Proc {
            name: name.to_string(),
            child,
            stdin,
            lines,
            stderr,
            stderr_done: Some(stderr_done),
            also_kill: Vec::new(),
        }
    }

    /// What it wrote on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next stdout line, or `None` if none came within `within` (or stdout ended).
    pub async fn try_line(&mut self, within: Duration) -> Option<String> {
        tokio::time::timeout(within, self.lines.recv()).await.ok().flatten()
    }

    /// The next stdout line; fails the test (showing stderr) if none comes within `within`.
    pub async fn line(&mut self, within: Duration) -> String {
        match self.try_line(within).await {
            Some(line) => line,
            None => panic!("{}: no output line within {within:?}; stderr:\n{}", self.name, self.stderr()),
        }
    }

    /// The next stdout line as JSON.
    pub async fn json(&mut self, within: Duration) -> Value {
        let line = self.line(within).await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}", self.name))
    }

    /// Closes its stdin (a `join` without `--hold` then leaves).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for it to exit; fails the test if it does not within `within`.
    pub async fn exit_code(&mut self, within: Duration) -> i32 {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => {
                // Let the reader catch the last stderr lines.
                if let Some(reader) = self.stderr_done.take() {
                    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
                }
                status.expect("wait").code().unwrap_or(-1)
            }
            Err(_) => panic!("{}: did not exit within {within:?}; stderr:\n{}", self.name, self.stderr()),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("a process that has not been waited for")
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL to it (its process group), like a machine dying.
    pub fn kill9(&mut self) {
        if let Some(pid) = self.child.id() {
            kill_group(pid);
        }
    }

    /// Also kill process group `pgid` when this is dropped.
    pub fn also_kill(&mut self, pgid: u32) {
        self.also_kill.push(pgid);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
        for pgid in &self.also_kill {
            kill_group(*pgid);
        }
    }
}

fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Runs `rdzv <args>` to completion (bounded by 30 s): exit code, stdout, stderr.
pub async fn run_once(args: &[&str]) -> (i32, String, String) {
    run_with_env(args, &[]).await
}

/// Runs `rdzv <args>` with extra environment variables (and no inherited `RDZV_URL` or
/// `RDZV_PASSWORD`) to completion (bounded by 30 s): exit code, stdout, stderr.
pub async fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(RDZV)
        .args(args)
        .env_remove("RDZV_URL")
        .env_remove("RDZV_PASSWORD")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("rdzv finished in 30 s")
        .expect("run rdzv");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Builds a rendezvous URL for run `run_id` with `query` (no `?`) on the server under test.
pub type UrlFn<'a> = &'a (dyn Fn(&str, &str) -> String + Sync);

/// A run id no other test uses.
pub fn run_id(test: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{test}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

const T: Duration = Duration::from_secs(30);

fn join_args(url: &str, node: &str) -> Vec<String> {
    vec!["join".into(), url.into(), "--format".into(), "json".into(), "--node-id".into(), node.into()]
}

fn spawn_join(url: &str, node: &str) -> Proc {
    let args = join_args(url, node);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::spawn(node, &args)
}

fn ranks(rounds: &[Value]) -> Vec<u64> {
    let mut r: Vec<u64> = rounds.iter().map(|v| v["rank"].as_u64().expect("rank")).collect();
    r.sort_unstable();
    r
}

fn assert_one_round(rounds: &[Value], world: usize) {
    let version = &rounds[0]["version"];
    for r in rounds {
        assert_eq!(&r["version"], version, "{rounds:?}");
        assert_eq!(r["world_size"], world as u64, "{rounds:?}");
        assert_eq!(r["participants"].as_array().map(Vec::len), Some(world), "{rounds:?}");
        assert_eq!(r["master_port"], rounds[0]["master_port"], "{rounds:?}");
        assert!(r["elapsed_ms"].is_u64());
    }
    assert_eq!(ranks(rounds), (0..world as u64).collect::<Vec<_>>());
}

/// 4 processes form a round with ranks 0..3, then leave when their stdin closes.
pub async fn four_form_a_round(url: UrlFn<'_>) {
    let url = url(&run_id("four"), "min_workers=4&keep_alive_ttl=2s&timeout=20s");
    let mut procs: Vec<Proc> = (0..4).map(|i| spawn_join(&url, &format!("w{i}"))).collect();
    let mut rounds = Vec::new();
    for p in &mut procs {
        rounds.push(p.json(T).await);
    }
    assert_one_round(&rounds, 4);
    for p in &mut procs {
        p.close_stdin();
    }
    for p in &mut procs {
        assert_eq!(p.exit_code(T).await, 0, "{}", p.stderr());
    }
}

/// `min < max`: 3 of at most 4 arrive; the round completes after the (short) last call.
pub async fn min_below_max_last_call(url: UrlFn<'_>) {
    let url = url(
        &run_id("lastcall"),
        "min_workers=2&max_workers=4&last_call_timeout=2s&keep_alive_ttl=2s&timeout=20s",
    );
    let started = Instant::now();
    let mut procs: Vec<Proc> = (0..3).map(|i| spawn_join(&url, &format!("w{i}"))).collect();
    let mut rounds = Vec::new();
    for p in &mut procs {
        rounds.push(p.json(T).await);
    }
    assert_one_round(&rounds, 3);
    assert!(started.elapsed() >= Duration::from_secs(2), "formed before the last call ended");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
}

/// 6 processes, max 4: 4 form a round, 2 wait (and `status` counts them); then a member is
/// SIGKILLed: the others see the round broken and re-form with the waiters (printing the
/// new round).
pub async fn six_with_max_four_then_sigkill(url: UrlFn<'_>) {
    let run = run_id("six");
    let join_url = url(&run, "min_workers=4&max_workers=4&keep_alive_ttl=2s&timeout=25s");
    let status_url = url(&run, "");
    let mut procs: Vec<Proc> = (0..6).map(|i| spawn_join(&join_url, &format!("w{i}"))).collect();

    // The first four lines, from whoever got in.
    let deadline = Instant::now() + T;
    let mut members: Vec<(usize, Value)> = Vec::new();
    while members.len() < 4 {
        assert!(Instant::now() < deadline, "no round of 4 within {T:?}");
        for (i, p) in procs.iter_mut().enumerate() {
            if members.iter().any(|(m, _)| *m == i) {
                continue;
            }
            if let Some(line) = p.try_line(Duration::from_millis(100)).await {
                members.push((i, serde_json::from_str(&line).expect("json")));
            }
        }
    }
    let rounds: Vec<Value> = members.iter().map(|(_, v)| v.clone()).collect();
    assert_one_round(&rounds, 4);
    let first_version = rounds[0]["version"].as_u64().expect("version");

    // `status` sees the two spares (they register right after finding the round final): the
    // round is full, so neither counts as waiting to be admitted.
    let deadline = Instant::now() + T;
    let spares = loop {
        let (code, out, err) = run_once(&["status", &status_url, "--format", "json"]).await;
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(out.trim()).expect("status json");
        if v["spares_count"] == 2 {
            assert_eq!((v["state"].clone(), v["waiting_count"].clone()), (json!("final"), json!(0)), "{v}");
            assert_eq!(v["participants"].as_array().map(Vec::len), Some(4));
            assert!(v["participants"].as_array().expect("array").iter().all(|p| p["alive"] == true));
            break v["spares"].clone();
        }
        assert!(Instant::now() < deadline, "status never showed 2 spares: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (code, text, _) = run_once(&["status", &status_url]).await;
    assert_eq!(code, 0);
    assert!(text.contains("waiting for the next round: 0\nspares: 2"), "{text}");

    // SIGKILL one member: the survivors and the first spare form the next round of 4, each
    // survivor at its rank and the spare at the dead one's; the other spare waits on.
    let (victim, victim_round) = members[0].clone();
    procs[victim].kill9();
    let first_spare = spares[0].as_str().expect("node id").to_string();
    let deadline = Instant::now() + T;
    let mut next: Vec<(String, Value)> = Vec::new();
    while next.len() < 4 {
        assert!(Instant::now() < deadline, "no new round of 4 within {T:?}; got {next:?}");
        for (i, p) in procs.iter_mut().enumerate() {
            if i == victim {
                continue;
            }
            if let Some(line) = p.try_line(Duration::from_millis(100)).await {
                next.push((format!("w{i}"), serde_json::from_str(&line).expect("json")));
            }
        }
    }
    let rounds: Vec<Value> = next.iter().map(|(_, v)| v.clone()).collect();
    assert_one_round(&rounds, 4);
    assert!(rounds[0]["version"].as_u64().expect("version") > first_version);
    for (node, round) in &next {
        let before = members.iter().find(|(i, _)| format!("w{i}") == *node).map(|(_, v)| v["rank"].clone());
        match before {
            Some(rank) => assert_eq!(round["rank"], rank, "survivor {node} moved"),
            None => {
                assert_eq!(*node, first_spare, "not the first spare got in");
                assert_eq!(round["rank"], victim_round["rank"], "the spare did not take the dead one's rank");
                assert_eq!(round["previous_rank"], Value::Null);
                assert_eq!(round["left"], json!([victim_round["rank"]]));
            }
        }
    }
    let survivors_reported = procs
        .iter()
        .enumerate()
        .filter(|(i, p)| *i != victim && p.stderr().contains("joining the next round"))
        .count();
    assert!(survivors_reported >= 3, "the survivors did not say their round broke");
}

/// A graceful leave (stdin closed): the leaver exits 0 at once and the others re-form
/// without waiting for its lease to expire.
pub async fn graceful_leave(url: UrlFn<'_>) {
    let url = url(
        &run_id("leave"),
        "min_workers=2&max_workers=3&last_call_timeout=1s&keep_alive_ttl=30s&timeout=20s",
    );
    let mut procs: Vec<Proc> = (0..3).map(|i| spawn_join(&url, &format!("w{i}"))).collect();
    let mut rounds = Vec::new();
    for p in &mut procs {
        rounds.push(p.json(T).await);
    }
    assert_one_round(&rounds, 3);
    let left = Instant::now();
    procs[0].close_stdin();
    assert_eq!(procs[0].exit_code(T).await, 0, "{}", procs[0].stderr());
    let mut next = Vec::new();
    for p in procs.iter_mut().skip(1) {
        next.push(p.json(T).await);
    }
    assert_one_round(&next, 2);
    assert!(
        left.elapsed() < Duration::from_secs(15),
        "re-forming waited for the lease: {:?}",
        left.elapsed()
    );
}

/// `rdzv close` (without min_workers) while two wait: they exit with code 4.
pub async fn close_while_waiting(url: UrlFn<'_>) {
    let run = run_id("close");
    let join_url = url(&run, "min_workers=3&keep_alive_ttl=2s&timeout=30s");
    let mut procs: Vec<Proc> = (0..2).map(|i| spawn_join(&join_url, &format!("w{i}"))).collect();
    // Both wait for a third: `status` shows them joined.
    let status_url = url(&run, "");
    let deadline = Instant::now() + T;
    loop {
        let (_, out, _) = run_once(&["status", &status_url, "--format", "json"]).await;
        let v: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
        if v["joined_count"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the two never joined: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, out, err) = run_once(&["close", &status_url]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("closed"), "{out}");
    for p in &mut procs {
        assert_eq!(p.exit_code(T).await, 4, "{}", p.stderr());
        assert!(p.stderr().contains("closed"), "{}", p.stderr());
    }
    let (code, _, err) = run_once(&["join", &join_url]).await;
    assert_eq!(code, 4, "{err}");
}

/// `rdzv close` while two members hold their round (no `--hold`, stdin open): both leave
/// and exit 4, "the run is closed", as a worker still waiting does.
pub async fn close_while_holding(url: UrlFn<'_>) {
    let run = run_id("close-holding");
    let join_url = url(&run, "min_workers=2&keep_alive_ttl=2s&timeout=30s");
    let mut procs: Vec<Proc> = (0..2).map(|i| spawn_join(&join_url, &format!("h{i}"))).collect();
    let mut rounds = Vec::new();
    for p in &mut procs {
        rounds.push(p.json(T).await);
    }
    assert_one_round(&rounds, 2);
    let (code, _, err) = run_once(&["close", &url(&run, "")]).await;
    assert_eq!(code, 0, "{err}");
    for p in &mut procs {
        assert_eq!(p.exit_code(T).await, 4, "{}", p.stderr());
        assert!(p.stderr().contains("closed"), "{}", p.stderr());
    }
}

/// One worker of two needed: exit code 3 by the deadline.
pub async fn too_few_workers(url: UrlFn<'_>) {
    let url = url(&run_id("few"), "min_workers=2&keep_alive_ttl=2s&timeout=3s");
    let started = Instant::now();
    let (code, out, err) = run_once(&["join", &url, "--hold", "1s"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("rdzv: ") && err.contains("timed out"), "{err}");
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(10), "{took:?}");
}

/// A URL whose server is not there: exit code 5, one line.
pub async fn server_down(url: &str) {
    let (code, _, err) = run_once(&["join", url]).await;
    assert_eq!(code, 5, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("rdzv: ") && err.contains("unreachable"), "{err}");
    let (code, _, err) = run_once(&["status", url]).await;
    assert_eq!(code, 5, "{err}");
}

/// `rdzv run` end to end: 3 agents run a script that prints its environment; one agent
/// (and its command) is SIGKILLed; the other two restart the command in a round of 2, which
/// then succeeds; the run ends closed and both exit 0.
pub async fn run_end_to_end(url: UrlFn<'_>) {
    let run = run_id("agent");
    let agent_url =
        url(&run, "min_workers=2&max_workers=3&last_call_timeout=2s&keep_alive_ttl=2s&timeout=25s");
    let script = r#"echo "ENV RANK=$RANK WORLD_SIZE=$WORLD_SIZE VERSION=$RDZV_VERSION MASTER=$MASTER_ADDR:$MASTER_PORT RESTART=$RDZV_RESTART_COUNT LOCAL_RANK=$LOCAL_RANK RUN=$RDZV_RUN_ID PID=$$"
if [ "$RDZV_RESTART_COUNT" = 0 ]; then exec sleep 60; else exec sleep 1; fi"#;
    let mut agents: Vec<Proc> = (0..3)
        .map(|i| {
            let node = format!("a{i}");
            Proc::spawn(
                &node,
                &[
                    "run",
                    &agent_url,
                    "--node-id",
                    &node,
                    "--monitor-interval",
                    "1s",
                    "--grace-period",
                    "2s",
                    "--",
                    "sh",
                    "-c",
                    script,
                ],
            )
        })
        .collect();
    let mut first = Vec::new();
    for a in &mut agents {
        let line = a.line(T).await;
        let pid: u32 = field(&line, "PID").parse().expect("pid");
        a.also_kill(pid); // the command runs in its own process group
        first.push(line);
    }
    for line in &first {
        assert_eq!(field(line, "WORLD_SIZE"), "3", "{line}");
        assert_eq!(field(line, "RESTART"), "0", "{line}");
        assert_eq!(field(line, "LOCAL_RANK"), "0", "{line}");
        assert_eq!(field(line, "RUN"), run, "{line}");
        assert_eq!(field(line, "MASTER"), field(&first[0], "MASTER"));
    }
    let mut r: Vec<String> = first.iter().map(|l| field(l, "RANK")).collect();
    r.sort();
    assert_eq!(r, ["0", "1", "2"]);

    // A machine dies: the agent and its command.
    let mut victim = agents.remove(0);
    victim.kill9();
    drop(victim);

    let mut second = Vec::new();
    for a in &mut agents {
        second.push(a.line(T).await);
    }
    for line in &second {
        assert_eq!(field(line, "WORLD_SIZE"), "2", "{line}");
        assert_eq!(field(line, "RESTART"), "1", "{line}");
        assert!(
            field(line, "VERSION").parse::<u64>().expect("v")
                > field(&first[0], "VERSION").parse::<u64>().expect("v")
        );
    }
    let mut r: Vec<String> = second.iter().map(|l| field(l, "RANK")).collect();
    r.sort();
    assert_eq!(r, ["0", "1"]);
    for a in &mut agents {
        assert_eq!(a.exit_code(T).await, 0, "{}", a.stderr());
    }
    let (_, out, _) = run_once(&["status", &url(&run, ""), "--format", "json"]).await;
    let v: Value = serde_json::from_str(out.trim()).expect("status json");
    assert_eq!(v["state"], "closed", "{v}");
}

/// `rdzv run --segment` (or `RDZV_SEGMENT`): agents arriving s1, s2, s1, s2 get consecutive
/// group ranks per segment; each worker sees its segment in `RDZV_SEGMENT`, and `rdzv status`
/// shows each member's.
pub async fn run_with_segments(url: UrlFn<'_>) {
    let run = run_id("segments");
    let agent_url = url(&run, "min_workers=4&max_workers=4&keep_alive_ttl=2s&timeout=25s");
    let script = r#"echo "ENV RANK=$RANK SEGMENT=$RDZV_SEGMENT"; exec sleep 4"#;
    let mut agents = Vec::new();
    for (i, segment) in ["s1", "s2", "s1", "s2"].into_iter().enumerate() {
        let node = format!("a{i}");
        let mut args = vec!["run", &agent_url, "--node-id", &node, "--monitor-interval", "1s"];
        // One of them names its segment in the environment, the others with the flag.
        if i > 0 {
            args.extend(["--segment", segment]);
        }
        args.extend(["--", "sh", "-c", script]);
        let env = if i == 0 { vec![("RDZV_SEGMENT", segment)] } else { Vec::new() };
        agents.push(Proc::spawn_with_env(&node, &args, &env));
        // Arrivals in this order, most likely: the rule holds whatever the order.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let mut segment_of_rank = vec![String::new(); 4];
    for a in &mut agents {
        let line = a.line(T).await;
        let rank: usize = field(&line, "RANK").parse().expect("rank");
        segment_of_rank[rank] = field(&line, "SEGMENT");
    }
    let s = &segment_of_rank;
    assert!(s[0] == s[1] && s[2] == s[3] && s[1] != s[2] && s[0].starts_with('s'), "{s:?}");
    let (_, out, _) = run_once(&["status", &url(&run, ""), "--format", "json"]).await;
    let v: Value = serde_json::from_str(out.trim()).expect("status json");
    let shown: Vec<&str> = v["participants"]
        .as_array()
        .expect("members")
        .iter()
        .map(|p| p["segment"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(shown, segment_of_rank, "{v}");
    let (_, table, _) = run_once(&["status", &url(&run, "")]).await;
    assert!(table.lines().any(|l| l.contains("segment")), "{table}");
    for a in &mut agents {
        assert_eq!(a.exit_code(T).await, 0, "{}", a.stderr());
    }
}

/// `rdzv run` when a command fails with no restarts left: that agent exits with the
/// command's status and closes the run; the other agent stops its command and exits 4.
pub async fn run_failure_is_seen(url: UrlFn<'_>) {
    let run = run_id("fail");
    let agent_url = url(&run, "min_workers=2&keep_alive_ttl=2s&timeout=20s");
    let script = r#"if [ "$RANK" = 1 ]; then exit 7; else exec sleep 60; fi"#;
    let mut agents: Vec<Proc> = (0..2)
        .map(|i| {
            let node = format!("f{i}");
            Proc::spawn(
                &node,
                &[
                    "run",
                    &agent_url,
                    "--node-id",
                    &node,
                    "--max-restarts",
                    "0",
                    "--grace-period",
                    "2s",
                    "--",
                    "sh",
                    "-c",
                    script,
                ],
            )
        })
        .collect();
    let mut codes = Vec::new();
    for a in &mut agents {
        codes.push(a.exit_code(T).await);
    }
    codes.sort_unstable();
    assert!(
        codes == [1, 7] || codes == [4, 7],
        "exit codes {codes:?}: {} / {}",
        agents[0].stderr(),
        agents[1].stderr()
    );
}

/// The value of `NAME=value` in a line of space-separated assignments.
pub fn field(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .to_string()
}

/// `rdzv run` admits a late worker: two agents run in a round of 2; a third arrives and
/// waits; within a monitor interval they stop their commands and re-form a round of 3
/// (not counted as a restart), which then succeeds.
pub async fn run_admits_a_waiter(url: UrlFn<'_>) {
    let run = run_id("admit");
    let agent_url =
        url(&run, "min_workers=2&max_workers=3&last_call_timeout=1s&keep_alive_ttl=2s&timeout=25s");
    let script = r#"echo "ENV RANK=$RANK WORLD_SIZE=$WORLD_SIZE RESTART=$RDZV_RESTART_COUNT PID=$$"
if [ "$WORLD_SIZE" = 3 ]; then exec sleep 1; else exec sleep 60; fi"#;
    let spawn = |i: usize| {
        let node = format!("b{i}");
        Proc::spawn(
            &node,
            &[
                "run",
                &agent_url,
                "--node-id",
                &node,
                "--monitor-interval",
                "500ms",
                "--grace-period",
                "2s",
                "--",
                "sh",
                "-c",
                script,
            ],
        )
    };
    let mut agents: Vec<Proc> = (0..2).map(spawn).collect();
    for a in &mut agents {
        let line = a.line(T).await;
        a.also_kill(field(&line, "PID").parse().expect("pid"));
        assert_eq!(field(&line, "WORLD_SIZE"), "2", "{line}");
    }
    agents.push(spawn(2));
    for a in &mut agents {
        let line = a.line(T).await;
        assert_eq!(field(&line, "WORLD_SIZE"), "3", "{line}");
        assert_eq!(field(&line, "RESTART"), "0", "admitting a waiter is not a restart: {line}");
    }
    for a in &mut agents {
        assert_eq!(a.exit_code(T).await, 0, "{}", a.stderr());
    }
}

/// `rdzv bench` on the server: 8 workers, 2 rounds, JSON with the documented fields; the
/// URL needs no min_workers.
pub async fn bench(url: UrlFn<'_>) {
    let url = url(&run_id("bench"), "keep_alive_ttl=2s&timeout=20s");
    let (code, out, err) =
        run_once(&["bench", &url, "--workers", "8", "--rounds", "2", "--format", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("bench json");
    assert_eq!(v["workers"], 8);
    assert_eq!(v["rounds"], 2);
    let writes = v["writes_per_worker_round"].as_f64().expect("writes");
    assert!(writes > 0.0 && writes < 20.0, "{v}");
    assert!(v["latency_ms"]["max"].as_f64().expect("max") >= v["latency_ms"]["p50"].as_f64().expect("p50"));
    assert_eq!(v["clients"], 1, "{v}");
}

/// `rdzv bench --client-per-worker`: every worker on a client of its own, and the operations
/// of all clients counted (a worker makes at least two writes and two reads in a first round,
/// a few more at N = 8 where the round's own writes are shared by few: the counts of one
/// client alone would be under one per worker).
pub async fn bench_client_per_worker(url: UrlFn<'_>) {
    let url = url(&run_id("bench-clients"), "keep_alive_ttl=2s&timeout=20s");
    let (code, out, err) = run_once(&[
        "bench",
        &url,
        "--workers",
        "8",
        "--rounds",
        "1",
        "--client-per-worker",
        "--format",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("bench json");
    assert_eq!(v["workers"], 8, "{v}");
    assert_eq!(v["clients"], 8, "{v}");
    let writes = v["writes_per_worker_round"].as_f64().expect("writes");
    let reads = v["reads_per_worker_round"].as_f64().expect("reads");
    assert!((1.5..=8.0).contains(&writes), "{v}");
    assert!((1.5..=8.0).contains(&reads), "{v}");
}

/// Each scenario is bounded here as a whole, whatever its own deadlines.
pub async fn bounded(f: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(std::time::Duration::from_secs(90), f).await.expect("scenario finished within 90 s");
}

/// One `#[tokio::test]` per multi-process scenario, for a backend given by `$url_fn` (an
/// async fn returning the URL builder) and `$down` (a URL of that scheme where no server is).
#[macro_export]
macro_rules! cli_scenarios {
    ($url_fn:path, $down:expr) => {
        $crate::cli_scenarios!(@cases $url_fn;
            four_form_a_round, min_below_max_last_call, six_with_max_four_then_sigkill,
            graceful_leave, close_while_waiting, close_while_holding, too_few_workers, run_end_to_end,
            run_failure_is_seen, run_admits_a_waiter, run_with_segments, bench, bench_client_per_worker);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn server_down() {
            cli_support::bounded(cli_support::server_down(&$down)).await;
        }
    };
    (@cases $url_fn:path; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let url = $url_fn().await;
                cli_support::bounded(cli_support::$case(&url)).await;
            }
        )*
    };
}
