//! [`Link`]: the proxies one node reaches its servers through, frozen and healed together.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::proxy::{Control, serve};

/// One node's way to its servers: a loopback proxy per server endpoint, on a runtime of its
/// own. Point the node at [`Link::endpoints`] instead of the servers. Dropping the link
/// closes its listeners and connections.
pub struct Link {
    endpoints: Vec<SocketAddr>,
    frozen: watch::Sender<bool>,
    cut: Arc<Mutex<CancellationToken>>,
    open: Arc<AtomicUsize>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Link {
    /// Starts one proxy per target, each on a free port of 127.0.0.1, in the targets'
    /// order. Needs no runtime of the caller's (it may be called from one, too).
    pub fn start(targets: impl IntoIterator<Item = SocketAddr>) -> io::Result<Link> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rdzv-netfault")
            .enable_io()
            .enable_time()
            .build()?;
        let (frozen, gate) = watch::channel(false);
        let cut = Arc::new(Mutex::new(CancellationToken::new()));
        let open = Arc::new(AtomicUsize::new(0));
        let control = Control { frozen: gate, cut: cut.clone(), open: open.clone() };
        let mut endpoints = Vec::new();
        for target in targets {
            let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
            listener.set_nonblocking(true)?;
            endpoints.push(listener.local_addr()?);
            let listener = {
                let _entered = runtime.enter();
                tokio::net::TcpListener::from_std(listener)?
            };
            runtime.spawn(serve(listener, target, control.clone()));
        }
        Ok(Link { endpoints, frozen, cut, open, runtime: Some(runtime) })
    }

    /// The proxies' addresses, one per target, in the targets' order.
    pub fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    /// The proxies' addresses as `host:port,host:port,…`, for a URL's authority.
    pub fn endpoint_list(&self) -> String {
        self.endpoints.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",")
    }

    /// Cuts the node off: from now on no byte flows either way and no connection is
    /// accepted; nothing is closed or reset. Idempotent.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Ends a [`freeze`](Link::freeze): held bytes flow on, waiting connections are
    /// accepted. Idempotent.
    pub fn heal(&self) {
        self.frozen.send_replace(false);
    }

    /// Whether the link is frozen.
    pub fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Resets every connection open now (both sides see a TCP reset); later connections go
    /// through as usual. Returns how many were open.
    pub fn cut(&self) -> usize {
        let n = self.open.load(Ordering::SeqCst);
        let mut cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *cut).cancel();
        n
    }

    /// How many connections are open through the link.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Also safe inside an async context, where dropping a runtime would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("endpoints", &self.endpoints)
            .field("frozen", &self.is_frozen())
            .field("open", &self.open_connections())
            .finish()
    }
}
