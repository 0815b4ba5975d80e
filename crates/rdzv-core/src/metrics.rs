//! Opt-in metrics, in Prometheus' text format: nothing is recorded unless a [`Metrics`] is
//! made and attached, and nothing is served (encode it where your program serves HTTP;
//! `rdzv run --metrics-addr` does that).
//!
//! A [`Metrics`] counts what its workers report ([`Metrics::observe`], subscribed with
//! [`Metrics::attach`]) and what they ask of their backend ([`Metrics::instrument`] wraps it
//! in a [`MeteredKv`]). Every metric is listed in
//! docs/OBSERVABILITY.md.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use std::sync::Arc;
//! # use rdzv_core::kv::GetResponse;
//! # use rdzv_core::{Kv, KvResult};
//! use rdzv_core::metrics::Metrics;
//!
//! let metrics = Metrics::new();
//! # let backend: Arc<dyn Kv> = Arc::new(Nothing);
//! # #[derive(Debug)] struct Nothing;
//! # #[async_trait::async_trait]
//! # impl Kv for Nothing {
//! #     fn name(&self) -> &'static str { "nothing" }
//! #     async fn get(&self, _: &[u8]) -> KvResult<GetResponse> { Ok(GetResponse { kv: None, revision: 1 }) }
//! #     async fn range(&self, _: &[u8], _: rdzv_core::kv::RangeOptions) -> KvResult<rdzv_core::kv::RangeResponse> { unimplemented!() }
//! #     async fn put(&self, _: &[u8], _: &[u8], _: rdzv_core::kv::PutOptions) -> KvResult<rdzv_core::kv::PutOutcome> { unimplemented!() }
//! #     async fn delete(&self, _: &[u8], _: rdzv_core::kv::DeleteMode) -> KvResult<rdzv_core::kv::DeleteOutcome> { unimplemented!() }
//! #     async fn delete_prefix(&self, _: &[u8]) -> KvResult<rdzv_core::kv::DeletePrefixResponse> { unimplemented!() }
//! #     async fn lease_grant(&self, _: std::time::Duration) -> KvResult<rdzv_core::kv::LeaseId> { unimplemented!() }
//! #     async fn lease_keep_alive(&self, _: rdzv_core::kv::LeaseId) -> KvResult<std::time::Duration> { unimplemented!() }
//! #     async fn lease_revoke(&self, _: rdzv_core::kv::LeaseId) -> KvResult<()> { unimplemented!() }
//! #     async fn watch(&self, _: &[u8], _: rdzv_core::kv::WatchScope, _: rdzv_core::kv::Revision) -> KvResult<rdzv_core::kv::WatchStream> { unimplemented!() }
//! # }
//! // Give the handler the instrumented backend (`RendezvousHandler::new(kv, params)`), and
//! // count its events with `metrics.attach(&handler)`.
//! let kv = metrics.instrument(backend);
//! kv.get(b"key").await?;
//!
//! let text = metrics.encode();
//! assert!(text.contains("rdzv_backend_operations_total{op=\"get\",result=\"ok\"} 1"), "{text}");
//! assert!(text.contains("rdzv_restarts_total{cause=\"member_lost\"} 0"), "{text}");
//! # Ok(())
//! # }
//! ```

use std::fmt::Write;
use std::sync::Arc;

use prometheus_client::encoding::{
    EncodeLabel, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

pub use prometheus_client;
/// The `Content-Type` of [`Metrics::encode`]'s text (Prometheus' text format 0.0.4).
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

use crate::events::{Event, EventKind, LostReason, RestartCause};
use crate::kv::{Kv, Op};
use crate::layer::MeteredKv;
use crate::rendezvous::RendezvousHandler;

/// The buckets of the rendezvous duration, in seconds: a round forms in milliseconds in
/// memory, in a `last_call_timeout` or more on a real cluster, and waits as long as it takes
/// for `min_workers` at the start.
const ROUND_BUCKETS: [f64; 14] =
    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0];

/// The buckets of a backend operation's latency, in seconds (a watch is timed until it is
/// open, not while it waits).
const OPERATION_BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5];

/// The `op` label of a backend operation: the [`Kv`] method's name, except that a batch of
/// lease refreshes is a `lease_keep_alive` and a prefix delete in pieces a `delete_prefix`.
fn op_label(op: Op) -> &'static str {
    match op {
        Op::LeaseKeepAliveMany => Op::LeaseKeepAlive.name(),
        Op::DeletePrefixLimited => Op::DeletePrefix.name(),
        op => op.name(),
    }
}

