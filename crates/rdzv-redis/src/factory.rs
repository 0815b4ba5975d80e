//! [`RedisFactory`]: builds a [`RedisKv`] from a `redis://` or `rediss://` URL.

use std::sync::Arc;

use async_trait::async_trait;
use rdzv_core::{BackendFactory, ConfigError, Kv, RendezvousError, RendezvousUrl};

use crate::config::{DEFAULT_PORT, OPTIONS, RedisConfig};
use crate::kv::RedisKv;

/// The backend factory for the `redis` and `rediss` schemes (registered by the `rdzv`
/// facade). Options: `db`, `cacert`, `cert`, `key`, `connect_timeout`, `request_timeout`, `namespace`,
/// `history`, `history_bytes` (see [`RedisConfig`]); default port 6379.
///
/// The run id is the URL's path, so a path of **one or two digits** (`/0`, `/15`) is refused
/// unless the URL also gives the database with `db=`: every other Redis tool reads that path
/// as the database number, so two jobs sharing `REDIS_URL=redis://host:6379/0` would silently
/// join the same run `0`. Write `redis://host:6379/<run_id>?db=0`; a numeric run id such as a
/// Slurm job id (`redis://host/12345678`) needs nothing more, a one- or two-digit one is
/// accepted with an explicit database (`redis://host/42?db=0`). A password without a user
/// name (`redis://:secret@host/…`, or `RDZV_PASSWORD`) logs in as the default user.
#[derive(Clone, Copy, Debug, Default)]
pub struct RedisFactory;

#[async_trait]
impl BackendFactory for RedisFactory {
    fn options(&self) -> &'static [&'static str] {
        OPTIONS
    }

    fn default_port(&self) -> Option<u16> {
        Some(DEFAULT_PORT)
    }

    /// Refuses a run id that reads as a database number unless `db=` is given (see
    /// [`RedisFactory`]).
    fn interpret(&self, url: &mut RendezvousUrl) -> Result<(), ConfigError> {
        let database_like = url.run_id.len() <= 2 && url.run_id.chars().all(|c| c.is_ascii_digit());
        if database_like && !url.options.contains_key("db") {
            let scheme = &url.scheme;
            return Err(ConfigError::InvalidValue {
                option: "run_id".into(),
                value: url.run_id.clone(),
                reason: format!(
                    "on {scheme}:// the path is the run id, not the database number as in other Redis \
                     tools, so every job using this URL would join the same run; write \
                     {scheme}://host:6379/<run_id>?db=0 (a run id of one or two digits needs an \
                     explicit `db=`, e.g. {scheme}://host:6379/42?db=0)"
                ),
            });
        }
        Ok(())
    }

    fn accepts_password_alone(&self) -> bool {
        true
    }

    async fn connect(&self, url: &RendezvousUrl) -> Result<Arc<dyn Kv>, RendezvousError> {
        let config = RedisConfig::from_url(url)?;
        match RedisKv::connect(config).await {
            Ok(kv) => Ok(Arc::new(kv)),
            Err(e) => Err(RendezvousError::connecting(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rdzv_core::Registry;
    use rdzv_core::url::Endpoint;

    use super::*;

    fn registry() -> Registry {
        let registry = Registry::new();
        registry.register("redis", Arc::new(RedisFactory)).unwrap();
        registry.register("rediss", Arc::new(RedisFactory)).unwrap();
        registry
    }

    fn parse(url: &str) -> RendezvousUrl {
        registry().parse_address(url).unwrap_or_else(|e| panic!("`{url}` should parse: {e}")).url
    }

    fn parse_err(url: &str) -> ConfigError {
        match registry().parse_address(url) {
            Err(RendezvousError::Config(e)) => e,
            other => panic!("`{url}` should be a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn default_port_is_6379() {
        for url in ["redis://h/r", "rediss://h/r"] {
            assert_eq!(parse(url).endpoints, [Endpoint { host: "h".into(), port: 6379 }], "{url}");
        }
        assert_eq!(parse("redis://:pw@h/r").to_string(), "redis://:***@h:6379/r");
    }

    /// On `redis://`, a path of one or two digits is what other tools read as the database:
    /// refused unless `db=` says which database is meant; longer numeric run ids work.
    #[test]
    fn paths_that_look_like_a_database_are_refused() {
        for url in
            ["redis://h:6379/0", "redis://h/15", "rediss://h/7?min_workers=1", "redis://h/00", "redis://h/99"]
        {
            match parse_err(url) {
                ConfigError::InvalidValue { option, reason, .. } => {
                    assert_eq!(option, "run_id", "{url}");
                    assert!(reason.contains("/<run_id>?db=0"), "{url}: {reason}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        assert_eq!(parse("redis://h/12345678").run_id, "12345678", "a Slurm job id");
        assert_eq!(parse("redis://h/100").run_id, "100");
        assert_eq!(parse("redis://h/0?db=0").run_id, "0", "explicit database: the path is a run id");
        assert_eq!(parse("redis://h/job?db=0").options["db"], "0");
        assert_eq!(parse("redis://h/0a").run_id, "0a");
    }

    #[test]
    fn protocol_is_not_a_redis_option() {
        assert!(matches!(
            parse_err("redis://h/r?protocol=https"),
            ConfigError::UnknownOption { option, .. } if option == "protocol"
        ));
    }
}
