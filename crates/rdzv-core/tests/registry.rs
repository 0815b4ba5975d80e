//! The backend registry: registration rules, scheme lookup, option validation against the
//! factory, the factory's default port and URL rules, run addresses, and connecting.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rdzv_core::kv::{
    DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, LeaseId, PutOptions, PutOutcome,
    RangeOptions, RangeResponse, Revision, WatchScope, WatchStream,
};
use rdzv_core::{
    BackendFactory, ConfigError, Kv, KvError, KvResult, Registry, RendezvousError, RendezvousUrl,
};

/// A backend that only answers to its name: enough to see that `connect` hands it over.
#[derive(Debug)]
struct NullKv;

fn unsupported<T>() -> KvResult<T> {
    Err(KvError::Unsupported { backend: "null", what: "anything" })
}

#[async_trait]
impl Kv for NullKv {
    fn name(&self) -> &'static str {
        "null"
    }
    async fn get(&self, _: &[u8]) -> KvResult<GetResponse> {
        unsupported()
    }
    async fn range(&self, _: &[u8], _: RangeOptions) -> KvResult<RangeResponse> {
        unsupported()
    }
    async fn put(&self, _: &[u8], _: &[u8], _: PutOptions) -> KvResult<PutOutcome> {
        unsupported()
    }
    async fn delete(&self, _: &[u8], _: DeleteMode) -> KvResult<DeleteOutcome> {
        unsupported()
    }
    async fn delete_prefix(&self, _: &[u8]) -> KvResult<DeletePrefixResponse> {
        unsupported()
    }
    async fn lease_grant(&self, _: Duration) -> KvResult<LeaseId> {
        unsupported()
    }
    async fn lease_keep_alive(&self, _: LeaseId) -> KvResult<Duration> {
        unsupported()
    }
    async fn lease_revoke(&self, _: LeaseId) -> KvResult<()> {
        unsupported()
    }
    async fn watch(&self, _: &[u8], _: WatchScope, _: Revision) -> KvResult<WatchStream> {
        unsupported()
    }
}

/// A test factory: understands `db`, defaults to port 1234, counts its connects and
/// remembers the last URL it was given.
#[derive(Default)]
struct TestFactory {
    connects: AtomicUsize,
    last_url: std::sync::Mutex<Option<RendezvousUrl>>,
}

#[async_trait]
impl BackendFactory for TestFactory {
    fn options(&self) -> &'static [&'static str] {
        &["db"]
    }
    fn default_port(&self) -> Option<u16> {
        Some(1234)
    }
    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        *self.last_url.lock().expect("not poisoned") = Some(url.clone());
        Ok(Arc::new(NullKv))
    }
}

/// Another factory type, with no options and no default port; its connect fails as an
/// unreachable server would.
struct OtherFactory;

#[async_trait]
impl BackendFactory for OtherFactory {
    fn options(&self) -> &'static [&'static str] {
        &[]
    }
    fn default_port(&self) -> Option<u16> {
        None
    }
    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        Err(KvError::Unavailable {
            backend: "other",
            endpoint: url.endpoints.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
            message: "connection refused".into(),
            source: None,
        }
        .into())
    }
}

