//! `rdzv run` as a node agent: several agents as separate processes against a real etcd,
//! each with local workers (small `sh` scripts that print their environment on one line);
//! and, without a server, what the workers inherit and how signals reach them.

#![allow(clippy::unwrap_used)]

mod cli_support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use cli_support::{Proc, run_id, run_once};
use rustix::process::{Pid, Signal};
use serde_json::Value;
use tokio::time::Instant;

const T: Duration = Duration::from_secs(30);

/// What every worker prints first: its environment, as `NAME=value` words.
const ENV_LINE: &str = r#"echo "ENV RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK GROUP_WORLD_SIZE=$GROUP_WORLD_SIZE ROLE_RANK=$ROLE_RANK ROLE_WORLD_SIZE=$ROLE_WORLD_SIZE ROLE_NAME=$ROLE_NAME MASTER=$MASTER_ADDR:$MASTER_PORT RESTART=$TORCHELASTIC_RESTART_COUNT MAX_RESTARTS=$TORCHELASTIC_MAX_RESTARTS AGENT_STORE=$TORCHELASTIC_USE_AGENT_STORE RUN=$TORCHELASTIC_RUN_ID ERROR_FILE=$TORCHELASTIC_ERROR_FILE RDZV_RESTART=$RDZV_RESTART_COUNT PID=$$""#;

async fn etcd_url(run: &str, query: &str) -> String {
    let server = match rdzv_etcd::testing::shared().await {
        Ok(server) => server,
        Err(e) => panic!("cannot start etcd: {e}"),
    };
    if query.is_empty() { server.url(run) } else { server.url(&format!("{run}?{query}")) }
}

/// One worker's line, parsed.
type Env = HashMap<String, String>;

fn parse_env(line: &str) -> Env {
    line.split_whitespace()
        .skip(1)
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn get<'a>(env: &'a Env, name: &str) -> &'a str {
    env.get(name).map(String::as_str).unwrap_or_else(|| panic!("no {name} in {env:?}"))
}

fn num(env: &Env, name: &str) -> usize {
    get(env, name).parse().unwrap_or_else(|_| panic!("{name} is not a number in {env:?}"))
}