/// Whether a backend operation succeeded (the `result` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Ok,
    Error,
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OpResultLabels {
    op: &'static str,
    result: Outcome,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct WorkerLabels {
    run_id: String,
    node: String,
    segment: Option<String>,
}

/// Written by hand so that a worker without a segment has no `segment` label at all: an empty
/// label would change every unlabelled job's series.
impl EncodeLabelSet for WorkerLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("run_id", self.run_id.as_str()).encode(encoder.encode_label())?;
        ("node", self.node.as_str()).encode(encoder.encode_label())?;
        match &self.segment {
            Some(segment) => ("segment", segment.as_str()).encode(encoder.encode_label()),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

fn op_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// The metrics of one or more workers (their counts add up; a gauge tells the last value
/// reported). Cheap to clone: clones count into the same metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    worker: Family<WorkerLabels, Gauge>,
    rendezvous_duration: Histogram,
    rounds_formed: Counter,
    round_version: Gauge,
    round_members: Gauge,
    members_lost: Family<ReasonLabels, Counter>,
    spares_promoted: Counter,
    waiting_nodes: Gauge,
    spare_nodes: Gauge,
    restarts: Family<CauseLabels, Counter>,
    worker_exits: Family<StatusLabels, Counter>,
    lease_refresh_failures: Counter,
    health_check_failures: Counter,
    drains: Counter,
    exclusions: Counter,
    readmissions: Counter,
    excluded: Gauge,
    operations: Family<OpResultLabels, Counter>,
    operation_duration: Family<OpLabels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric at zero, registered in a registry of its own ([`encode`](Self::encode)).
    pub fn new() -> Metrics {
        let mut inner = Inner {
            registry: Registry::default(),
            worker: Family::default(),
            rendezvous_duration: Histogram::new(ROUND_BUCKETS),
            rounds_formed: Counter::default(),
            round_version: Gauge::default(),
            round_members: Gauge::default(),
            members_lost: Family::default(),
            spares_promoted: Counter::default(),
            waiting_nodes: Gauge::default(),
            spare_nodes: Gauge::default(),
            restarts: Family::default(),
            worker_exits: Family::default(),
            lease_refresh_failures: Counter::default(),
            health_check_failures: Counter::default(),
            drains: Counter::default(),
            exclusions: Counter::default(),
            readmissions: Counter::default(),
            excluded: Gauge::default(),
            operations: Family::default(),
            operation_duration: Family::new_with_constructor(op_histogram),
        };
        // Every cause and reason shows from the start, at 0: a dashboard's `increase(…)`
        // finds the series before the first restart.
        for cause in RestartCause::ALL {
            inner.restarts.get_or_create_owned(&CauseLabels { cause: cause.as_str() });
        }
        for reason in LostReason::ALL {
            inner.members_lost.get_or_create_owned(&ReasonLabels { reason: reason.as_str() });
        }
        let mut registry = Registry::default();
        inner.register(&mut registry);
        inner.registry = registry;
        Metrics { inner: Arc::new(inner) }
    }

    /// Registers the metrics in `registry` too, to encode them with the program's own.
    pub fn register(&self, registry: &mut Registry) {
        self.inner.register(registry);
    }

    /// The metrics now, in Prometheus' text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.inner.registry);
        text
    }

    /// Counts `worker`'s events from now on ([`observe`](Self::observe) on each).
    pub fn attach(&self, worker: &RendezvousHandler) {
        let metrics = self.clone();
        worker.on_event(move |event| metrics.observe(event));
    }

    /// `kv`, with each operation counted and timed by kind ([`MeteredKv`]).
    pub fn instrument(&self, kv: Arc<dyn Kv>) -> Arc<dyn Kv> {
        Arc::new(MeteredKv::new(kv, self))
    }

    /// Counts one event.
    pub fn observe(&self, event: &Event) {
        let m = &*self.inner;
        let worker = WorkerLabels {
            run_id: event.run_id.to_string(),
            node: event.node.to_string(),
            segment: event.segment.as_deref().map(str::to_string),
        };
        m.worker.get_or_create(&worker).set(1);
        match &event.kind {
            EventKind::RoundFormed { version, world_size, seconds, .. } => {
                m.rounds_formed.inc();
                m.rendezvous_duration.observe(*seconds);
                m.round_version.set(gauge(*version));
                m.round_members.set(gauge(*world_size));
            }
            EventKind::SparePromoted { .. } => {
                m.spares_promoted.inc();
            }
            EventKind::MemberLost { reason, .. } => {
                m.members_lost.get_or_create(&ReasonLabels { reason: reason.as_str() }).inc();
            }
            EventKind::LeaseRefreshFailed { .. } => {
                m.lease_refresh_failures.inc();
            }
            EventKind::NodesWaiting { waiting, spares } => {
                m.waiting_nodes.set(gauge(*waiting));
                m.spare_nodes.set(gauge(*spares));
            }
            EventKind::Restart { cause, .. } => {
                m.restarts.get_or_create(&CauseLabels { cause: cause.as_str() }).inc();
            }
            EventKind::WorkerExited { status, .. } => {
                m.worker_exits.get_or_create(&StatusLabels { status: status.clone() }).inc();
            }
            EventKind::HealthCheckFailed { .. } => {
                m.health_check_failures.inc();
            }
            EventKind::Drained { .. } => {
                m.drains.inc();
            }
            EventKind::Excluded { .. } => {
                m.exclusions.inc();
                m.excluded.set(1);
            }
            EventKind::Readmitted { .. } => {
                m.readmissions.inc();
                m.excluded.set(0);
            }
            EventKind::RunClosed { .. } => {}
        }
    }

    /// The handles of one operation kind's metrics, for [`MeteredKv`]'s hot path (no lookup
    /// per call).
    pub(crate) fn operation(&self, op: Op) -> OperationMetrics {
        let m = &*self.inner;
        let op = op_label(op);
        OperationMetrics {
            ok: m.operations.get_or_create_owned(&OpResultLabels { op, result: Outcome::Ok }),
            error: m.operations.get_or_create_owned(&OpResultLabels { op, result: Outcome::Error }),
            duration: m.operation_duration.get_or_create_owned(&OpLabels { op }),
        }
    }
}

