//! One proxy: a loopback listener whose connections are copied to one target, gated by the
//! link's frozen flag.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Bytes copied per read: the proxy adds no buffering a real path would not have.
const CHUNK: usize = 16 * 1024;

/// What the proxies of one link share: the frozen flag, the token that resets the
/// connections open now (replaced by a fresh one at each cut), and how many are open.
#[derive(Clone)]
pub(crate) struct Control {
    pub(crate) frozen: watch::Receiver<bool>,
    pub(crate) cut: Arc<Mutex<CancellationToken>>,
    pub(crate) open: Arc<AtomicUsize>,
}

impl Control {
    fn current_cut(&self) -> CancellationToken {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Accepts connections on `listener` while the link is not frozen, and copies each to
/// `target`.
pub(crate) async fn serve(listener: TcpListener, target: SocketAddr, control: Control) {
    let mut gate = control.frozen.clone();
    loop {
        // While frozen, connections wait in the kernel's backlog: accepted there, unanswered.
        if gate.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let accepted = tokio::select! {
            // A freeze that came with a connection is seen first.
            biased;
            _ = gate.wait_for(|frozen| *frozen) => continue,
            accepted = listener.accept() => accepted,
        };
        let Ok((inbound, _)) = accepted else { continue };
        // Counted from the accept, before the connect to the target: once the target has
        // accepted its side, `cut` counts this connection.
        control.open.fetch_add(1, Ordering::SeqCst);
        let control = control.clone();
        // Connecting to the target happens in the connection's own task, so that a slow
        // target does not hold up other accepts.
        tokio::spawn(async move {
            let cut = control.current_cut();
            // Frozen since the accept: the target sees nothing until the link heals.
            let mut gate = control.frozen.clone();
            if gate.wait_for(|frozen| !frozen).await.is_err() {
                control.open.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            let Ok(outbound) = TcpStream::connect(target).await else {
                control.open.fetch_sub(1, Ordering::SeqCst);
                return;
            };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            let (from_client, to_client) = inbound.into_split();
            let (from_server, to_server) = outbound.into_split();
            // Each direction ends on its own: a half-close is passed on as a half-close.
            tokio::join!(
                pump(from_client, to_server, control.frozen.clone(), cut.clone()),
                pump(from_server, to_client, control.frozen.clone(), cut),
            );
            control.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Copies `from` to `to` while the link is not frozen. Frozen, it neither reads nor writes:
/// the sender's bytes pile up in the kernel's buffers (then its writes block), as on a path
/// that drops every packet. On `cut`, both sockets are closed with a reset.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
    cut: CancellationToken,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            open = gate.wait_for(|frozen| !frozen) => if open.is_err() { return },
            _ = cut.cancelled() => return reset(from, to),
        }
        let read = tokio::select! {
            read = from.read(&mut buf) => read,
            _ = gate.wait_for(|frozen| *frozen) => continue,
            _ = cut.cancelled() => return reset(from, to),
        };
        let n = match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        let mut sent = 0;
        while sent < n {
            tokio::select! {
                open = gate.wait_for(|frozen| !frozen) => if open.is_err() { return },
                _ = cut.cancelled() => return reset(from, to),
            }
            // A write not complete when the link freezes is abandoned (tokio's writes are
            // cancel-safe: nothing of it was sent) and made again after the heal.
            let written = tokio::select! {
                written = to.write(&buf[sent..n]) => written,
                _ = gate.wait_for(|frozen| *frozen) => continue,
                _ = cut.cancelled() => return reset(from, to),
            };
            match written {
                Ok(0) | Err(_) => return,
                Ok(w) => sent += w,
            }
        }
    }
}

/// Closes both sockets with a reset: SO_LINGER 0 makes the close send RST, and the write
/// half is forgotten rather than dropped, since dropping it would send a FIN first.
fn reset(from: OwnedReadHalf, to: OwnedWriteHalf) {
    let _ = from.as_ref().set_zero_linger();
    let _ = to.as_ref().set_zero_linger();
    to.forget();
}