/// Starts an agent `rdzv run <url> --node-id <node> <extra…> -- sh -c <script>`.
fn agent(node: &str, url: &str, extra: &[&str], script: &str) -> Proc {
    let mut args = vec!["run", url, "--node-id", node, "--grace-period", "2s"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    Proc::spawn(node, &args)
}

/// The next `n` worker lines of `agent` (lines starting with `ENV `, after an optional
/// `[<rank>]:` prefix, whose rank must then be the line's RANK). Each worker's process group
/// is killed when the agent's `Proc` is dropped, whatever happens to the agent.
async fn env_lines(agent: &mut Proc, n: usize) -> Vec<Env> {
    let mut found = Vec::new();
    let deadline = Instant::now() + T;
    while found.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = agent.line(left).await;
        let (prefix, rest) = match line.strip_prefix('[').and_then(|l| l.split_once("]:")) {
            Some((rank, rest)) => (Some(rank.to_string()), rest.to_string()),
            None => (None, line.clone()),
        };
        if !rest.starts_with("ENV ") {
            continue;
        }
        let env = parse_env(&rest);
        if let Some(rank) = prefix {
            assert_eq!(rank, get(&env, "RANK"), "the --tee prefix is the rank: {line}");
        }
        agent.also_kill(num(&env, "PID") as u32);
        found.push(env);
    }
    found
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

async fn all_end(pids: &[u32], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if pids.iter().all(|p| ended(*p)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn kill(pid: u32, signal: Signal) {
    rustix::process::kill_process(Pid::from_raw(pid as i32).unwrap(), signal).unwrap();
}

/// The workers of one round, agent by agent (`per_agent[i]` from agent i): global ranks are
/// a permutation of 0..world, each agent's local ranks are 0..n, ranks follow the local world
/// sizes in group-rank order, and the round's values agree everywhere.
fn check_round(per_agent: &[Vec<Env>], restart: usize) {
    let all: Vec<&Env> = per_agent.iter().flatten().collect();
    let world = all.len();
    let ranks: Vec<usize> = {
        let mut r: Vec<usize> = all.iter().map(|e| num(e, "RANK")).collect();
        r.sort_unstable();
        r
    };
    assert_eq!(ranks, (0..world).collect::<Vec<_>>(), "{all:?}");
    let mut local_sizes = BTreeMap::new();
    for workers in per_agent {
        let n = workers.len();
        let local: BTreeSet<usize> = workers.iter().map(|e| num(e, "LOCAL_RANK")).collect();
        assert_eq!(local, (0..n).collect(), "{workers:?}");
        let group_rank = num(&workers[0], "GROUP_RANK");
        let base = num(&workers[0], "RANK") - num(&workers[0], "LOCAL_RANK");
        let files: BTreeSet<&str> = workers.iter().map(|e| get(e, "ERROR_FILE")).collect();
        assert_eq!(files.len(), n, "one error file per worker: {workers:?}");
        for e in workers {
            assert_eq!(num(e, "LOCAL_WORLD_SIZE"), n, "{e:?}");
            assert_eq!(num(e, "GROUP_RANK"), group_rank, "{e:?}");
            assert_eq!(num(e, "RANK") - num(e, "LOCAL_RANK"), base, "{e:?}");
        }
        local_sizes.insert(group_rank, (n, base));
    }
    // The agents' group ranks are 0..nodes, and each one's ranks start after those before it.
    assert_eq!(local_sizes.keys().copied().collect::<Vec<_>>(), (0..per_agent.len()).collect::<Vec<_>>());
    let mut offset = 0;
    for (n, base) in local_sizes.values() {
        assert_eq!(*base, offset, "{local_sizes:?}");
        offset += n;
    }
    for e in &all {
        assert_eq!(num(e, "WORLD_SIZE"), world, "{e:?}");
        assert_eq!(num(e, "GROUP_WORLD_SIZE"), per_agent.len(), "{e:?}");
        assert_eq!(num(e, "ROLE_RANK"), num(e, "RANK"), "one role: {e:?}");
        assert_eq!(num(e, "ROLE_WORLD_SIZE"), world, "{e:?}");
        assert_eq!(get(e, "ROLE_NAME"), "default");
        assert_eq!(get(e, "MASTER"), get(all[0], "MASTER"), "MASTER_ADDR/PORT agree");
        assert_eq!(num(e, "RESTART"), restart, "{e:?}");
        assert_eq!(num(e, "RDZV_RESTART"), restart, "{e:?}");
        assert_eq!(get(e, "AGENT_STORE"), "False");
        assert_eq!(get(e, "RUN"), get(all[0], "RUN"));
    }
}

/// The events an agent logged with `--events` (docs/OBSERVABILITY.md), line by line: each one
/// JSON object with an RFC 3339 UTC time (never earlier than the line before), the run id
/// and the agent's node id.
fn logged_events(path: &Path, run: &str, node: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut last = String::new();
    let mut events = Vec::new();
    for line in text.lines() {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
        let time = v["time"].as_str().unwrap_or_else(|| panic!("no time: {line}")).to_string();
        assert!(time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T', "{line}");
        assert!(time >= last, "out of order: {line} after {last}");
        assert_eq!((v["run_id"].as_str(), v["node"].as_str()), (Some(run), Some(node)), "{line}");
        last = time;
        events.push(v);
    }
    events
}

/// Each event in short: its name and what tells it apart (`round_formed`, `worker_exited 0`,
/// `restart peer_failure 1`, `nodes_waiting 0 1`, …).
fn story(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|v| {
            let name = v["event"].as_str().unwrap();
            match name {
                "worker_exited" => format!("{name} {}", v["status"].as_str().unwrap()),
                "restart" => {
                    let counted = if v["counted"] == true { "" } else { " uncounted" };
                    format!("{name} {} {}{counted}", v["cause"].as_str().unwrap(), v["count"])
                }
                "member_lost" => format!("{name} {}", v["reason"].as_str().unwrap()),
                "nodes_waiting" => format!("{name} {} {}", v["waiting"], v["spares"]),
                _ => name.to_string(),
            }
        })
        .collect()
}

/// `story` without the events whose timing races with what the test does: the waiting
/// nodes polled, and a member lost seen while the agent re-forms anyway.
fn plot(events: &[Value]) -> Vec<String> {
    let mut told = story(events);
    told.retain(|e| !e.starts_with("nodes_waiting") && !e.starts_with("member_lost"));
    told
}

/// Waits until `path` holds an event for which `found` holds.
async fn until_logged(path: &Path, run: &str, node: &str, found: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + T;
    while !logged_events(path, run, node).iter().any(&found) {
        assert!(
            Instant::now() < deadline,
            "not logged in {path:?}: {:?}",
            story(&logged_events(path, run, node))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_state(run: &str) -> Value {
    let (_, out, err) = run_once(&["status", &etcd_url(run, "").await, "--format", "json"]).await;
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("status json ({e}): {out} {err}"))
}

async fn bounded(f: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), f).await.expect("scenario finished within 60 s");
}

/// Three agents with 2, 2 and 3 workers: 7 workers with torchrun's ranks; all exit 0, so
/// the agents close the run and exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_give_their_workers_torchrun_ranks() {
    bounded(async {
        let run = run_id("ranks");
        let url = etcd_url(&run, "min_workers=3&keep_alive_ttl=2s&timeout=25s").await;
        let script = format!("{ENV_LINE}\nexit 0");
        let sizes = [2usize, 2, 3];
        let mut agents: Vec<Proc> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| agent(&format!("r{i}"), &url, &["--nproc-per-node", &n.to_string()], &script))
            .collect();
        let mut per_agent = Vec::new();
        for (a, n) in agents.iter_mut().zip(sizes) {
            per_agent.push(env_lines(a, n).await);
        }
        check_round(&per_agent, 0);
        for e in per_agent.iter().flatten() {
            assert_eq!(get(e, "RUN"), run);
            assert_eq!(get(e, "MAX_RESTARTS"), "3");
        }
        for a in &mut agents {
            assert_eq!(a.exit_code(T).await, 0, "{}", a.stderr());
        }
        assert_eq!(run_state(&run).await["state"], "closed");
    })
    .await;
}

/// A worker is SIGKILLed: its agent reports it (rank and signal), both agents stop their
/// workers and restart the group (restart counter 1), which then succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_restarts_the_group() {
    bounded(async {
        let run = run_id("wkill");
        let url = etcd_url(&run, "min_workers=2&keep_alive_ttl=2s&timeout=25s").await;
        let script =
            format!("{ENV_LINE}\nif [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi");
        let dir = tempfile::tempdir().unwrap();
        let logs: Vec<String> =
            (0..2).map(|i| dir.path().join(format!("k{i}.jsonl")).display().to_string()).collect();
        let mut agents: Vec<Proc> = (0..2)
            .map(|i| {
                let extra = ["--nproc-per-node", "2", "--monitor-interval", "1s", "--events", &logs[i]];
                agent(&format!("k{i}"), &url, &extra, &script)
            })
            .collect();
        let mut first = Vec::new();
        for a in &mut agents {
            first.push(env_lines(a, 2).await);
        }
        check_round(&first, 0);
        let (owner, victim) = first
            .iter()
            .enumerate()
            .find_map(|(i, ws)| ws.iter().find(|e| get(e, "RANK") == "1").map(|e| (i, e)))
            .unwrap();
        kill(num(victim, "PID") as u32, Signal::KILL);

        let mut second = Vec::new();
        for a in &mut agents {
            second.push(env_lines(a, 2).await);
        }
        check_round(&second, 1);
        // The first group's workers were all stopped.
        let old: Vec<u32> = first.iter().flatten().map(|e| num(e, "PID") as u32).collect();
        assert!(all_end(&old, Duration::from_secs(5)).await, "workers of the first group still run");
        for a in &mut agents {
            assert_eq!(a.exit_code(T).await, 0, "{}", a.stderr());
        }
        let report = agents[owner].stderr();
        assert!(
            report.contains("rank 1 (local rank") && report.contains("signal 9 (SIGKILL)"),
            "the failure is reported with its rank and signal:\n{report}"
        );
        assert!(report.contains("restart 1 of 3"), "{report}");
        // The event logs, line by line: the owner saw its worker killed and restarted for it;
        // the other restarted for that failure (or for the round it broke, seen first).
        for (i, log) in logs.iter().enumerate() {
            let events = logged_events(Path::new(log), &run, &format!("k{i}"));
            let told = plot(&events);
            let cause = if i == owner { "restart worker_failure 1" } else { told[1].as_str() };
            assert!(
                ["restart worker_failure 1", "restart peer_failure 1", "restart member_lost 1"]
                    .contains(&cause)
            );
            let mut expected = vec![
                "round_formed",
                cause,
                "round_formed",
                "worker_exited 0",
                "worker_exited 0",
                "run_closed",
            ];
            if i == owner {
                expected.insert(1, "worker_exited SIGKILL");
            }
            assert_eq!(told, expected, "k{i}: {:?}", story(&events));
            let rounds: Vec<&Value> = events.iter().filter(|e| e["event"] == "round_formed").collect();
            assert!(rounds[1]["version"].as_u64() > rounds[0]["version"].as_u64(), "{rounds:?}");
            assert_eq!(rounds[1]["previous_version"], rounds[0]["version"]);
            let killed = events.iter().find(|e| e["status"] == "SIGKILL");
            assert_eq!(killed.map(|e| e["rank"].as_u64()), (i == owner).then_some(Some(1)));
        }
    })
    .await;
}

