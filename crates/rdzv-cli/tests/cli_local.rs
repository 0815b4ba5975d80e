//! The `rdzv` binary without any server: the demo, usage and configuration errors, help.

#![allow(clippy::unwrap_used)]

mod cli_support;

use cli_support::run_once;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_and_prints_two_rounds() {
    let started = std::time::Instant::now();
    let (code, out, err) = run_once(&["demo"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "the demo is quiet on stderr: {err}");
    assert!(out.contains("round 1: 8 workers"), "{out}");
    assert!(out.contains("crashes"), "{out}");
    assert!(out.contains("survivors were told after"), "{out}");
    let second = out.lines().find(|l| l.starts_with("round ") && !l.starts_with("round 1:"));
    assert!(second.is_some_and(|l| l.contains("8 workers")), "{out}");
    assert!(out.contains("node8"), "the newcomer is in the second round: {out}");
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_fewer_workers() {
    let (code, out, err) = run_once(&["demo", "--workers", "3"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("round 1: 3 workers"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_exit_2_with_one_sentence() {
    for url in [
        "etcd://localhost:99999/job?min_workers=2",
        "etcd://localhost:2379/job",
        "nosuch://h/job?min_workers=1",
        "etcd://localhost:2379/job?min_workers=2&bogus=1",
        "not a url",
    ] {
        let (code, out, err) = run_once(&["join", url]).await;
        assert_eq!(code, 2, "{url}: {err}");
        assert!(out.is_empty(), "{url}: {out}");
        assert_eq!(err.lines().count(), 1, "{url}: {err}");
        assert!(err.starts_with("rdzv: "), "{url}: {err}");
    }
    let (code, _, err) = run_once(&["join", "etcd://user:hunter2@localhost:99999/job?min_workers=1"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2() {
    for args in [
        &["join"][..],
        &["nosuch"],
        &["join", "mem://a/b?min_workers=1", "--format", "xml"],
        &["run", "mem://a/b?min_workers=1"],
    ] {
        let (code, _, err) = run_once(args).await;
        assert_eq!(code, 2, "{args:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_documents_every_command() {
    let (code, out, _) = run_once(&["--help"]).await;
    assert_eq!(code, 0);
    for cmd in ["join", "run", "status", "close", "bench", "demo", "Exit codes"] {
        assert!(out.contains(cmd), "{cmd} missing from:\n{out}");
    }
    for cmd in ["join", "run", "status", "close", "bench", "demo"] {
        let (code, out, _) = run_once(&[cmd, "--help"]).await;
        assert_eq!(code, 0);
        assert!(out.contains("Example"), "{cmd} --help has no example:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdzv_url_supplies_the_url() {
    let out = tokio::process::Command::new(cli_support::RDZV)
        .args(["join", "--hold", "0s", "--format", "env"])
        .env("RDZV_URL", "mem://env/job?min_workers=1")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("RANK=0\n") && stdout.contains("WORLD_SIZE=1\n"), "{stdout}");
    assert!(stdout.contains("RDZV_RUN_ID=job\n"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_on_mem_prints_json() {
    let (code, out, err) =
        run_once(&["bench", "mem://bench/b", "--workers", "8", "--rounds", "3", "--format", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["workers"], 8);
    assert_eq!(v["rounds"], 3);
    assert!(v["latency_ms"]["p50"].as_f64().unwrap() > 0.0);
    assert!(v["writes_per_worker_round"].as_f64().unwrap() > 0.0);
    assert!(v["peak_memory_kib"].as_u64().unwrap() > 0);
    assert_eq!(v["clients"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_client_per_worker_on_mem() {
    let (code, out, err) = run_once(&[
        "bench",
        "mem://bench-clients/b",
        "--workers",
        "8",
        "--rounds",
        "2",
        "--client-per-worker",
        "--format",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["clients"], 8, "{v}");
    // Counted over all eight clients: one alone would see about an eighth of this.
    assert!(v["writes_per_worker_round"].as_f64().unwrap() >= 1.5, "{v}");
    // (Each worker reads the state once; nobody counts the others' keys.)
    assert!(v["reads_per_worker_round"].as_f64().unwrap() >= 0.75, "{v}");
}

/// Run ids and node ids follow one rule at every entry point of the binary (flags, the
/// URL's path, its `node_id` option), and over-long durations are refused: all exit 2
/// before anything joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_identifiers_and_durations_exit_2() {
    for (args, says) in [
        (&["bench", "mem://ids/b", "--workers", "1", "--run-id", "a/rdzv/v_1/join/x"][..], "`/`"),
        (&["bench", "mem://ids/b", "--workers", "1", "--run-id", ""], "empty"),
        (&["join", "mem://ids/j?min_workers=1", "--node-id", ""], "empty"),
        (&["join", "mem://ids/j?min_workers=1", "--node-id", "a b"], "whitespace"),
        (&["run", "mem://ids/r?min_workers=1", "--node-id", "x/y", "--", "true"], "`/`"),
        (&["join", "mem://ids/a%2Fb?min_workers=1"], "run_id"),
        (&["join", "mem://ids/a%20b?min_workers=1"], "whitespace"),
        (&["join", "mem://ids/j?min_workers=1&node_id=a%2Fb"], "node_id"),
        // What other Redis tools read as the database is refused as a run id.
        (&["join", "redis://127.0.0.1:1/0?min_workers=1"], "redis://host:6379/<run_id>?db=0"),
        (&["join", "mem://ids/j?min_workers=1&timeout=18446744073709551615"], "at most one year"),
        (&["join", "mem://ids/j?min_workers=1&run_ttl=600000000000h"], "too long"),
        (&["join", "mem://ids/j?min_workers=1", "--hold", "18446744073709551615s"], "too long"),
        (
            &["run", "mem://ids/r?min_workers=1", "--monitor-interval", "0s", "--", "true"],
            "greater than zero",
        ),
    ] {
        let (code, out, err) = run_once(args).await;
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
    }
    // The same ids, well-formed, work.
    let (code, _, err) =
        run_once(&["join", "mem://ids/12345678?min_workers=1", "--node-id", "trainer-0.svc", "--hold", "0s"])
            .await;
    assert_eq!(code, 0, "{err}");
}

/// `rdzv run` on a URL with a password, with `RDZV_PASSWORD` set too: the command's
/// environment holds neither password; `RDZV_URL` reaches it redacted (or not at all when it
/// does not parse), and the round's own variables are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_hides_the_password_from_the_command() {
    let cases = [
        // The URL comes from RDZV_URL.
        (
            None,
            "mem://u:hunter2@pwtest/job1?min_workers=1",
            Some("RDZV_URL=mem://u:***@pwtest/job1?min_workers=1"),
        ),
        // The URL is an argument; the inherited RDZV_URL names another backend.
        (
            Some("mem://pwtest/job2?min_workers=1"),
            "redis://:hunter2@h:6379/x",
            Some("RDZV_URL=redis://:***@h:6379/x"),
        ),
        // An inherited RDZV_URL that does not parse (an unencoded `/` in the password).
        (Some("mem://pwtest/job3?min_workers=1"), "redis://:hun/ter2@h/x", None),
    ];
    for (arg, env_url, expected) in cases {
        let mut args = vec!["run"];
        args.extend(arg);
        args.extend(["--", "env"]);
        let out = tokio::process::Command::new(cli_support::RDZV)
            .args(&args)
            .env("RDZV_URL", env_url)
            .env("RDZV_PASSWORD", "from-env-s3cret")
            .stdin(std::process::Stdio::null())
            .output();
        let out = tokio::time::timeout(std::time::Duration::from_secs(30), out).await.unwrap().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(
            stdout.contains("RANK=0\n") && stdout.contains("WORLD_SIZE=1\n"),
            "the command ran: {stdout}"
        );
        for secret in ["hunter2", "ter2", "from-env-s3cret"] {
            assert!(!stdout.contains(secret), "{args:?}: the command saw `{secret}`:\n{stdout}");
            assert!(!stderr.contains(secret), "{args:?}: the agent printed `{secret}`:\n{stderr}");
        }
        assert!(!stdout.contains("RDZV_PASSWORD"), "{stdout}");
        match expected {
            Some(line) => assert!(stdout.lines().any(|l| l == line), "{args:?}: no `{line}` in:\n{stdout}"),
            None => assert!(!stdout.contains("RDZV_URL="), "{args:?}: {stdout}"),
        }
    }
}

/// A stand-in for `nvidia-smi` in `dir` (this machine has no GPU) that prints `output`.
fn fake_nvidia_smi(dir: &std::path::Path, output: &str) -> std::path::PathBuf {
    let smi = dir.join("nvidia-smi");
    std::fs::write(&smi, format!("#!/bin/sh\nprintf '%s' '{output}'\n")).unwrap();
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    smi
}

/// `rdzv health`: each built-in alone, exit 0 or 1 with one line why; the `gpu` check reads
/// what nvidia-smi lists (a stand-in script named by RDZV_NVIDIA_SMI: this machine has no
/// GPU); a check that does not exist is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_runs_each_builtin_and_says_why_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let listing = "GPU 0: NVIDIA H100 (UUID: GPU-0)\nGPU 1: NVIDIA H100 (UUID: GPU-1)\n";
    let smi = fake_nvidia_smi(dir.path(), listing);
    let smi = smi.to_str().unwrap();
    /// Arguments, environment, exit code, what the one line says.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], i32, &'a str);
    let cases: [Case<'_>; 7] = [
        (&["health", "gpu", "--nproc-per-node", "2"], &[("RDZV_NVIDIA_SMI", smi)], 0, "healthy: gpu passed"),
        (
            &["health", "gpu:4"],
            &[("RDZV_NVIDIA_SMI", smi)],
            1,
            "unhealthy: builtin gpu: nvidia-smi lists 2 GPU(s); 4 expected",
        ),
        (
            &["health", "gpu"],
            &[("RDZV_NVIDIA_SMI", "/nonexistent/nvidia-smi")],
            1,
            "not found: no NVIDIA driver",
        ),
        (&["health", "disk:/:1K", "builtin:disk:/tmp:1"], &[], 0, "healthy: disk:/, disk:/tmp passed"),
        (&["health", "disk:/:1000000T"], &[], 1, "unhealthy: builtin disk: / has"),
        (&["health", "store", "--url", "mem://health/run"], &[], 0, "healthy: store passed"),
        (&["health", "store"], &[], 2, "needs the run's URL"),
    ];
    for (args, env, code, says) in cases {
        let (got, out, err) = cli_support::run_with_env(args, env).await;
        assert_eq!(got, code, "{args:?}: {out}{err}");
        let said = if code == 2 { &err } else { &out };
        assert!(said.contains(says) && said.lines().count() == 1, "{args:?}: {out}{err}");
    }
    let (code, _, err) = run_once(&["health", "gpus"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown built-in check"), "{err}");
}

/// `rdzv run`'s health flags: a check that does not exist, or a timing flag without any
/// check, stops it before it joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_rejects_a_bad_health_check_at_start() {
    let url = "mem://health/run?min_workers=1";
    let (code, _, err) = run_once(&["run", url, "--health-check", "builtin:gpu,disk", "--", "true"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("disk:PATH:MIN"), "{err}");
    let (code, _, err) = run_once(&["run", url, "--health-check-interval", "5s", "--", "true"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--health-check-interval") && err.contains("without --health-check"), "{err}");
    let (code, _, err) = run_once(&["run", url, "--health-check", "rdzv-no-such-check", "--", "true"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("health_check") && err.contains("not found"), "{err}");
}

/// `rdzv run --segment auto`: the workers see the node's NVLink domain as read from
/// `nvidia-smi -q` (a stand-in script: this machine has no GPU); a node without one, or a
/// label that is not an identifier, stops the agent before it joins, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_segment_auto_takes_the_nvlink_domain_or_says_there_is_none() {
    let dir = tempfile::tempdir().unwrap();
    let report = "GPU 00000000:18:00.0\n    Fabric\n        ClusterUUID : 8cbb1d1e-5c7e-4b6a-9d3e-0a1b2c3d4e5f\n        CliqueId : 7\n";
    let smi = fake_nvidia_smi(dir.path(), report);
    let url = "mem://segment/run?min_workers=1";
    let command = ["--", "sh", "-c", "echo SEGMENT=$RDZV_SEGMENT"];
    let args: Vec<&str> = ["run", url, "--segment", "auto"].into_iter().chain(command).collect();
    let (code, out, err) =
        cli_support::run_with_env(&args, &[("RDZV_NVIDIA_SMI", smi.to_str().unwrap())]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("SEGMENT=8cbb1d1e-5c7e-4b6a-9d3e-0a1b2c3d4e5f.7"), "{out}");

    let (code, _, err) =
        cli_support::run_with_env(&args, &[("RDZV_NVIDIA_SMI", "/nonexistent/nvidia-smi")]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no NVLink domain") && err.contains("give a label instead"), "{err}");
    let args: Vec<&str> = ["run", url, "--segment", "rack 7"].into_iter().chain(command).collect();
    let (code, _, err) = run_once(&args).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--segment") && err.contains("whitespace"), "{err}");
}
