//! The `rdzv` binary, as several processes, against a real Redis (started by the test).

#![allow(clippy::unwrap_used)]

mod cli_support;

async fn url_fn() -> impl Fn(&str, &str) -> String + Sync {
    let server = rdzv_redis::testing::shared();
    move |run: &str, query: &str| server.url(run, query)
}

/// A URL of this scheme where no server listens.
fn nowhere() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("redis://127.0.0.1:{port}/down?min_workers=1")
}

cli_scenarios!(url_fn, nowhere());

/// Against a Redis that requires a password: the password reaches the server from
/// `RDZV_PASSWORD` or `password_file=` without being written in the URL, and the command of
/// `rdzv run` sees no password however it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_reach_the_server_but_not_the_command() {
    const PW: &str = "s3cret-pw";
    let server = rdzv_redis::testing::RedisServer::start_with_args(&["--requirepass", PW])
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
    let url = |name: &str, extra: &str| {
        server.url(&cli_support::run_id(name), &format!("min_workers=1&timeout=10s{extra}"))
    };

    // Without a password the server refuses.
    let (code, _, err) = cli_support::run_with_env(&["join", &url("nopw", ""), "--hold", "0s"], &[]).await;
    assert_ne!(code, 0, "joined without the password: {err}");

    // From the environment.
    let (code, out, err) =
        cli_support::run_with_env(&["join", &url("env", ""), "--hold", "0s"], &[("RDZV_PASSWORD", PW)]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"world_size\":1"), "{out}");
    let (code, _, err) = cli_support::run_with_env(
        &["join", &url("envbad", ""), "--hold", "0s"],
        &[("RDZV_PASSWORD", "wrong")],
    )
    .await;
    assert_ne!(code, 0, "a wrong RDZV_PASSWORD was accepted: {err}");
    assert!(!err.contains("wrong"), "the password was echoed: {err}");

    // From a file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redis-password");
    std::fs::write(&file, format!("{PW}\n")).unwrap();
    let with_file = url("file", &format!("&password_file={}", file.display()));
    let (code, _, err) = cli_support::run_with_env(&["join", &with_file, "--hold", "0s"], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains(PW), "{err}");

    // `rdzv run`, the password in RDZV_URL: the command's environment has none of it.
    let inline = url("run", "").replacen("redis://", &format!("redis://:{PW}@"), 1);
    let (code, out, err) = cli_support::run_with_env(&["run", "--", "env"], &[("RDZV_URL", &inline)]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("RANK=0\n"), "the command ran: {out}");
    assert!(!out.contains(PW) && !err.contains(PW), "the password leaked:\n{out}\n{err}");
    assert!(out.lines().any(|l| l.starts_with("RDZV_URL=redis://:***@127.0.0.1:")), "{out}");

    // `rdzv run`, the password in RDZV_PASSWORD: the command does not inherit it.
    let (code, out, err) =
        cli_support::run_with_env(&["run", &url("run2", ""), "--", "env"], &[("RDZV_PASSWORD", PW)]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("RANK=0\n"), "the command ran: {out}");
    assert!(!out.contains(PW) && !out.contains("RDZV_PASSWORD"), "the password leaked:\n{out}");
}
