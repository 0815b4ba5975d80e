//! The `rdzv` binary, as several processes, against a real Redis (started by the test).

#![allow(clippy::unwrap_used)]

mod cli_support;

use std::time::Duration;

use cli_support as s;

async fn url_fn() -> impl Fn(&str, &str) -> String + Sync {
    let server = rdzv_redis::testing::shared();
    move |run: &str, query: &str| server.url(run, query)
}

/// Each scenario is bounded here as a whole, whatever its own deadlines.
async fn bounded(f: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(90), f).await.expect("scenario finished within 90 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_form_a_round() {
    let url = url_fn().await;
    bounded(s::four_form_a_round(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_below_max_completes_after_the_last_call() {
    let url = url_fn().await;
    bounded(s::min_below_max_last_call(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_with_max_four_then_a_member_is_killed() {
    let url = url_fn().await;
    bounded(s::six_with_max_four_then_sigkill(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_leave() {
    let url = url_fn().await;
    bounded(s::graceful_leave(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_while_others_wait_exits_4() {
    let url = url_fn().await;
    bounded(s::close_while_waiting(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_workers_exits_3() {
    let url = url_fn().await;
    bounded(s::too_few_workers(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_exits_5() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    bounded(s::server_down(&format!("redis://127.0.0.1:{port}/down?min_workers=1&connect_timeout=2s"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_restarts_after_a_peer_is_killed() {
    let url = url_fn().await;
    bounded(s::run_end_to_end(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_failure_is_seen_by_the_others() {
    let url = url_fn().await;
    bounded(s::run_failure_is_seen(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_admits_a_waiting_worker() {
    let url = url_fn().await;
    bounded(s::run_admits_a_waiter(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_rounds() {
    let url = url_fn().await;
    bounded(s::bench(&url)).await;
}
