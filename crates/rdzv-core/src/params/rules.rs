//! [`RendezvousParams`] (docs/PROTOCOL.md "Parameters") with their defaults and validation,
//! and the option table that names them in URLs.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::ConfigError;
use crate::ids::validate_id;

/// The longest duration any option may have: one year. Deadlines are computed as "now +
/// duration", which overflows (and panics) for durations near `u64::MAX` seconds; a year is
/// far beyond any useful timeout or TTL and far below any overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Default key prefix under which all runs live (the reference's).
pub const DEFAULT_PREFIX: &str = "/torchelastic/p2p";

/// Parameters of one rendezvous handler. Build with [`RendezvousParams::new`] (or
/// [`RendezvousParams::from_options`] from a URL's query), then change the public fields as
/// needed; [`RendezvousParams::validate`] (also run by the handler) says which rule a value
/// breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousParams {
    /// The run (job) id: all workers of one job use the same. It follows the identifier
    /// rule of [`validate_id`] (ASCII letters, digits, `-` `_` `.` `:` `@` `+`; 1 to 253
    /// characters).
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
    /// How long a silent worker stays a member (its session lease TTL). Default:
    /// [`default_keep_alive_ttl`] of `max_workers` (10 s up to 4,095 workers), set when the
    /// parameters are made.
    pub keep_alive_ttl: Duration,
    /// How long a run's data outlives its last live worker.
    pub run_ttl: Duration,
    /// This worker's node id (default: `<hostname>-<pid>-<random>`); the same rule as
    /// run ids.
    pub node_id: Option<String>,
    /// The address this worker advertises (default: its host name).
    pub local_addr: Option<String>,
    /// In which order newcomers take the free ranks of a round (default: by segment, then
    /// arrival; plain arrival when no worker names a segment).
    pub rank_order: RankOrder,
    /// The segment of the hardware this worker is in (an NVLink domain, a rack): workers of
    /// one segment get consecutive ranks (docs/PROTOCOL.md "Segments"). Same rule as an
    /// identifier.
    pub segment: Option<String>,
    /// Whole-segment admission (`segment_size=K`): a round admits only complete segments of
    /// `K` live workers, each holding a block of `K` ranks aligned to `K`; the workers of an
    /// incomplete segment wait as spares (docs/PROTOCOL.md "Whole segments"). Needs a
    /// `rank_order` by segment, and a `segment` in every worker
    /// ([`validate_worker`](Self::validate_worker)); `min_workers` and `max_workers` must be
    /// multiples of `K`.
    pub segment_size: Option<usize>,
    /// This node's index in its scheduler's order of the job's nodes (`node_index`; `rdzv
    /// run` under Slurm gives its position in `SLURM_JOB_NODELIST`): with
    /// `rank_order=slurm`, newcomers take free ranks in this order.
    pub node_index: Option<u64>,
    /// The node's health gate, if any: checks run before each join and while the worker
    /// waits or is a member (docs/PROTOCOL.md "Health gates"). The handler only carries
    /// them; the `rdzv` facade's worker runs them.
    pub health: Option<HealthParams>,
    /// The longest member list, in bytes as written, that a round's `frozen` or `final`
    /// value holds itself ([`DEFAULT_MEMBERS_INLINE_BYTES`]); a longer one is written in
    /// pieces of at most this size beside it, which each reader reads once
    /// (docs/PROTOCOL.md "How large a round can be"). Keep it well under the backend's
    /// largest request (etcd's `--max-request-bytes`). Only the writer's value matters:
    /// workers of one run may differ.
    pub members_inline_bytes: usize,
}

/// The default [`RendezvousParams::members_inline_bytes`]: 512 KiB, a third of etcd's
/// default request limit (about 8,000 members of the default node ids).
pub const DEFAULT_MEMBERS_INLINE_BYTES: usize = 512 * 1024;

/// The default [`RendezvousParams::keep_alive_ttl`] of the smallest runs: the reference's 10 s.
pub const BASE_KEEP_ALIVE_TTL: Duration = Duration::from_secs(10);