/// An agent is SIGKILLed: its workers end within a couple of seconds (parent-death
/// signal); the other two agents re-form a round of 4 workers (restart 1), which succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_takes_its_workers_along() {
    bounded(async {
        let run = run_id("akill");
        let url =
            etcd_url(&run, "min_workers=2&max_workers=3&last_call_timeout=2s&keep_alive_ttl=2s&timeout=25s")
                .await;
        let script =
            format!("{ENV_LINE}\nif [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi");
        let dir = tempfile::tempdir().unwrap();
        let logs: Vec<String> =
            (0..3).map(|i| dir.path().join(format!("d{i}.jsonl")).display().to_string()).collect();
        let mut agents: Vec<Proc> = (0..3)
            .map(|i| {
                let extra = ["--nproc-per-node", "2", "--monitor-interval", "1s", "--events", &logs[i]];
                agent(&format!("d{i}"), &url, &extra, &script)
            })
            .collect();
        let mut first = Vec::new();
        for a in &mut agents {
            first.push(env_lines(a, 2).await);
        }
        check_round(&first, 0);

        let mut victim = agents.remove(0);
        let orphans: Vec<u32> = first[0].iter().map(|e| num(e, "PID") as u32).collect();
        assert!(orphans.iter().all(|p| !ended(*p)), "the workers run before the agent dies");
        victim.kill9(); // the agent's own process group: its workers are in theirs
        assert!(
            all_end(&orphans, Duration::from_secs(3)).await,
            "the workers outlived their agent: {orphans:?}"
        );

        let mut second = Vec::new();
        for a in &mut agents {
            second.push(env_lines(a, 2).await);
        }
        check_round(&second, 1);
        for a in &mut agents {
            assert_eq!(a.exit_code(T).await, 0, "{}", a.stderr());
        }
        drop(victim);
        // The killed agent's log holds what it wrote before it died, line by line.
        let dead = logged_events(Path::new(&logs[0]), &run, "d0");
        assert_eq!(story(&dead)[0], "round_formed", "{:?}", story(&dead));
        let dead_rank = dead[0]["rank"].as_u64().unwrap();
        // The survivors lost it, said so, restarted for it, and went on without it.
        for (i, log) in logs.iter().enumerate().skip(1) {
            let events = logged_events(Path::new(log), &run, &format!("d{i}"));
            let expected = [
                "round_formed",
                "restart member_lost 1",
                "round_formed",
                "worker_exited 0",
                "worker_exited 0",
                "run_closed",
            ];
            assert_eq!(plot(&events), expected, "d{i}: {:?}", story(&events));
            let lost =
                events.iter().find(|e| e["event"] == "member_lost").unwrap_or_else(|| panic!("{events:?}"));
            let restart = events.iter().position(|e| e["event"] == "restart").unwrap();
            assert!(events.iter().position(|e| e["event"] == "member_lost").unwrap() < restart);
            match lost["reason"].as_str().unwrap() {
                "member_gone" if !lost["rank"].is_null() => {
                    assert_eq!(
                        (lost["rank"].as_u64(), lost["member"].as_str()),
                        (Some(dead_rank), Some("d0"))
                    )
                }
                "member_gone" | "ended" => {}
                other => panic!("{other}: {lost}"),
            }
            let second = events.iter().filter(|e| e["event"] == "round_formed").nth(1).unwrap();
            assert_eq!(
                (second["world_size"].as_u64(), second["left"].clone()),
                (Some(2), serde_json::json!([dead_rank]))
            );
        }
    })
    .await;
}