fn config_err<T: std::fmt::Debug>(r: Result<T, RendezvousError>) -> ConfigError {
    match r {
        Err(RendezvousError::Config(e)) => e,
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn registry_is_send_sync_and_cheap_to_share() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Registry>();
    let registry = Registry::new();
    let clone = registry.clone();
    clone.register("test", Arc::new(TestFactory::default())).expect("free scheme");
    assert_eq!(registry.schemes(), ["test"], "clones share the registry");
}

#[test]
fn registering_again_is_a_no_op_and_a_different_factory_is_an_error() {
    let registry = Registry::new();
    let factory: Arc<dyn BackendFactory> = Arc::new(TestFactory::default());
    registry.register("test", Arc::clone(&factory)).expect("free scheme");
    registry.register("test", Arc::clone(&factory)).expect("the same Arc again");
    registry.register("TEST", Arc::new(TestFactory::default())).expect("the same type again");
    assert_eq!(
        registry.register("test", Arc::new(OtherFactory)),
        Err(ConfigError::SchemeTaken("test".into()))
    );
    registry.register("other", Arc::new(OtherFactory)).expect("free scheme");
    assert_eq!(registry.schemes(), ["other", "test"]);
}

#[test]
fn invalid_schemes_are_refused_at_registration() {
    let registry = Registry::new();
    for scheme in ["", "1x", "a b", "a:b", "é"] {
        assert!(
            matches!(
                registry.register(scheme, Arc::new(OtherFactory)),
                Err(ConfigError::InvalidValue { ref option, .. }) if option == "scheme"
            ),
            "{scheme:?}"
        );
    }
}

#[test]
fn unknown_scheme_lists_known_ones() {
    let registry = Registry::new();
    let err = config_err(registry.parse("nope://h/r?min_workers=1"));
    assert_eq!(
        err,
        ConfigError::UnknownScheme { scheme: "nope".into(), known: "none are registered".into() }
    );
    registry.register("test", Arc::new(TestFactory::default())).expect("free scheme");
    registry.register("other", Arc::new(OtherFactory)).expect("free scheme");
    registry.register_disabled("redis", "redis").expect("valid scheme");
    let err = config_err(registry.parse("nope://h/r?min_workers=1"));
    assert_eq!(
        err,
        ConfigError::UnknownScheme {
            scheme: "nope".into(),
            known: "other, test, redis (needs the cargo feature `redis`)".into()
        }
    );
    assert!(err.to_string().contains("known schemes: other, test"), "{err}");
}

#[test]
fn disabled_scheme_names_its_feature() {
    let registry = Registry::new();
    registry.register_disabled("etcd", "etcd").expect("valid scheme");
    let err = config_err(registry.parse("etcd://h/r?min_workers=1"));
    assert_eq!(err, ConfigError::BackendDisabled { scheme: "etcd".into(), feature: "etcd".into() });
    assert!(err.to_string().contains("cargo feature `etcd`"), "{err}");
    // Registering the backend after all enables it; marking it disabled then changes nothing.
    registry.register("etcd", Arc::new(TestFactory::default())).expect("free scheme");
    registry.register_disabled("etcd", "etcd").expect("valid scheme");
    registry.parse("etcd://h/r?min_workers=1").expect("enabled");
}

#[test]
fn parse_applies_the_factory_default_port_and_parameters() {
    let registry = Registry::new();
    registry.register("test", Arc::new(TestFactory::default())).expect("free scheme");
    registry.register("other", Arc::new(OtherFactory)).expect("free scheme");
    let (url, params) = registry.parse("test://h/job?min_nodes=2&max_nodes=3&db=7").expect("valid");
    assert_eq!(url.endpoints[0].port, 1234);
    assert_eq!(url.options["db"], "7");
    assert_eq!((params.run_id.as_str(), params.min_workers, params.max_workers), ("job", 2, 3));
    let (url, _) = registry.parse("other://h/job?min_workers=1").expect("valid");
    assert_eq!(url.endpoints[0].port, 0);
}

#[test]
fn unknown_option_names_it_and_lists_the_known_ones() {
    let registry = Registry::new();
    registry.register("test", Arc::new(TestFactory::default())).expect("free scheme");
    let err = config_err(registry.parse("test://h/r?min_workers=1&colour=blue"));
    match &err {
        ConfigError::UnknownOption { option, known } => {
            assert_eq!(option, "colour");
            for name in ["min_workers", "max_workers", "timeout", "prefix", "endpoints", "db"] {
                assert!(known.contains(name), "{name} missing from {known}");
            }
        }
        other => panic!("expected UnknownOption, got {other:?}"),
    }
    // An option one backend knows is unknown to another.
    registry.register("other", Arc::new(OtherFactory)).expect("free scheme");
    let err = config_err(registry.parse("other://h/r?min_workers=1&db=1"));
    assert!(matches!(err, ConfigError::UnknownOption { ref option, .. } if option == "db"), "{err:?}");
}

#[test]
fn parameter_and_url_errors_come_through() {
    let registry = Registry::new();
    registry.register("test", Arc::new(TestFactory::default())).expect("free scheme");
    assert_eq!(config_err(registry.parse("test://h/r")), ConfigError::MissingOption("min_workers".into()));
    assert!(matches!(
        config_err(registry.parse("test://h/r?min_workers=2&max_workers=1")),
        ConfigError::InvalidValue { .. }
    ));
    assert!(matches!(
        config_err(registry.parse("test://h:65536/r?min_workers=1")),
        ConfigError::InvalidValue { .. }
    ));
    assert!(matches!(config_err(registry.parse("no scheme")), ConfigError::InvalidUrl(_)));
}

/// A factory with URL rules of its own: `tls=yes` moves the URL to the scheme `<scheme>s`
/// (consuming the option), and a run id `forbidden` is refused.
struct RulesFactory;

#[async_trait]
impl BackendFactory for RulesFactory {
    fn options(&self) -> &'static [&'static str] {
        &["tls"]
    }
    fn default_port(&self) -> Option<u16> {
        Some(99)
    }
    fn interpret(&self, url: &mut RendezvousUrl) -> Result<(), ConfigError> {
        if url.run_id == "forbidden" {
            return Err(ConfigError::InvalidValue {
                option: "run_id".into(),
                value: url.run_id.clone(),
                reason: "this backend refuses it".into(),
            });
        }
        if url.options.remove("tls").is_some() {
            url.scheme.push('s');
        }
        Ok(())
    }
    async fn connect(&self, _: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        Ok(Arc::new(NullKv))
    }
}