/// Workers of `max_workers` for each second the default `keep_alive_ttl` grows beyond
/// [`BASE_KEEP_ALIVE_TTL`]. A session is refreshed every third of its TTL, so a run's
/// sessions cost the server `3 × workers / TTL` refreshes a second for as long as it lasts;
/// at a fixed TTL that load grows with the run, and so does a round's length, so the
/// refreshes one round costs grow with the square of its size. On one etcd (2 cores), a
/// round of 98,304 took 15.3 times one of 8,192 at 10 s, and 12.4 times at the TTLs of
/// this rule (34 s and 12 s; medians of quiet runs, BENCHMARKS.md).
pub const WORKERS_PER_KEEP_ALIVE_SECOND: usize = 4096;

/// The `keep_alive_ttl` a worker of a run of up to `max_workers` gets when none is given:
/// [`BASE_KEEP_ALIVE_TTL`], plus 1 s per [`WORKERS_PER_KEEP_ALIVE_SECOND`] workers (10 s up
/// to 4,095, 12 s at 8,192, 34 s at 98,304), but never more than half of `run_ttl` where
/// that is above the base, so that the default never breaks the rule `run_ttl ≥ 2 ×
/// keep_alive_ttl` by itself. The price of the longer TTL: a silent member is noticed that
/// much later.
///
/// ```
/// use std::time::Duration;
/// use rdzv_core::params::default_keep_alive_ttl;
///
/// let two_hours = Duration::from_secs(7200);
/// assert_eq!(default_keep_alive_ttl(64, two_hours), Duration::from_secs(10));
/// assert_eq!(default_keep_alive_ttl(98_304, two_hours), Duration::from_secs(34));
/// assert_eq!(default_keep_alive_ttl(98_304, Duration::from_secs(40)), Duration::from_secs(20));
/// ```
pub fn default_keep_alive_ttl(max_workers: usize, run_ttl: Duration) -> Duration {
    let grown =
        BASE_KEEP_ALIVE_TTL + Duration::from_secs((max_workers / WORKERS_PER_KEEP_ALIVE_SECOND) as u64);
    grown.min((run_ttl / 2).max(BASE_KEEP_ALIVE_TTL))
}

/// A node's health gate (the `health_check*` options): what to check, how long a check may
/// run, how often it runs, and how many consecutive failures drain a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthParams {
    /// The checks, each passed in turn (`health_check` gives one; `rdzv run
    /// --health-check` may give several): a shell command (passed when it exits 0), or
    /// `builtin:` and a list of built-in checks separated by `,` or `+` (`gpu`, `gpu:N`,
    /// `disk:PATH:MIN`, `store`, `store:BOUND`). Parsed by whoever runs them (the `rdzv`
    /// facade, which rejects an unknown built-in when the worker is made).
    pub checks: Vec<String>,
    /// How long one check may run before it is killed and counts as failed
    /// (`health_check_timeout`, 60 s).
    pub timeout: Duration,
    /// How often the check runs while the node waits, is excluded or is a member
    /// (`health_check_interval`, 30 s).
    pub interval: Duration,
    /// How many failed checks in a row drain a member (`health_check_failures`, 2).
    pub failures: u32,
    /// How many GPUs a bare `gpu` check expects (1; not an option: `rdzv run` sets its
    /// `--nproc-per-node`).
    pub gpus: usize,
}

impl HealthParams {
    /// The single check `check`, with every other value at its default.
    pub fn new(check: impl Into<String>) -> HealthParams {
        HealthParams {
            checks: vec![check.into()],
            timeout: Duration::from_secs(60),
            interval: Duration::from_secs(30),
            failures: 2,
            gpus: 1,
        }
    }
}

