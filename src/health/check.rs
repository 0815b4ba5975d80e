//! What a health check is, as the `health_check` option spells it, and running a node's
//! checks in turn under one timeout.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rdzv_core::protocol::RunKeys;
use rdzv_core::{ConfigError, Kv};
use tokio::time::Instant;

use super::{builtin, command};

/// How long the `store` check allows a write and a read of the run's Store by default.
const DEFAULT_STORE_BOUND: Duration = Duration::from_secs(5);

/// One check of a node's health gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// A shell command (`sh -c`): passes when it exits 0.
    Command(String),
    /// `gpu` or `gpu:N`: `nvidia-smi -L` lists at least N GPUs (a bare `gpu`: the count the
    /// node runs workers on, or 1), and none in an error state.
    Gpu {
        /// N, when given.
        at_least: Option<usize>,
    },
    /// `disk:PATH:MIN`: at least MIN free on PATH's file system (MIN in bytes, or with a
    /// `K`, `M`, `G` or `T` suffix: powers of 1024).
    Disk {
        /// The path.
        path: PathBuf,
        /// The least free space, in bytes.
        min_free: u64,
    },
    /// `store` or `store:BOUND`: a write, a read and a delete of a key of the run's Store
    /// succeed within BOUND (default 5 s): the backend is reachable with sane latency.
    Store {
        /// The bound.
        bound: Duration,
    },
}

/// What one run of a node's checks found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every check passed.
    Passed,
    /// A check failed: why, in its own words (exit status or signal or timeout, and the last
    /// lines of its output).
    Failed(String),
    /// A check could not run at all (its command was not found or not executable: the shell
    /// exited 127 or 126, or the shell itself could not start): a bad command line rather
    /// than a sick node, when seen at the first check.
    CannotRun(String),
}

impl Verdict {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Passed)
    }

    /// Why a check failed or could not run (`passed` when none did).
    pub fn reason(&self) -> &str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed(why) | Verdict::CannotRun(why) => why,
        }
    }
}

/// The run a `store` check writes to, and the node it writes as.
#[derive(Clone, Debug)]
pub struct Target {
    /// The run's backend.
    pub kv: Arc<dyn Kv>,
    /// The run's keys.
    pub keys: RunKeys,
    /// The checking node's id (its key is `…/store/rdzv/health/<node>`).
    pub node: String,
}

/// A node's checks, each passed in turn, all within one timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checks {
    list: Vec<Check>,
    timeout: Duration,
    gpus: usize,
}

impl Checks {
    /// The checks `specs` name (each a shell command, or `builtin:` and built-in checks
    /// separated by `,` or `+`), which must all pass within `timeout`. A bare `gpu` expects
    /// one GPU until [`expecting_gpus`](Self::expecting_gpus) says otherwise. Errors name
    /// the part at fault: an unknown built-in, a bad size or count.
    pub fn parse(specs: &[String], timeout: Duration) -> Result<Checks, ConfigError> {
        let mut list = Vec::new();
        for spec in specs {
            match spec.trim().strip_prefix("builtin:") {
                Some(names) => {
                    for name in names.split([',', '+']).map(str::trim) {
                        list.push(parse_builtin(name)?);
                    }
                }
                None if spec.trim().is_empty() => {
                    return Err(invalid(spec, "must name a command or `builtin:` checks"));
                }
                None => list.push(Check::Command(spec.clone())),
            }
        }
        if list.is_empty() {
            return Err(invalid("", "must name a command or `builtin:` checks"));
        }
        Ok(Checks { list, timeout, gpus: 1 })
    }

    /// These checks, a bare `gpu` expecting `n` GPUs (the node's number of workers).
    pub fn expecting_gpus(mut self, n: usize) -> Checks {
        self.gpus = n.max(1);
        self
    }

    /// The checks, in the order they run.
    pub fn list(&self) -> &[Check] {
        &self.list
    }

    /// How long all of them may take together.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether any check is `store` (it needs a [`Target`]).
    pub fn needs_target(&self) -> bool {
        self.list.iter().any(|c| matches!(c, Check::Store { .. }))
    }

