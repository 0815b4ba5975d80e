//! The `rdzv` binary, as several processes, against a real etcd (started by the test).

#![allow(clippy::unwrap_used)]

mod cli_support;

async fn url_fn() -> impl Fn(&str, &str) -> String + Sync {
    let server = match rdzv_etcd::testing::shared().await {
        Ok(server) => server,
        Err(e) => panic!("cannot start etcd: {e}"),
    };
    move |run: &str, query: &str| {
        if query.is_empty() { server.url(run) } else { server.url(&format!("{run}?{query}")) }
    }
}

/// A URL of this scheme where no server listens.
fn nowhere() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("etcd://127.0.0.1:{port}/down?min_workers=1")
}

cli_scenarios!(url_fn, nowhere());