#[test]
fn the_factory_interprets_its_urls_and_may_switch_scheme() {
    let registry = Registry::new();
    registry.register("rules", Arc::new(RulesFactory)).expect("free scheme");
    let err = config_err(registry.parse("rules://h/r?min_workers=1&tls=yes"));
    assert!(matches!(err, ConfigError::UnknownScheme { ref scheme, .. } if scheme == "ruless"), "{err:?}");
    // The new scheme's factory serves (its options are checked), with the first one's port.
    registry.register("ruless", Arc::new(TestFactory::default())).expect("free scheme");
    let (url, _) = registry.parse("rules://h/r?min_workers=1&tls=yes&db=1").expect("valid");
    assert_eq!((url.scheme.as_str(), url.endpoints[0].port), ("ruless", 99));
    assert!(!url.options.contains_key("tls"), "consumed: {:?}", url.options);
    let err = config_err(registry.parse("rules://h/r?min_workers=1&db=1"));
    assert!(matches!(err, ConfigError::UnknownOption { ref option, .. } if option == "db"), "{err:?}");
    // Its refusals are the registry's errors, for parameters and addresses alike.
    for err in [
        config_err(registry.parse("rules://h/forbidden?min_workers=1")),
        config_err(registry.parse_address("rules://h/forbidden")),
    ] {
        assert!(matches!(err, ConfigError::InvalidValue { ref option, .. } if option == "run_id"), "{err:?}");
    }
    // The parser alone knows none of this.
    let url = RendezvousUrl::parse("rules://h/forbidden?tls=yes").expect("generic structure");
    assert_eq!((url.scheme.as_str(), url.endpoints[0].port), ("rules", 0));
}