    /// Runs the checks in turn until one does not pass; `target` is the run a `store` check
    /// writes to (without one, that check fails, saying so). What is left of the timeout
    /// bounds each: a command still running at the end is killed with its process group.
    pub async fn run(&self, target: Option<&Target>) -> Verdict {
        let deadline = Instant::now() + self.timeout;
        for check in &self.list {
            let verdict = match check {
                Check::Command(cmd) => command::run(cmd, deadline, self.timeout).await,
                Check::Gpu { at_least } => builtin::gpu(at_least.unwrap_or(self.gpus), deadline).await,
                Check::Disk { path, min_free } => builtin::disk(path, *min_free, deadline).await,
                Check::Store { bound } => match target {
                    Some(target) => builtin::store(target, (*bound).min(self.timeout)).await,
                    None => Verdict::Failed("builtin store: no run to write to (give the run's URL)".into()),
                },
            };
            if !verdict.passed() {
                return verdict;
            }
        }
        Verdict::Passed
    }
}

fn invalid(value: &str, reason: &str) -> ConfigError {
    ConfigError::InvalidValue { option: "health_check".into(), value: value.into(), reason: reason.into() }
}

/// One built-in check by name (`gpu`, `gpu:N`, `disk:PATH:MIN`, `store`, `store:BOUND`).
fn parse_builtin(spec: &str) -> Result<Check, ConfigError> {
    let (name, arg) = spec.split_once(':').unwrap_or((spec, ""));
    match (name, arg) {
        ("gpu", "") => Ok(Check::Gpu { at_least: None }),
        ("gpu", n) => match n.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Check::Gpu { at_least: Some(n) }),
            _ => Err(invalid(spec, "gpu:N needs a number of GPUs, at least 1")),
        },
        ("disk", rest) => {
            let Some((path, min)) = rest.rsplit_once(':').filter(|(path, _)| !path.is_empty()) else {
                return Err(invalid(spec, "expected disk:PATH:MIN, e.g. disk:/tmp:10G"));
            };
            let min_free = parse_size(min).ok_or_else(|| {
                invalid(spec, "the least free space is bytes, or a number with K, M, G or T (e.g. 10G)")
            })?;
            Ok(Check::Disk { path: path.into(), min_free })
        }
        ("store", "") => Ok(Check::Store { bound: DEFAULT_STORE_BOUND }),
        ("store", bound) => match rdzv_core::params::parse_duration("health_check", bound) {
            Ok(bound) if !bound.is_zero() => Ok(Check::Store { bound }),
            _ => Err(invalid(spec, "store:BOUND needs a duration above zero, e.g. store:5s")),
        },
        _ => Err(invalid(
            spec,
            "unknown built-in check; the built-ins are gpu, gpu:N, disk:PATH:MIN, store, store:BOUND",
        )),
    }
}

/// A size in bytes: digits, then optionally `K`, `M`, `G` or `T` (powers of 1024), then
/// optionally `B` or `iB`.
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let text = text.strip_suffix("iB").or_else(|| text.strip_suffix('B')).unwrap_or(text);
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = match &text[digits.len()..] {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(specs: &[&str]) -> Result<Vec<Check>, ConfigError> {
        let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
        Checks::parse(&specs, Duration::from_secs(60)).map(|c| c.list)
    }

    #[test]
    fn builtins_and_commands_are_told_apart_and_combined() {
        let checks = parse(&["builtin:gpu,disk:/tmp:10G+store", "test -e /ok"]).expect("parses");
        assert_eq!(
            checks,
            [
                Check::Gpu { at_least: None },
                Check::Disk { path: "/tmp".into(), min_free: 10 << 30 },
                Check::Store { bound: DEFAULT_STORE_BOUND },
                Check::Command("test -e /ok".into()),
            ]
        );
        assert_eq!(parse(&["builtin:gpu:8"]).expect("gpu:8"), [Check::Gpu { at_least: Some(8) }]);
        assert_eq!(
            parse(&["builtin:disk:/a:b:512"]).expect("a colon in the path"),
            [Check::Disk { path: "/a:b".into(), min_free: 512 }]
        );
        assert_eq!(
            parse(&["builtin:store:250ms"]).expect("store bound"),
            [Check::Store { bound: Duration::from_millis(250) }]
        );
    }

    #[test]
    fn a_bad_check_is_a_clear_error() {
        for (spec, says) in [
            ("builtin:gpus", "unknown built-in"),
            ("builtin:gpu:0", "at least 1"),
            ("builtin:disk:/tmp", "disk:PATH:MIN"),
            ("builtin:disk:/tmp:10X", "K, M, G or T"),
            ("builtin:store:0s", "above zero"),
            ("  ", "must name"),
        ] {
            let e = parse(&[spec]).expect_err(spec).to_string();
            assert!(e.contains("health_check") && e.contains(says), "{spec}: {e}");
        }
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("10"), Some(10));
        assert_eq!(parse_size("1K"), Some(1024));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("3GB"), Some(3 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }
}