/// In which order the newcomers of a round (workers that were not members of the round
/// before it) take its free ranks: the `rank_order` option. Survivors of the round before
/// keep their ranks whatever the order (docs/PROTOCOL.md "Who is in, and their ranks").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RankOrder {
    /// By segment, then in the order they arrived in the run (`rank_order=segment`, the
    /// default): the workers of one segment take consecutive ranks, segments in the order of
    /// their first arrival, and a free rank goes to a worker of the segment of the member that
    /// held it first. Without segments, the order of arrival.
    #[default]
    Segment,
    /// By segment as [`Segment`](Self::Segment), and inside a segment by advertised address,
    /// then node id, in natural order (`rank_order=segment+natural`, or `segment,natural`).
    SegmentNatural,
    /// In the order they arrived in the run, whatever their segments (`rank_order=arrival`).
    Arrival,
    /// By advertised address, then node id, in natural order: runs of digits compare as
    /// numbers, so `node7` comes before `node66` (`rank_order=natural`); segments ignored.
    Natural,
    /// By the `node_index` each worker gives (`rank_order=slurm`: `rdzv run` under Slurm gives
    /// its node's position in the job's node list, Slurm's topology-aware order), workers
    /// without one after those with one, ties in order of arrival; segments ignored.
    Slurm,
}

impl RankOrder {
    /// The option's value for this order.
    pub fn as_str(self) -> &'static str {
        match self {
            RankOrder::Segment => "segment",
            RankOrder::SegmentNatural => "segment+natural",
            RankOrder::Arrival => "arrival",
            RankOrder::Natural => "natural",
            RankOrder::Slurm => "slurm",
        }
    }

    /// Whether workers of one segment are kept together.
    pub fn by_segment(self) -> bool {
        matches!(self, RankOrder::Segment | RankOrder::SegmentNatural)
    }

    /// Whether newcomers (inside a segment, when by segment) are ordered by address and node
    /// id rather than by arrival.
    pub fn natural(self) -> bool {
        matches!(self, RankOrder::Natural | RankOrder::SegmentNatural)
    }

    fn parse(value: &str) -> Result<RankOrder, ConfigError> {
        match value {
            "segment" => Ok(RankOrder::Segment),
            "segment+natural" | "segment,natural" => Ok(RankOrder::SegmentNatural),
            "arrival" => Ok(RankOrder::Arrival),
            "natural" => Ok(RankOrder::Natural),
            "slurm" => Ok(RankOrder::Slurm),
            _ => Err(ConfigError::InvalidValue {
                option: "rank_order".into(),
                value: value.chars().take(80).flat_map(char::escape_debug).collect(),
                reason: "expected `segment` (the default: each segment's workers together, in order of arrival), `segment+natural` (together, by address inside), `arrival` (in order of arrival), `natural` (by address, then node id, digits as numbers) or `slurm` (by node_index: the node's place in the Slurm job's node list)".into(),
            }),
        }
    }
}

impl RendezvousParams {
    /// Parameters for `run_id` with `min ..= max` workers and every other value at its
    /// default (`keep_alive_ttl` that of [`default_keep_alive_ttl`] for `max`); fails if
    /// `run_id` breaks the rule of [`validate_id`], `min` is 0 or `min > max`.
    pub fn new(
        run_id: impl Into<String>,
        min_workers: usize,
        max_workers: usize,
    ) -> Result<Self, ConfigError> {
        let defaults = RendezvousParams::defaults();
        let params = RendezvousParams {
            run_id: run_id.into(),
            min_workers,
            max_workers,
            keep_alive_ttl: default_keep_alive_ttl(max_workers, defaults.run_ttl),
            ..defaults
        };
        params.validate()?;
        Ok(params)
    }

    /// Every value at its docs/PROTOCOL.md default; `run_id` empty and one worker, to be filled in.
    fn defaults() -> Self {
        RendezvousParams {
            run_id: String::new(),
            min_workers: 1,
            max_workers: 1,
            timeout: Duration::from_secs(600),
            last_call_timeout: Duration::from_secs(30),
            prefix: DEFAULT_PREFIX.to_string(),
            keep_alive_ttl: BASE_KEEP_ALIVE_TTL,
            run_ttl: Duration::from_secs(2 * 3600),
            node_id: None,
            local_addr: None,
            rank_order: RankOrder::default(),
            segment: None,
            segment_size: None,
            node_index: None,
            health: None,
            members_inline_bytes: DEFAULT_MEMBERS_INLINE_BYTES,
        }
    }

