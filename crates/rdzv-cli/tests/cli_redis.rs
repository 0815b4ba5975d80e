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
