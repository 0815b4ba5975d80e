//! The registry of backends by URL scheme: the built-ins are registered by the `rdzv`
//! facade; users add their own.

use std::any::TypeId;
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;

use crate::error::{ConfigError, RendezvousError};
use crate::kv::Kv;
use crate::params::{RendezvousParams, option_names};
use crate::url::{RendezvousUrl, RunAddress, URL_OPTIONS, scheme_of};

/// Builds a backend from a parsed URL, and says what the URL's generic parts mean for this
/// backend (its default port, its own rules), which the URL parser does not know.
#[async_trait]
pub trait BackendFactory: Send + Sync + 'static {
    /// The query options this backend understands (besides the rendezvous parameters);
    /// any other option is rejected before [`BackendFactory::connect`] is called.
    fn options(&self) -> &'static [&'static str];

    /// Default port when the URL names none (`None`: the URL must name one, or the scheme
    /// has no ports, like `mem`).
    fn default_port(&self) -> Option<u16>;

    /// Applies this backend's own rules to a URL its scheme names, once the URL parser has
    /// read its generic structure and before the options are checked against
    /// [`BackendFactory::options`]. It may consume options that are about the URL rather
    /// than the connection, change the scheme (etcd's `protocol=https` turns `etcd` into
    /// `etcds`; the registry then hands the URL to the factory of the new scheme, without
    /// interpreting it again) or refuse the URL with a [`ConfigError`] naming what to write
    /// instead (Redis refuses database-like run ids). The default accepts every URL as it is.
    fn interpret(&self, url: &mut RendezvousUrl) -> Result<(), ConfigError> {
        let _ = url;
        Ok(())
    }

    /// Whether this backend's servers take a password without a user name (Redis's
    /// `AUTH <password>`), so that `RDZV_PASSWORD` gives the password of a URL that names no
    /// user (see [`PASSWORD_ENV`](crate::url::PASSWORD_ENV)). Default: `false` (the variable applies only to URLs with a
    /// user).
    fn accepts_password_alone(&self) -> bool {
        false
    }

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

    /// Parses `url` for the backend its scheme names: the backend's default port and rules
    /// ([`BackendFactory::interpret`]) apply, every option must be a rendezvous parameter or
    /// one of the backend's ([`ConfigError::UnknownOption`] lists the known ones), and the
    /// rendezvous parameters must be valid. Returns the URL and its parameters.
    pub fn parse(&self, url: &str) -> Result<(RendezvousUrl, RendezvousParams), RendezvousError> {
        let (url, params, _) = self.resolve(url)?;
        Ok((url, params))
    }

    /// Parses `url` for the backend its scheme names, as [`Registry::parse`] does, without
    /// requiring the rendezvous parameters (`min_workers` and the like): the run's address,
    /// for opening a Store or inspecting or closing a run.
    ///
    /// ```
    /// use std::sync::Arc;
    /// # use rdzv_core::{BackendFactory, Kv, RendezvousError, RendezvousUrl};
    /// # struct Db;
    /// # #[async_trait::async_trait]
    /// # impl BackendFactory for Db {
    /// #     fn options(&self) -> &'static [&'static str] { &[] }
    /// #     fn default_port(&self) -> Option<u16> { Some(7000) }
    /// #     async fn connect(&self, _: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> { unimplemented!() }
    /// # }
    /// let registry = rdzv_core::Registry::new();
    /// registry.register("db", Arc::new(Db))?;
    /// let address = registry.parse_address("db://h/job7?prefix=/jobs")?;
    /// assert_eq!(address.url.endpoints[0].port, 7000);
    /// assert_eq!((address.prefix.as_str(), address.run_id.as_str()), ("/jobs", "job7"));
    /// assert_eq!(address.params_or(2, 4)?.max_workers, 4);
    /// # Ok::<(), RendezvousError>(())
    /// ```
    pub fn parse_address(&self, url: &str) -> Result<RunAddress, RendezvousError> {
        let (url, _) = self.resolve_backend(url)?;
        Ok(RunAddress::new(url))
    }

    /// Parses `url` as [`Registry::parse`] does, then connects its backend.
    pub async fn connect(&self, url: &str) -> Result<(Arc<dyn Kv>, RendezvousParams), RendezvousError> {
        let (url, params, factory) = self.resolve(url)?;
        let kv = factory.connect(&url).await?;
        Ok((kv, params))
    }

    /// Parses `url` as [`Registry::parse_address`] does (no rendezvous parameters needed)
    /// and connects its backend: for tools that only inspect or close a run, like
    /// `rdzv status`, and for a Store on its own.
    pub async fn connect_backend(&self, url: &str) -> Result<(Arc<dyn Kv>, RunAddress), RendezvousError> {
        let (url, factory) = self.resolve_backend(url)?;
        let kv = factory.connect(&url).await?;
        Ok((kv, RunAddress::new(url)))
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
        let mut url = RendezvousUrl::parse_with_default_port(input, factory.default_port())?;
        factory.interpret(&mut url)?;
        // The factory may have changed the scheme (etcd's `protocol=https`): that scheme's
        // backend serves.
        let factory = if url.scheme == scheme { factory } else { self.factory(&url.scheme)? };
        url.take_password_from_process_env(factory.accepts_password_alone());
        let backend_options = factory.options();
        if let Some(unknown) = url.options.keys().find(|name| !backend_options.contains(&name.as_str())) {
            let known: Vec<&str> = option_names()
                .chain(URL_OPTIONS.iter().copied())
                .chain(backend_options.iter().copied())
                .collect();
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
