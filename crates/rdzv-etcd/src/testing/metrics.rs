//! Reading etcd's Prometheus `/metrics` with a minimal HTTP/1.0 GET (no HTTP client needed).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::HarnessError;

/// etcd's count of committed Raft proposals: every write (put, delete, txn, lease grant or
/// revoke, compaction) is one.
pub const PROPOSALS_COMMITTED: &str = "etcd_server_proposals_committed_total";

/// Fetches `http://addr/metrics` (blocking; run it off the async threads).
pub(crate) fn fetch(addr: SocketAddr) -> Result<String, HarnessError> {
    let fail = |what: &str, e: std::io::Error| {
        HarnessError::new(format!("cannot {what} http://{addr}/metrics: {e}"))
    };
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| fail("connect to", e))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| fail("configure the connection to", e))?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| fail("send a request to", e))?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).map_err(|e| fail("read", e))?;
    let response = String::from_utf8_lossy(&response);
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return Err(HarnessError::new(format!("http://{addr}/metrics sent no complete HTTP response")));
    };
    let status = head.split_whitespace().nth(1);
    if !head.starts_with("HTTP/1.") || status != Some("200") {
        return Err(HarnessError::new(format!(
            "http://{addr}/metrics answered `{}`",
            head.lines().next().unwrap_or_default()
        )));
    }
    Ok(body.to_string())
}

/// The value of an unlabelled metric in Prometheus text format, if present.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_unlabelled_values() {
        let text = "# HELP x\n# TYPE etcd_server_proposals_committed_total gauge\n\
                    etcd_server_proposals_committed_total 42\n\
                    etcd_server_proposals_committed_total_other 1\n";
        assert_eq!(metric_value(text, PROPOSALS_COMMITTED), Some(42.0));
        assert_eq!(metric_value(text, "missing"), None);
    }
}