    /// Checks every rule of docs/PROTOCOL.md; the error names the first broken one. The run id
    /// and the node id (if given) must follow the identifier rule of [`validate_id`]
    /// (ASCII letters, digits, `-` `_` `.` `:` `@` `+`; 1 to 253 characters); the address
    /// (if given) must be non-empty, at most 253 bytes, without whitespace or control
    /// characters; every duration must be at most [`MAX_DURATION`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |option: &str, value: String, reason: &str| {
            Err(ConfigError::InvalidValue { option: option.into(), value, reason: reason.into() })
        };
        validate_id("run_id", &self.run_id)?;
        if let Some(segment) = &self.segment {
            validate_id("segment", segment)?;
        }
        if let Some(node_id) = &self.node_id {
            validate_id("node_id", node_id)?;
        }
        if let Some(addr) = &self.local_addr {
            validate_address(addr)?;
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
        for (name, d) in
            [("timeout", self.timeout), ("keep_alive_ttl", self.keep_alive_ttl), ("run_ttl", self.run_ttl)]
        {
            if d.is_zero() {
                return invalid(name, "0".into(), "must be greater than zero");
            }
        }
        for (name, d) in [
            ("timeout", self.timeout),
            ("last_call_timeout", self.last_call_timeout),
            ("keep_alive_ttl", self.keep_alive_ttl),
            ("run_ttl", self.run_ttl),
        ] {
            check_duration_bound(name, &format!("{d:?}"), d)?;
        }
        // The run lease binds the round counter; the keys of a round that outlive it are bound
        // to the workers' sessions. When every holder of the run lease is gone (the creator of
        // a first round died while the others were still joining), the counter expires and
        // round numbers start again at 1: a dead worker's keys of those rounds must have gone
        // first, or they are counted in the new rounds as if alive. A dead holder's run lease
        // lasts at least two thirds of `run_ttl` (refreshed every third), its session keys at
        // most `keep_alive_ttl`; twice leaves room for the servers' expiry granularity.
        if self.run_ttl < 2 * self.keep_alive_ttl {
            return invalid(
                "run_ttl",
                format!("{:?}", self.run_ttl),
                &format!(
                    "must be at least twice keep_alive_ttl ({:?}): the run's round counter must outlive \
                     every worker's session keys, or a run whose last lease holder died would number its \
                     rounds from 1 again while a dead worker's keys of those rounds remain",
                    self.keep_alive_ttl
                ),
            );
        }
        if self.prefix.is_empty() {
            return invalid("prefix", String::new(), "the key prefix must not be empty");
        }
        if let Some(health) = &self.health {
            validate_health(health)?;
        }
        self.validate_segment_size()
    }

    /// [`validate`](Self::validate), and the rules for a worker that joins rounds (not only
    /// reads or closes the run): with `segment_size`, it names its segment.
    pub fn validate_worker(&self) -> Result<(), ConfigError> {
        self.validate()?;
        match self.segment_size {
            Some(k) if self.segment.is_none() => Err(ConfigError::InvalidValue {
                option: "segment".into(),
                value: String::new(),
                reason: format!(
                    "segment_size ({k}) needs this worker's segment: give `segment` (`rdzv run --segment`, \
                     torchrun `--rdzv-conf segment=`)"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// `segment_size`: at least 1, dividing `min_workers` and `max_workers`, with ranks ordered
    /// by segment.
    fn validate_segment_size(&self) -> Result<(), ConfigError> {
        let Some(k) = self.segment_size else { return Ok(()) };
        let invalid = |option: &str, value: String, reason: String| {
            Err(ConfigError::InvalidValue { option: option.into(), value, reason })
        };
        if k == 0 {
            return invalid("segment_size", "0".into(), "a segment has at least one worker".into());
        }
        for (name, n) in [("min_workers", self.min_workers), ("max_workers", self.max_workers)] {
            if n % k != 0 {
                return invalid(
                    name,
                    n.to_string(),
                    format!(
                        "must be a multiple of segment_size ({k}): a round admits whole segments of {k} workers"
                    ),
                );
            }
        }
        if !self.rank_order.by_segment() {
            return invalid(
                "rank_order",
                self.rank_order.as_str().into(),
                "segment_size keeps each segment in a block of ranks: use `segment` or `segment+natural`"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A health gate's values: a check given, positive durations, at least one failure.
fn validate_health(health: &HealthParams) -> Result<(), ConfigError> {
    let invalid = |option: &str, value: String, reason: &str| {
        Err(ConfigError::InvalidValue { option: option.into(), value, reason: reason.into() })
    };
    if health.checks.is_empty() || health.checks.iter().any(|c| c.trim().is_empty()) {
        return invalid("health_check", String::new(), "must name a command or `builtin:` checks");
    }
    for (name, d) in [("health_check_timeout", health.timeout), ("health_check_interval", health.interval)] {
        if d.is_zero() {
            return invalid(name, "0".into(), "must be greater than zero");
        }
        check_duration_bound(name, &format!("{d:?}"), d)?;
    }
    if health.failures == 0 {
        return invalid("health_check_failures", "0".into(), "at least one failed check must drain a member");
    }
    Ok(())
}

/// An advertised address (host name, IPv4 or IPv6 address, possibly with a zone): it ends up
/// in `MASTER_ADDR` and in other workers' output, so no whitespace or control characters.
fn validate_address(addr: &str) -> Result<(), ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidValue {
        option: "local_addr".into(),
        value: addr.chars().take(80).flat_map(char::escape_debug).collect(),
        reason: reason.into(),
    };
    if addr.is_empty() {
        return Err(invalid("must not be empty; leave it out for the host name"));
    }
    if addr.len() > 253 {
        return Err(invalid("an address is at most 253 bytes long"));
    }
    if addr.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("an address must not contain whitespace or control characters"));
    }
    Ok(())
}

/// Why a duration over [`MAX_DURATION`] is refused.
const TOO_LONG: &str = "the duration is too long: at most one year (`365d`, 31536000 seconds) is allowed";

/// Fails unless `d` is at most [`MAX_DURATION`]; `shown` is the value as the user wrote it.
fn check_duration_bound(option: &str, shown: &str, d: Duration) -> Result<(), ConfigError> {
    if d > MAX_DURATION {
        return Err(ConfigError::InvalidValue {
            option: option.to_string(),
            value: shown.to_string(),
            reason: TOO_LONG.into(),
        });
    }
    Ok(())
}

/// The rendezvous parameters' options as they appear in a URL query: the canonical name and
/// the other spelling it is also accepted by (the reference's name), in the order of
/// docs/PROTOCOL.md. The single source of the names and their aliases: the URL parser and
/// [`RendezvousParams::from_options`] both map names through it
/// ([`canonical_option_name`]).
pub const OPTIONS: &[(&str, Option<&str>)] = &[
    ("min_workers", Some("min_nodes")),
    ("max_workers", Some("max_nodes")),
    ("timeout", None),
    ("last_call_timeout", None),
    ("prefix", Some("etcd_prefix")),
    ("keep_alive_ttl", None),
    ("run_ttl", None),
    ("node_id", None),
    ("local_addr", None),
    ("rank_order", None),
    ("segment", None),
    ("segment_size", None),
    ("node_index", None),
    ("health_check", None),
    ("health_check_timeout", None),
    ("health_check_interval", None),
    ("health_check_failures", None),
];

/// The canonical names of the rendezvous options, in the order of [`OPTIONS`].
pub fn option_names() -> impl Iterator<Item = &'static str> {
    OPTIONS.iter().map(|(name, _)| *name)
}

/// The canonical name of an option: an alias is mapped to the name it stands for; every
/// other name (rendezvous parameter or not) is returned as it is.
pub fn canonical_option_name(name: &str) -> &str {
    OPTIONS.iter().find(|(_, alias)| *alias == Some(name)).map_or(name, |(canonical, _)| canonical)
}

/// Whether `name` (canonical or alias) is a rendezvous parameter rather than a backend's
/// option.
pub fn is_rendezvous_option(name: &str) -> bool {
    let canonical = canonical_option_name(name);
    option_names().any(|n| n == canonical)
}

/// Adds the option `name=value` to `options` under its canonical name (an alias is mapped
/// by [`canonical_option_name`]). Fails with [`ConfigError::InvalidUrl`] if the option is
/// already there, under either spelling: the one rule for options given twice, for URLs and
/// for maps handed to [`RendezvousParams::from_options`].
pub(crate) fn insert_option(
    options: &mut BTreeMap<String, String>,
    name: &str,
    value: String,
) -> Result<(), ConfigError> {
    let canonical = canonical_option_name(name);
    if options.contains_key(canonical) {
        return Err(ConfigError::InvalidUrl(format!(
            "the option `{canonical}` is given more than once (counting its aliases); give it once"
        )));
    }
    options.insert(canonical.to_string(), value);
    Ok(())
}

/// Parses a duration option: plain seconds (`30`, `0.5`) or a humane form (`30s`, `2m`,
/// `1h`, `500ms`, `1h 30m`), at most [`MAX_DURATION`] (one year). The error names `option`
/// and says which forms are accepted, or that the duration is too long.
pub fn parse_duration(option: &str, value: &str) -> Result<Duration, ConfigError> {
    let d = parse_unbounded_duration(option, value)?;
    check_duration_bound(option, value, d)?;
    Ok(d)
}

fn parse_unbounded_duration(option: &str, value: &str) -> Result<Duration, ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidValue {
        option: option.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let expected = "expected seconds (`30`, `0.5`) or a duration such as `30s`, `2m`, `1h`, `500ms`";
    let is_plain_number = !value.is_empty()
        && value.chars().all(|c| c.is_ascii_digit() || c == '.')
        && value.chars().filter(|c| *c == '.').count() <= 1
        && value.chars().any(|c| c.is_ascii_digit());
    if is_plain_number {
        let seconds: f64 = value.parse().map_err(|_| invalid(expected))?;
        return Duration::try_from_secs_f64(seconds).map_err(|_| invalid(TOO_LONG));
    }
    humantime::parse_duration(value).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => invalid(TOO_LONG),
        _ => invalid(expected),
    })
}

/// Parses a worker count: a whole, non-negative number (whether it is in range is for
/// [`RendezvousParams::validate`] to say).
fn parse_count(option: &str, value: &str) -> Result<usize, ConfigError> {
    if value.is_empty() || !value.chars().all(|c| c.is_ascii_digit()) {
        return Err(ConfigError::InvalidValue {
            option: option.to_string(),
            value: value.to_string(),
            reason: "expected a whole number of workers, at least 1".to_string(),
        });
    }
    value.parse().map_err(|_| ConfigError::InvalidValue {
        option: option.to_string(),
        value: value.to_string(),
        reason: "the number is too large".to_string(),
    })
}

/// The health gate the `health_check*` options give: `None` without `health_check` (the
/// others alone are an error: they would do nothing).
fn health_from(given: &BTreeMap<String, String>) -> Result<Option<HealthParams>, ConfigError> {
    let Some(check) = given.get("health_check") else {
        if let Some(name) = ["health_check_timeout", "health_check_interval", "health_check_failures"]
            .into_iter()
            .find(|n| given.contains_key(*n))
        {
            return Err(ConfigError::InvalidValue {
                option: name.into(),
                value: given[name].clone(),
                reason: "has no effect without health_check (the check to run)".into(),
            });
        }
        return Ok(None);
    };
    let mut health = HealthParams::new(check.clone());
    if let Some(v) = given.get("health_check_timeout") {
        health.timeout = parse_duration("health_check_timeout", v)?;
    }
    if let Some(v) = given.get("health_check_interval") {
        health.interval = parse_duration("health_check_interval", v)?;
    }
    if let Some(v) = given.get("health_check_failures") {
        health.failures = v.parse().map_err(|_| ConfigError::InvalidValue {
            option: "health_check_failures".into(),
            value: v.clone(),
            reason: "expected a whole number of failed checks in a row, at least 1".into(),
        })?;
    }
    Ok(Some(health))
}

impl RendezvousParams {
    /// Parameters for `run_id` from the rendezvous options of a URL (names canonical or
    /// aliases, values as strings): `min_workers` is required, `max_workers` defaults to it,
    /// the rest to docs/PROTOCOL.md's defaults. Errors: [`ConfigError::MissingOption`] without
    /// `min_workers`, [`ConfigError::UnknownOption`] for a name that is not a rendezvous
    /// parameter, [`ConfigError::InvalidUrl`] for a parameter given twice (as a name and its
    /// alias), [`ConfigError::InvalidValue`] for a bad value or a broken rule.
    pub fn from_options<'a, I>(run_id: &str, options: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        Self::build(run_id, options, None)
    }

    /// As [`RendezvousParams::from_options`], except that options without `min_workers`
    /// size the rendezvous `default_min ..= max(default_min, default_max)` instead of failing
    /// (a `max_workers` among the options still sets the largest size). For tools that
    /// choose the size themselves when the URL does not, like `rdzv bench`.
    pub fn from_options_or<'a, I>(
        run_id: &str,
        options: I,
        default_min: usize,
        default_max: usize,
    ) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        Self::build(run_id, options, Some((default_min, default_max.max(default_min))))
    }

    /// The parameters from `options`; `default_sizing` is `(min, max)` for options that give
    /// no `min_workers` (`None`: then `min_workers` is required).
    fn build<'a, I>(
        run_id: &str,
        options: I,
        default_sizing: Option<(usize, usize)>,
    ) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        let mut given = BTreeMap::new();
        for (name, value) in options {
            if !is_rendezvous_option(name) {
                return Err(ConfigError::UnknownOption {
                    option: name.clone(),
                    known: option_names().collect::<Vec<_>>().join(", "),
                });
            }
            insert_option(&mut given, name, value.clone())?;
        }
        let given_count = |name: &str| given.get(name).map(|v| parse_count(name, v)).transpose();
        let (min_workers, max_workers) = match (given_count("min_workers")?, default_sizing) {
            (Some(min), _) => (min, given_count("max_workers")?.unwrap_or(min)),
            (None, Some((min, max))) => (min, given_count("max_workers")?.unwrap_or(max)),
            (None, None) => return Err(ConfigError::MissingOption("min_workers".to_string())),
        };
        let mut params = RendezvousParams {
            run_id: run_id.to_string(),
            min_workers,
            max_workers,
            ..RendezvousParams::defaults()
        };
        for (name, target) in [
            ("timeout", &mut params.timeout),
            ("last_call_timeout", &mut params.last_call_timeout),
            ("keep_alive_ttl", &mut params.keep_alive_ttl),
            ("run_ttl", &mut params.run_ttl),
        ] {
            if let Some(v) = given.get(name) {
                *target = parse_duration(name, v)?;
            }
        }
        if !given.contains_key("keep_alive_ttl") {
            params.keep_alive_ttl = default_keep_alive_ttl(max_workers, params.run_ttl);
        }
        if let Some(v) = given.get("prefix") {
            params.prefix = v.to_string();
        }
        if let Some(v) = given.get("rank_order") {
            params.rank_order = RankOrder::parse(v)?;
        }
        if let Some(v) = given.get("segment_size") {
            params.segment_size = Some(parse_count("segment_size", v)?);
        }
        if let Some(v) = given.get("node_index") {
            params.node_index = Some(v.parse().map_err(|_| ConfigError::InvalidValue {
                option: "node_index".into(),
                value: v.chars().take(80).flat_map(char::escape_debug).collect(),
                reason: "expected a whole number, 0 or more: the node's place in the job's node list".into(),
            })?);
        }
        params.health = health_from(&given)?;
        for (name, target) in [
            ("node_id", &mut params.node_id),
            ("local_addr", &mut params.local_addr),
            ("segment", &mut params.segment),
        ] {
            if let Some(v) = given.get(name) {
                if v.is_empty() {
                    return Err(ConfigError::InvalidValue {
                        option: name.to_string(),
                        value: String::new(),
                        reason: "must not be empty; leave the option out for the default".into(),
                    });
                }
                *target = Some(v.to_string());
            }
        }
        params.validate()?;
        Ok(params)
    }
}
