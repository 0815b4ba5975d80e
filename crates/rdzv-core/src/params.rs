//! The parameters of a rendezvous (PROTOCOL.md "Parameters"), with defaults and validation.

use std::time::Duration;

use crate::error::ConfigError;

/// Default key prefix under which all runs live (the reference's).
pub const DEFAULT_PREFIX: &str = "/torchelastic/p2p";

/// Parameters of one rendezvous handler. Build with [`RendezvousParams::new`] and the
/// `with_*` setters; every setter keeps the value valid or the final
/// [`RendezvousParams::validate`] says why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousParams {
    /// The run (job) id: all workers of one job use the same.
    pub run_id: String,
    /// Smallest world size a round may complete with (≥ 1).
    pub min_workers: usize,
    /// Largest world size (≥ `min_workers`).
    pub max_workers: usize,
    /// The whole `next_rendezvous` call must finish within this.
    pub timeout: Duration,
    /// Extra wait after `min_workers` joined, when `min < max`.
    pub last_call_timeout: Duration,
    /// Key prefix under which all runs live.
    pub prefix: String,
    /// How long a silent worker stays a member (its session lease TTL).
    pub keep_alive_ttl: Duration,
    /// How long a run's data outlives its last live worker.
    pub run_ttl: Duration,
    /// This worker's node id (default: `<hostname>-<pid>-<random>`).
    pub node_id: Option<String>,
    /// The address this worker advertises (default: its host name).
    pub local_addr: Option<String>,
}

impl RendezvousParams {
    /// Parameters for `run_id` with `min ..= max` workers and every other value at its
    /// default; fails if `run_id` is empty, `min` is 0 or `min > max`.
    pub fn new(
        run_id: impl Into<String>,
        min_workers: usize,
        max_workers: usize,
    ) -> Result<Self, ConfigError> {
        let params = RendezvousParams {
            run_id: run_id.into(),
            min_workers,
            max_workers,
            timeout: Duration::from_secs(600),
            last_call_timeout: Duration::from_secs(30),
            prefix: DEFAULT_PREFIX.to_string(),
            keep_alive_ttl: Duration::from_secs(10),
            run_ttl: Duration::from_secs(2 * 3600),
            node_id: None,
            local_addr: None,
        };
        params.validate()?;
        Ok(params)
    }

    /// Checks every rule of PROTOCOL.md; the error names the first broken one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |option: &str, value: String, reason: &str| {
            Err(ConfigError::InvalidValue {
                option: option.into(),
                value,
                reason: reason.into(),
            })
        };
        if self.run_id.is_empty() {
            return invalid("run_id", String::new(), "the run id must not be empty");
        }
        if self.min_workers == 0 {
            return invalid("min_workers", "0".into(), "at least one worker is needed");
        }
        if self.max_workers < self.min_workers {
            return invalid(
                "max_workers",
                self.max_workers.to_string(),
                &format!("must be at least min_workers ({})", self.min_workers),
            );
        }
        for (name, d) in [
            ("timeout", self.timeout),
            ("keep_alive_ttl", self.keep_alive_ttl),
            ("run_ttl", self.run_ttl),
        ] {
            if d.is_zero() {
                return invalid(name, "0".into(), "must be greater than zero");
            }
        }
        if self.prefix.is_empty() {
            return invalid("prefix", String::new(), "the key prefix must not be empty");
        }
        Ok(())
    }
}