#[test]
fn a_run_address_needs_no_rendezvous_parameters() {
    let registry = Registry::new();
    registry.register("test", Arc::new(TestFactory::default())).expect("free scheme");
    let address = registry.parse_address("test://h/job?db=2&prefix=/p").expect("valid");
    assert_eq!(address.url.endpoints[0].port, 1234);
    assert_eq!(address.url.options["db"], "2");
    assert_eq!((address.prefix.as_str(), address.run_id.as_str()), ("/p", "job"));
    assert_eq!(address.params(), Err(ConfigError::MissingOption("min_workers".into())));
    assert_eq!(address.params_or(2, 3).expect("sized").max_workers, 3);
    // Options are still checked.
    let err = config_err(registry.parse_address("test://h/job?colour=blue"));
    assert!(matches!(err, ConfigError::UnknownOption { ref option, .. } if option == "colour"), "{err:?}");
}

#[tokio::test]
async fn connect_hands_over_the_backend_and_parameters() {
    let registry = Registry::new();
    let factory = Arc::new(TestFactory::default());
    registry.register("test", factory.clone()).expect("free scheme");
    let (kv, params) = tokio::time::timeout(
        Duration::from_secs(10),
        registry.connect("test://u:pw@h1,h2:9/job?min_workers=2&db=1"),
    )
    .await
    .expect("no hang")
    .expect("connects");
    assert_eq!(kv.name(), "null");
    assert_eq!(params.min_workers, 2);
    assert_eq!(factory.connects.load(Ordering::SeqCst), 1);
    let seen = factory.last_url.lock().expect("not poisoned").clone().expect("connect saw a URL");
    assert_eq!(seen.endpoints.len(), 2);
    assert_eq!(seen.password.as_ref().map(|p| p.expose()), Some("pw"));

    // A bad option stops before the factory is asked.
    let err = registry.connect("test://h/job?min_workers=2&colour=1").await.map(|_| ());
    assert!(matches!(err, Err(RendezvousError::Config(ConfigError::UnknownOption { .. }))));
    assert_eq!(factory.connects.load(Ordering::SeqCst), 1);

    // Without rendezvous parameters: the backend and the run's address.
    let (kv, address) = registry.connect_backend("test://h/job2?db=1").await.expect("connects");
    assert_eq!(kv.name(), "null");
    assert_eq!(address.run_id, "job2");
    assert_eq!(factory.connects.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn connect_failures_are_the_factory_errors() {
    let registry = Registry::new();
    registry.register("other", Arc::new(OtherFactory)).expect("free scheme");
    let err = registry.connect("other://u:s3cr3t@h:5/job?min_workers=1").await.map(|_| ());
    match err {
        Err(e @ RendezvousError::Unavailable(_)) => {
            assert!(!e.to_string().contains("s3cr3t"));
            assert!(e.to_string().contains("h:5"), "{e}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn debug_shows_schemes_only() {
    let registry = Registry::new();
    registry.register("test", Arc::new(TestFactory::default())).expect("free scheme");
    registry.register_disabled("redis", "redis").expect("valid scheme");
    let shown = format!("{registry:?}");
    assert!(shown.contains("test") && shown.contains("redis"), "{shown}");
}

/// A password given by `password_file=` reaches the factory as if it were in the URL, and
/// the option itself never reaches it (the factory knows only `db`).
#[tokio::test]
async fn the_factory_sees_a_password_from_a_file() {
    let registry = Registry::new();
    let factory = Arc::new(TestFactory::default());
    registry.register("test", factory.clone()).expect("free scheme");
    let path = std::env::temp_dir().join(format!("rdzv-registry-pw-{}", std::process::id()));
    std::fs::write(&path, "from-file\n").expect("write");
    let url = format!("test://u@h/job?min_workers=1&password_file={}", path.display());
    let connected = registry.connect(&url).await.map(|_| ());
    let _ = std::fs::remove_file(&path);
    connected.expect("connects");
    let seen = factory.last_url.lock().expect("not poisoned").clone().expect("connect saw a URL");
    assert_eq!(seen.password.as_ref().map(|p| p.expose()), Some("from-file"));
    assert!(seen.options.is_empty(), "{:?}", seen.options);
}
