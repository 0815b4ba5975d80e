//! The registry of backends by URL scheme: the built-ins are registered by the `rdzv`
//! facade; users add their own.

use std::any::TypeId;
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;

use crate::error::{ConfigError, RendezvousError};
use crate::kv::Kv;
use crate::params::{OPTION_NAMES, RendezvousParams};
use crate::url::{RendezvousUrl, URL_OPTIONS, scheme_of};

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

    /// The concrete type of the factory, so that registering the same kind of factory
    /// twice under one scheme is recognised as a repeat, not a conflict. Not meant to be
    /// overridden.
    fn factory_type(&self) -> TypeId {
        TypeId::of::<Self>()
    }
}

/// Schemes mapped to backend factories, plus schemes whose backend was compiled out (mapped
/// to the cargo feature that enables it). Cloning is cheap and shares the registry: a
/// scheme registered through one clone is seen by all.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<RwLock<Inner>>,
}

#[derive(Default)]
struct Inner {
    factories: BTreeMap<String, Arc<dyn BackendFactory>>,
    disabled: BTreeMap<String, String>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Registry")
            .field("schemes", &inner.factories.keys().collect::<Vec<_>>())
            .field("disabled", &inner.disabled)
            .finish()
    }
}

impl Registry {
    /// An empty registry (the `rdzv` facade offers one with the built-ins registered).
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `scheme` (case-insensitive) with `factory`. Registering the same factory
    /// again (the same `Arc`, or a factory of the same type) is a no-op; a different one
    /// under a taken scheme is [`ConfigError::SchemeTaken`]; a scheme that is not a valid
    /// URL scheme is [`ConfigError::InvalidValue`]. A scheme marked disabled becomes enabled.
    pub fn register(&self, scheme: &str, factory: Arc<dyn BackendFactory>) -> Result<(), ConfigError> {
        let scheme = checked_scheme(scheme)?;
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = inner.factories.get(&scheme) {
            let same_pointer = std::ptr::addr_eq(Arc::as_ptr(existing), Arc::as_ptr(&factory));
            if same_pointer || existing.factory_type() == factory.factory_type() {
                return Ok(());
            }
            return Err(ConfigError::SchemeTaken(scheme));
        }
        inner.disabled.remove(&scheme);
        inner.factories.insert(scheme, factory);
        Ok(())
    }

    /// Marks `scheme` as a backend that exists but was compiled out, so that using it says
    /// to enable the cargo `feature` ([`ConfigError::BackendDisabled`]). Does nothing if a
    /// factory already serves the scheme.
    pub fn register_disabled(&self, scheme: &str, feature: &str) -> Result<(), ConfigError> {
        let scheme = checked_scheme(scheme)?;
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        if !inner.factories.contains_key(&scheme) {
            inner.disabled.insert(scheme, feature.to_string());
        }
        Ok(())
    }

    /// The schemes that have a factory, in order.
    pub fn schemes(&self) -> Vec<String> {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        inner.factories.keys().cloned().collect()
    }

    /// The factory serving `scheme` (case-insensitive): [`ConfigError::BackendDisabled`] if
    /// it was compiled out, [`ConfigError::UnknownScheme`] (listing the known schemes) if
    /// nothing serves it.
    pub fn factory(&self, scheme: &str) -> Result<Arc<dyn BackendFactory>, ConfigError> {
        let scheme = scheme.to_ascii_lowercase();
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(factory) = inner.factories.get(&scheme) {
            return Ok(Arc::clone(factory));
        }
        if let Some(feature) = inner.disabled.get(&scheme) {
            return Err(ConfigError::BackendDisabled { scheme, feature: feature.clone() });
        }
        let mut known: Vec<String> = inner.factories.keys().cloned().collect();
        known.extend(
            inner.disabled.iter().map(|(s, feature)| format!("{s} (needs the cargo feature `{feature}`)")),
        );
        Err(ConfigError::UnknownScheme {
            scheme,
            known: if known.is_empty() { "none are registered".to_string() } else { known.join(", ") },
        })
    }

    /// Parses `url` for the backend its scheme names: the backend's default port applies,
    /// every option must be a rendezvous parameter or one of the backend's
    /// ([`ConfigError::UnknownOption`] lists the known ones), and the rendezvous parameters
    /// must be valid. Returns the URL and its parameters.
    pub fn parse(&self, url: &str) -> Result<(RendezvousUrl, RendezvousParams), RendezvousError> {
        let (url, params, _) = self.resolve(url)?;
        Ok((url, params))
    }

    /// Parses `url` as [`Registry::parse`] does, then connects its backend.
    pub async fn connect(&self, url: &str) -> Result<(Arc<dyn Kv>, RendezvousParams), RendezvousError> {
        let (url, params, factory) = self.resolve(url)?;
        let kv = factory.connect(&url).await?;
        Ok((kv, params))
    }

    /// Parses `url` and connects its backend without requiring the rendezvous parameters
    /// (for tools that only inspect a run, like `rdzv status`, and for a Store on its own).
    /// Options are still checked; the URL is returned for its run id and options.
    pub async fn connect_backend(&self, url: &str) -> Result<(Arc<dyn Kv>, RendezvousUrl), RendezvousError> {
        let (url, factory) = self.resolve_backend(url)?;
        let kv = factory.connect(&url).await?;
        Ok((kv, url))
    }

    fn resolve(
        &self,
        input: &str,
    ) -> Result<(RendezvousUrl, RendezvousParams, Arc<dyn BackendFactory>), ConfigError> {
        let (url, factory) = self.resolve_backend(input)?;
        let params = url.params()?;
        Ok((url, params, factory))
    }

    fn resolve_backend(&self, input: &str) -> Result<(RendezvousUrl, Arc<dyn BackendFactory>), ConfigError> {
        let scheme = scheme_of(input)?;
        let factory = self.factory(&scheme)?;
        let url = RendezvousUrl::parse_with_default_port(input, factory.default_port())?;
        // `protocol=https` may have turned `etcd` into `etcds`: that scheme's backend serves.
        let factory = if url.scheme == scheme { factory } else { self.factory(&url.scheme)? };
        let backend_options = factory.options();
        if let Some(unknown) = url.options.keys().find(|name| !backend_options.contains(&name.as_str())) {
            let known: Vec<&str> =
                OPTION_NAMES.iter().chain(URL_OPTIONS).chain(backend_options).copied().collect();
            return Err(ConfigError::UnknownOption { option: unknown.clone(), known: known.join(", ") });
        }
        Ok((url, factory))
    }
}

/// A scheme as registered: lower-case, starting with a letter, of letters, digits, `+`,
/// `-`, `.`.
fn checked_scheme(scheme: &str) -> Result<String, ConfigError> {
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if valid {
        Ok(scheme.to_ascii_lowercase())
    } else {
        Err(ConfigError::InvalidValue {
            option: "scheme".into(),
            value: scheme.to_string(),
            reason: "a scheme starts with a letter and has only letters, digits, `+`, `-`, `.`".into(),
        })
    }
}