/// Two agents fill a round (max_workers=2); a third waits as a spare, which the members
/// report (`nodes_waiting` with one spare) without re-forming for it; a member is SIGKILLed,
/// and the spare takes its place: its log says it was promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_is_reported_and_promoted_in_the_event_logs() {
    bounded(async {
        let run = run_id("spare");
        let url =
            etcd_url(&run, "min_workers=2&max_workers=2&last_call_timeout=1s&keep_alive_ttl=2s&timeout=25s")
                .await;
        // The first round's workers wait; later rounds' succeed.
        let script = format!("{ENV_LINE}\nif [ -z \"$RDZV_PREVIOUS_VERSION\" ]; then exec sleep 60; fi");
        let dir = tempfile::tempdir().unwrap();
        let logs: Vec<String> =
            (0..3).map(|i| dir.path().join(format!("s{i}.jsonl")).display().to_string()).collect();
        let start = |i: usize| {
            agent(&format!("s{i}"), &url, &["--monitor-interval", "300ms", "--events", &logs[i]], &script)
        };
        let mut members = vec![start(0), start(1)];
        let mut first = Vec::new();
        for a in &mut members {
            first.push(env_lines(a, 1).await);
        }
        check_round(&first, 0);
        let mut spare = start(2);
        until_logged(Path::new(&logs[0]), &run, "s0", |e| e["event"] == "nodes_waiting" && e["spares"] == 1)
            .await;
        let mut victim = members.remove(1);
        victim.kill9();
        let dead_rank = num(&first[1][0], "GROUP_RANK");
        let (kept, promoted) = (env_lines(&mut members[0], 1).await, env_lines(&mut spare, 1).await);
        assert_eq!(
            num(&kept[0], "GROUP_RANK"),
            num(&first[0][0], "GROUP_RANK"),
            "the survivor keeps its rank"
        );
        assert_eq!(num(&promoted[0], "GROUP_RANK"), dead_rank, "the spare takes the dead member's");
        assert_eq!((num(&kept[0], "RESTART"), num(&promoted[0], "RESTART")), (1, 0));
        assert_eq!(members[0].exit_code(T).await, 0, "{}", members[0].stderr());
        assert_eq!(spare.exit_code(T).await, 0, "{}", spare.stderr());
        drop(victim);

        let survivor = logged_events(Path::new(&logs[0]), &run, "s0");
        let told = story(&survivor);
        let spare_seen = told.iter().position(|e| e == "nodes_waiting 0 1").unwrap();
        let restart = told.iter().position(|e| e.starts_with("restart")).unwrap();
        assert!(
            spare_seen < restart
                && told[..spare_seen].iter().all(|e| e == "round_formed" || e == "nodes_waiting 0 0"),
            "{told:?}"
        );
        assert!(
            !told[..restart].iter().any(|e| e.starts_with("nodes_waiting 1")),
            "a spare is no waiting node: {told:?}"
        );
        assert_eq!(
            plot(&survivor),
            ["round_formed", "restart member_lost 1", "round_formed", "worker_exited 0", "run_closed"]
        );
        let promoted = logged_events(Path::new(&logs[2]), &run, "s2");
        assert_eq!(
            plot(&promoted),
            ["round_formed", "spare_promoted", "worker_exited 0", "run_closed"],
            "{:?}",
            story(&promoted)
        );
        let (formed, spare_promoted) = (&promoted[0], &promoted[1]);
        assert_eq!(formed["rank"].as_u64(), Some(dead_rank as u64));
        assert_eq!(
            (formed["previous_rank"].clone(), formed["joined"].clone()),
            (Value::Null, serde_json::json!([dead_rank]))
        );
        assert_eq!(spare_promoted["waited_behind"], formed["previous_version"]);
        assert_eq!(spare_promoted["version"], formed["version"]);
    })
    .await;
}

