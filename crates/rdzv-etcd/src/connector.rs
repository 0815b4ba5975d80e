//! The TCP connections to etcd members: opened as tonic opens them, and on a path whose
//! segments are as large as loopback's, given a receive buffer that holds many of them.
//!
//! Why: on loopback a TCP segment is 32-64 KiB, and Linux starts a connection with a
//! receive buffer of 128 KiB (`net.ipv4.tcp_rmem`), so the window it offers is a segment or
//! two. When a large answer (the 1,024 join keys a round's freezer reads, about 200 KiB)
//! arrives faster than the client reads it, the window it then offers falls below one
//! segment; the reader frees space without announcing it (Linux announces a window only
//! once it has at least doubled), and etcd's side, which sends no less than a segment into
//! such a window, waits for a timer: 200 ms. That stalled one round of 1,024 in-process
//! workers in four. Across a network the segments are 1.4 or 9 KiB and the same buffer
//! holds tens of them, so the buffer (and Linux's tuning of it) is left alone there.

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use rdzv_core::BoxError;
use tokio::net::TcpStream;
use tonic::transport::Uri;

/// A connection whose receive buffer holds fewer segments than this gets a larger one.
const FEWEST_SEGMENTS: usize = 8;
/// The receive buffer asked for then, in segments (Linux doubles what it is asked for, up
/// to `net.core.rmem_max`, for its own bookkeeping).
const SEGMENTS_BUFFERED: usize = 16;

/// Opens TCP connections as tonic's own connector does (no Nagle delay, TCP keep-alive
/// every `keep_alive`), then [`widen_receive_buffer`].
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    http: HttpConnector,
}

impl Connector {
    /// Connections with TCP keep-alive probes every `keep_alive`.
    pub(crate) fn new(keep_alive: Duration) -> Connector {
        let mut http = HttpConnector::new();
        // The scheme is tonic's to check (`https` is TLS over this connection).
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_keepalive(Some(keep_alive));
        Connector { http }
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<TokioIo<TcpStream>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        async move {
            let stream = connecting.await?;
            widen_receive_buffer(stream.inner());
            Ok(stream)
        }
        .boxed()
    }
}

/// Gives `stream` a receive buffer of [`SEGMENTS_BUFFERED`] segments where its buffer holds
/// fewer than [`FEWEST_SEGMENTS`]. Best effort: a connection works without it.
fn widen_receive_buffer(stream: &TcpStream) {
    let socket = socket2::SockRef::from(stream);
    let (Ok(segment), Ok(buffer)) = (socket.tcp_mss(), socket.recv_buffer_size()) else {
        return;
    };
    let segment = segment as usize;
    if buffer >= segment.saturating_mul(FEWEST_SEGMENTS) {
        return;
    }
    if let Err(error) = socket.set_recv_buffer_size(segment.saturating_mul(SEGMENTS_BUFFERED)) {
        tracing::debug!(%error, segment, buffer, "could not widen the receive buffer");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tower_service::Service;

    use super::*;

    /// The receive buffer of a connection made by [`Connector`] to a listener whose
    /// segments are at most `segment` bytes (`None`: the path's own).
    async fn receive_buffer_towards(segment: Option<u32>) -> (usize, usize) {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if let Some(segment) = segment {
            socket.set_tcp_mss(segment).unwrap();
        }
        socket.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        socket.listen(1).unwrap();
        let port = socket.local_addr().unwrap().as_socket().unwrap().port();
        let uri: Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let stream = Connector::new(Duration::from_secs(10)).call(uri).await.unwrap();
        let client = socket2::SockRef::from(stream.inner());
        (client.tcp_mss().unwrap() as usize, client.recv_buffer_size().unwrap())
    }

    #[tokio::test]
    async fn a_loopback_connection_buffers_many_segments() {
        let (segment, buffer) = receive_buffer_towards(None).await;
        assert!(segment > 16 * 1024, "a loopback segment of {segment} bytes: not the path this tests");
        assert!(
            buffer >= FEWEST_SEGMENTS * segment,
            "a receive buffer of {buffer} bytes holds fewer than {FEWEST_SEGMENTS} segments of {segment}"
        );
    }

    #[tokio::test]
    async fn a_connection_of_network_sized_segments_keeps_its_buffer() {
        let untouched = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .unwrap()
            .recv_buffer_size()
            .unwrap();
        let (segment, buffer) = receive_buffer_towards(Some(1_400)).await;
        assert!(segment <= 1_400, "the listener's segment size was not applied: {segment}");
        assert_eq!(buffer, untouched, "the receive buffer of a {segment}-byte path was changed");
    }
}