impl Inner {
    fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "rdzv_worker_info",
            "The workers counted here: 1 for each run id and node id, with its segment if it has one (join on it to name a series' node)",
            self.worker.clone(),
        );
        r.register_with_unit(
            "rdzv_rendezvous_duration",
            "How long each successful next_rendezvous call took",
            Unit::Seconds,
            self.rendezvous_duration.clone(),
        );
        r.register(
            "rdzv_rounds_formed",
            "Rounds formed with this worker in them",
            self.rounds_formed.clone(),
        );
        r.register(
            "rdzv_round_version",
            "The round this worker was last a member of",
            self.round_version.clone(),
        );
        r.register(
            "rdzv_round_members",
            "The number of members of the round this worker was last a member of",
            self.round_members.clone(),
        );
        r.register(
            "rdzv_members_lost",
            "Rounds of this worker that lost a member, by how it was told (member_gone, ended, lease_lost)",
            self.members_lost.clone(),
        );
        r.register(
            "rdzv_spares_promoted",
            "Rounds this worker joined after waiting as a spare behind a full round",
            self.spares_promoted.clone(),
        );
        r.register(
            "rdzv_waiting_nodes",
            "Nodes waiting that the next round could admit, as the agent last saw them",
            self.waiting_nodes.clone(),
        );
        r.register(
            "rdzv_spare_nodes",
            "Spares waiting behind the full round, as the agent last saw them",
            self.spare_nodes.clone(),
        );
        r.register(
            "rdzv_restarts",
            "Times the agent stopped its workers and re-formed the group, by cause",
            self.restarts.clone(),
        );
        r.register(
            "rdzv_worker_exits",
            "Workers that exited by themselves, by exit code or signal name",
            self.worker_exits.clone(),
        );
        r.register(
            "rdzv_lease_refresh_failures",
            "Refreshes of this worker's session lease that failed (each is retried until the TTL runs out)",
            self.lease_refresh_failures.clone(),
        );
        r.register(
            "rdzv_health_check_failures",
            "Health checks of this worker that failed (while waiting, excluded, or a member)",
            self.health_check_failures.clone(),
        );
        r.register(
            "rdzv_drains",
            "Rounds this worker left because its health check failed health_check_failures times in a row",
            self.drains.clone(),
        );
        r.register(
            "rdzv_exclusions",
            "Times this worker excluded itself from the run (its health check failed)",
            self.exclusions.clone(),
        );
        r.register(
            "rdzv_readmissions",
            "Times this worker's health check passed again after an exclusion",
            self.readmissions.clone(),
        );
        r.register(
            "rdzv_excluded",
            "1 while this worker is excluded by its health check, else 0",
            self.excluded.clone(),
        );
        r.register(
            "rdzv_backend_operations",
            "Backend operations, by kind and result",
            self.operations.clone(),
        );
        r.register_with_unit(
            "rdzv_backend_operation_duration",
            "Latency of backend operations, by kind (a watch until it is open)",
            Unit::Seconds,
            self.operation_duration.clone(),
        );
    }
}

/// The metrics of one operation kind.
#[derive(Clone, Debug)]
pub(crate) struct OperationMetrics {
    pub(crate) ok: Counter,
    pub(crate) error: Counter,
    pub(crate) duration: Histogram,
}

/// A count as a gauge's value (saturating: no count of this crate comes near).
fn gauge(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}