/// Two agents run a round of 4 workers; a third agent arrives and waits; within a monitor
/// interval the group re-forms with 6 workers, which is not counted as a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_node_is_admitted() {
    bounded(async {
        let run = run_id("admit");
        let url =
            etcd_url(&run, "min_workers=2&max_workers=3&last_call_timeout=1s&keep_alive_ttl=2s&timeout=25s")
                .await;
        let script = format!("{ENV_LINE}\nif [ \"$WORLD_SIZE\" != 6 ]; then exec sleep 60; fi");
        let dir = tempfile::tempdir().unwrap();
        let logs: Vec<String> =
            (0..3).map(|i| dir.path().join(format!("w{i}.jsonl")).display().to_string()).collect();
        let start = |i: usize| {
            let extra = ["--nproc-per-node", "2", "--monitor-interval", "500ms", "--events", &logs[i]];
            agent(&format!("w{i}"), &url, &extra, &script)
        };
        let mut agents: Vec<Proc> = (0..2).map(start).collect();
        let mut first = Vec::new();
        for a in &mut agents {
            first.push(env_lines(a, 2).await);
        }
        check_round(&first, 0);
        agents.push(start(2));
        let mut second = Vec::new();
        for a in &mut agents {
            second.push(env_lines(a, 2).await);
        }
        check_round(&second, 0);
        for a in &mut agents {
            assert_eq!(a.exit_code(T).await, 0, "{}", a.stderr());
        }
        // The members re-formed to admit it, which no restart counts; the newcomer waited
        // behind a round that was not full: no spare.
        for (i, log) in logs.iter().enumerate() {
            let events = logged_events(Path::new(log), &run, &format!("w{i}"));
            let mut expected = vec!["round_formed", "worker_exited 0", "worker_exited 0", "run_closed"];
            if i < 2 {
                expected.splice(0..0, ["round_formed", "restart admit_waiting 0 uncounted"]);
            }
            assert_eq!(plot(&events), expected, "w{i}: {:?}", story(&events));
        }
    })
    .await;
}

