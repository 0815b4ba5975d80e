//! `rdzv run --metrics-addr`: serves the agent's [`Metrics`] at `/metrics` over HTTP/1, for
//! Prometheus to scrape.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rdzv_core::metrics::{self, Metrics};
use tokio::net::TcpListener;

use crate::exit::{CONFIG, CliError};

/// How long a client may take to send its request's headers: a scraper that connects and
/// says nothing must not hold a connection for ever.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Listens on `addr` (`HOST:PORT`; port 0 picks a free one) and serves `metrics` there in the
/// background, for as long as the runtime runs. Returns the address bound.
pub async fn serve(addr: &str, metrics: Metrics) -> Result<SocketAddr, CliError> {
    let refused = |e: std::io::Error| CliError {
        code: CONFIG,
        message: format!("cannot serve metrics on {addr} (--metrics-addr): {e}; give a free HOST:PORT"),
    };
    let listener = TcpListener::bind(addr).await.map_err(refused)?;
    let bound = listener.local_addr().map_err(refused)?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!("accepting a metrics connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| answer(request, metrics.clone()));
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(e) = served {
                    tracing::debug!("serving a metrics connection: {e}");
                }
            });
        }
    });
    Ok(bound)
}

/// `GET /metrics` (and `HEAD`): the metrics now; anything else: 404 or 405.
async fn answer(request: Request<Incoming>, metrics: Metrics) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    if request.uri().path() != "/metrics" {
        return Ok(response(StatusCode::NOT_FOUND, "rdzv serves /metrics only\n".into()));
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(response(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n".into()));
    }
    let mut ok = response(StatusCode::OK, metrics.encode());
    ok.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(metrics::CONTENT_TYPE));
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connects");
        stream.write_all(request.as_bytes()).await.expect("sends");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("reads");
        answer
    }

    #[tokio::test]
    async fn serves_the_metrics_and_nothing_else() {
        let addr = serve("127.0.0.1:0", Metrics::new()).await.expect("binds");
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("content-type: text/plain; version=0.0.4"), "{ok}");
        assert!(ok.contains("# TYPE rdzv_rounds_formed_total counter"), "{ok}");
        let other = get(addr, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        let post =
            get(addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    }

    #[tokio::test]
    async fn a_taken_address_is_a_configuration_error() {
        let taken = serve("127.0.0.1:0", Metrics::new()).await.expect("binds");
        let e = serve(&taken.to_string(), Metrics::new()).await.expect_err("taken");
        assert_eq!(e.code, CONFIG);
        assert!(e.message.contains("--metrics-addr"), "{e:?}");
    }
}
