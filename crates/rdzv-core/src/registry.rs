//! The registry of backends by URL scheme: the built-ins are registered by the `rdzv`
//! facade; users add their own.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::RendezvousError;
use crate::kv::Kv;
use crate::url::RendezvousUrl;

/// Builds a backend from a parsed URL.
#[async_trait]
pub trait BackendFactory: Send + Sync + 'static {
    /// The query options this backend understands (besides the rendezvous parameters);
    /// any other option is rejected before [`BackendFactory::connect`] is called.
    fn options(&self) -> &'static [&'static str];

    /// Default port when the URL names none (`None`: the URL must name one, or the scheme
    /// has no ports, like `mem`).
    fn default_port(&self) -> Option<u16>;

    /// Connects (or attaches to a shared client) and returns the backend. Errors:
    /// [`RendezvousError::Config`] for bad options, [`RendezvousError::Unavailable`] when the
    /// server cannot be reached.
    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError>;
}