/// A worker writes an error file like PyTorch's `@record` and exits 1, with no restarts
/// left: its agent reports the rank, status, error and traceback, closes the run and exits
/// 1; the other agent stops its workers and exits 4 (or 1). `--log-dir` holds one
/// stdout.log per worker; `--tee` copies the lines with a `[rank]:` prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_worker_reports_its_traceback() {
    bounded(async {
        let run = run_id("trace");
        let url = etcd_url(&run, "min_workers=2&keep_alive_ttl=2s&timeout=25s").await;
        let error = r#"{"message": {"message": "ValueError: boom from rank 2", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 7, in <module>\n    main()\nValueError: boom from rank 2\n", "timestamp": "1700000000"}}}"#;
        let script =
            format!("{ENV_LINE}\nif [ \"$RANK\" = 2 ]; then sleep 2; printf '%s' '{error}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1; fi\nexec sleep 60");
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let mut agents: Vec<Proc> = (0..2)
            .map(|i| {
                let dir = dirs[i].path().to_str().unwrap();
                let extra = ["--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", dir, "--tee"];
                agent(&format!("e{i}"), &url, &extra, &script)
            })
            .collect();
        let mut lines = Vec::new();
        for a in &mut agents {
            lines.push(env_lines(a, 2).await);
        }
        check_round(&lines, 0);
        let owner = lines.iter().position(|ws| ws.iter().any(|e| get(e, "RANK") == "2")).unwrap();
        let mut codes = Vec::new();
        for a in &mut agents {
            codes.push(a.exit_code(T).await);
        }
        assert_eq!(codes[owner], 1, "{}", agents[owner].stderr());
        assert!([1, 4].contains(&codes[1 - owner]), "{codes:?}: {}", agents[1 - owner].stderr());
        let report = agents[owner].stderr();
        for says in [
            "rank 2 (local rank 0",
            "exited with status 1",
            "error: ValueError: boom from rank 2",
            "Traceback (most recent call last):",
            r#"File "train.py", line 7, in <module>"#,
            "attempt_0/0/error.json",
        ] {
            assert!(report.contains(says), "the report should say {says:?}:\n{report}");
        }
        // One log per worker and attempt, holding what the worker printed.
        for (i, dir) in dirs.iter().enumerate() {
            for local_rank in 0..2 {
                let log = dir.path().join(format!("attempt_0/{local_rank}/stdout.log"));
                let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
                let env = parse_env(text.lines().next().unwrap_or(""));
                assert_eq!(num(&env, "LOCAL_RANK"), local_rank, "{}: {text}", log.display());
                assert_eq!(get(&env, "GROUP_RANK"), get(&lines[i][0], "GROUP_RANK"), "{}: {text}", log.display());
            }
        }
    })
    .await;
}

/// With several workers, none sees the backend's password: `RDZV_PASSWORD` is removed and
/// `RDZV_URL` arrives redacted, for every local worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_sees_the_password() {
    let script = r#"echo "BEGIN $LOCAL_RANK"; env; echo "END $LOCAL_RANK""#;
    let out = tokio::process::Command::new(cli_support::RDZV)
        .args(["run", "--nproc-per-node", "3", "--", "sh", "-c", script])
        .env("RDZV_URL", "mem://u:hunter2@pw/job?min_workers=1")
        .env("RDZV_PASSWORD", "from-env-s3cret")
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(T, out).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for local_rank in 0..3 {
        assert!(stdout.contains(&format!("END {local_rank}")), "worker {local_rank} ran: {stdout}");
    }
    assert_eq!(
        stdout.lines().filter(|l| *l == "RDZV_URL=mem://u:***@pw/job?min_workers=1").count(),
        3,
        "{stdout}"
    );
    for secret in ["hunter2", "from-env-s3cret", "RDZV_PASSWORD"] {
        assert!(!stdout.contains(secret), "a worker saw `{secret}`:\n{stdout}");
        assert!(!stderr.contains(secret), "the agent printed `{secret}`:\n{stderr}");
    }
}

/// SIGHUP to the agent is handled like SIGTERM: every worker's process group gets SIGTERM
/// (a worker's own child too), and the agent exits with the workers' status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_stops_the_workers_like_sigterm() {
    let script = r#"sleep 60 & echo "CHILD $LOCAL_RANK $!"; trap 'echo "TERM $LOCAL_RANK"; exit 7' TERM; echo "READY $LOCAL_RANK $PPID"; while :; do sleep 0.1; done"#;
    let mut a = Proc::spawn(
        "hup",
        &[
            "run",
            "mem://hup/job?min_workers=1",
            "--nproc-per-node",
            "2",
            "--grace-period",
            "5s",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    let mut children = Vec::new();
    let mut ready = 0;
    let mut agent_pid = 0;
    while ready < 2 {
        let line = a.line(T).await;
        if let Some(rest) = line.strip_prefix("CHILD ") {
            let pid: u32 = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
            children.push(pid);
        }
        if let Some(rest) = line.strip_prefix("READY ") {
            // A worker's parent is its agent (`rdzv __exec` became the worker).
            agent_pid = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
            ready += 1;
        }
    }
    for pid in &children {
        a.also_kill(*pid);
    }
    kill(agent_pid, Signal::HUP);
    let mut termed = BTreeSet::new();
    while termed.len() < 2 {
        let line = a.line(T).await;
        if let Some(rank) = line.strip_prefix("TERM ") {
            termed.insert(rank.to_string());
        }
    }
    assert_eq!(a.exit_code(T).await, 7, "{}", a.stderr());
    assert!(a.stderr().contains("SIGHUP received"), "{}", a.stderr());
    assert_eq!(children.len(), 2);
    assert!(all_end(&children, Duration::from_secs(3)).await, "the workers' children were not stopped");
}

/// `--nproc-per-node auto` follows `CUDA_VISIBLE_DEVICES`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_counts_the_visible_gpus() {
    let out = tokio::process::Command::new(cli_support::RDZV)
        .args([
            "run",
            "mem://auto/job?min_workers=1",
            "--nproc-per-node",
            "auto",
            "--",
            "sh",
            "-c",
            "echo W=$LOCAL_WORLD_SIZE",
        ])
        .env("CUDA_VISIBLE_DEVICES", "0,1,3")
        .env_remove("RDZV_URL")
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(T, out).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().filter(|l| *l == "W=3").count(), 3, "{stdout}");
}

/// A command that does not exist: the agent says so and exits 1 before joining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_command_is_refused_before_joining() {
    let (code, _, err) =
        run_once(&["run", "mem://none/job?min_workers=2", "--nproc-per-node", "2", "--", "rdzv-no-such-cmd"])
            .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot start `rdzv-no-such-cmd`"), "{err}");
}
