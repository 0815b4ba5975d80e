//! What happened to a worker, as it happens: rounds formed, members lost, spares promoted,
//! the run closed, lease refreshes that failed — and, reported by an agent built on the
//! handler (`rdzv run`), restarts, worker exits and nodes waiting.
//!
//! Subscribe with [`RendezvousHandler::on_event`](crate::RendezvousHandler::on_event); nothing
//! is built or reported while nobody subscribes. Each [`Event`] carries its time, run id and
//! node id, and is one JSON object per line with [`Event::json_line`] (the format of
//! `rdzv run --events`, documented in docs/OBSERVABILITY.md).
//!
//! ```
//! use rdzv_core::RendezvousHandler;
//! use rdzv_core::events::EventKind;
//!
//! /// Logs every event of `worker` as a JSON line, and each lost member in words.
//! fn log_events(worker: &RendezvousHandler) {
//!     worker.on_event(|event| {
//!         eprintln!("{}", event.json_line());
//!         if let EventKind::MemberLost { version, reason, .. } = &event.kind {
//!             eprintln!("round {version} lost a member ({})", reason.as_str());
//!         }
//!     });
//! }
//! ```

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::kv::LeaseId;
use crate::rendezvous::RunOutcome;

/// One thing that happened to a worker: when, to which worker of which run, and what.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// When it happened (the wall clock of the worker's machine).
    pub time: SystemTime,
    /// The run.
    pub run_id: Arc<str>,
    /// The worker's node id.
    pub node: Arc<str>,
    /// The worker's segment, if it named one (the `segment` option).
    pub segment: Option<Arc<str>>,
    /// What happened.
    pub kind: EventKind,
}

/// What happened. Serialized with its name as `"event"` and its fields beside it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// A round formed with this worker in it (`next_rendezvous` returned it).
    RoundFormed {
        /// The round.
        version: u64,
        /// This worker's rank in it.
        rank: usize,
        /// The number of members.
        world_size: usize,
        /// The round the changes are counted from (`None`: this worker's first round).
        previous_version: Option<u64>,
        /// This worker's rank there (`None`: it was no member of it).
        previous_rank: Option<usize>,
        /// Ranks of that round whose members are not in this one.
        left: Arc<[usize]>,
        /// Ranks of this round whose members were not in that one.
        joined: Arc<[usize]>,
        /// How long `next_rendezvous` took, in seconds.
        seconds: f64,
    },
    /// This worker waited as a spare behind a full round, and a round formed with it in
    /// (reported right after its [`RoundFormed`](EventKind::RoundFormed)).
    SparePromoted {
        /// The round it is a member of now.
        version: u64,
        /// Its rank there (the rank of a member that is gone, as a rule).
        rank: usize,
        /// The full round it waited behind.
        waited_behind: u64,
    },
    /// The round this worker is a member of lost a member: it is over, and must re-form.
    MemberLost {
        /// The round.
        version: u64,
        /// How it was told.
        reason: LostReason,
        /// The rank of the member gone, when known (this worker's own, for `lease_lost`).
        rank: Option<usize>,
        /// That member's node id, when known (`node` is the reporting worker's).
        member: Option<String>,
        /// How long after the round formed it was seen, in seconds.
        after_seconds: f64,
    },
    /// The run was closed, reported once by each worker that learns it: by closing it itself
    /// (`by_this_worker`), by finding it closed when it tried, or by its round's monitor
    /// seeing it closed while it was a member (then the outcome is not known here).
    RunClosed {
        /// How the job ended, if the closer said so and this worker knows.
        outcome: Option<RunOutcome>,
        /// Whether this worker's write closed it.
        by_this_worker: bool,
    },
    /// Refreshing this worker's session lease failed; it is tried again until its TTL runs
    /// out (then the lease is lost: a [`MemberLost`](EventKind::MemberLost) with
    /// `lease_lost` while in a round).
    LeaseRefreshFailed {
        /// The lease.
        lease: LeaseId,
        /// What went wrong.
        error: String,
    },
    /// The number of nodes waiting for the next round changed, as an agent saw it while its
    /// round ran (reported by the agent).
    NodesWaiting {
        /// The waiting nodes the next round could admit.
        waiting: usize,
        /// The spares beyond them, which only a member's departure admits.
        spares: usize,
    },
    /// An agent stops its workers and re-forms the group (reported by the agent).
    Restart {
        /// Why.
        cause: RestartCause,
        /// Whether it counts against the restarts allowed (admitting waiting nodes and a
        /// lost lease do not).
        counted: bool,
        /// Restarts counted so far, this one included.
        count: u32,
        /// Restarts allowed.
        max_restarts: u32,
        /// The agent's words for it.
        reason: String,
    },
    /// A health check of this worker failed (reported by the `rdzv` facade's health gate,
    /// docs/PROTOCOL.md "Health gates").
    HealthCheckFailed {
        /// The check's own words: exit status or timeout, and the last lines of its output.
        reason: String,
        /// Failed checks in a row, this one included.
        consecutive: u32,
        /// The running round this worker is a member of, if any (`None`: it was waiting to
        /// join, or excluded).
        member_of: Option<u64>,
    },
    /// This worker left its running round because its health check failed
    /// `health_check_failures` times in a row: its session was given up, so the others saw
    /// it gone at once. Followed by an [`Excluded`](EventKind::Excluded).
    Drained {
        /// The round it left.
        version: u64,
        /// Its rank there.
        rank: usize,
        /// The last failed check's words.
        reason: String,
    },
    /// This worker recorded itself as excluded from the run (its health check failed): it
    /// joins no round, and is no waiting node, until the check passes. Reported once per
    /// exclusion.
    Excluded {
        /// The failed check's words.
        reason: String,
    },
    /// This worker's health check passed again: its exclusion record is gone and it joins.
    Readmitted {
        /// How long it was excluded, in seconds.
        excluded_seconds: f64,
    },
    /// One of an agent's workers exited by itself (reported by the agent; workers the agent
    /// stops are not reported).
    WorkerExited {
        /// Its global rank.
        rank: usize,
        /// Its local rank.
        local_rank: usize,
        /// Its exit code, or the name of the signal that ended it (`SIGKILL`, `SIG64`).
        status: String,
    },
}

/// How a member's loss was told ([`EventKind::MemberLost`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    /// A member's keep-alive key vanished: it died (its lease expired) or left.
    MemberGone,
    /// The round's state was replaced: a member left or died, and a waiting or leaving worker
    /// ended the round.
    Ended,
    /// This worker's own session lease was lost: it is no member any more.
    LeaseLost,
}

impl LostReason {
    /// Every reason.
    pub const ALL: [LostReason; 3] = [LostReason::MemberGone, LostReason::Ended, LostReason::LeaseLost];

    /// The name in events and metric labels (`member_gone`, `ended`, `lease_lost`).
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::MemberGone => "member_gone",
            LostReason::Ended => "ended",
            LostReason::LeaseLost => "lease_lost",
        }
    }
}

/// Why an agent re-forms the group ([`EventKind::Restart`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartCause {
    /// A worker of this node failed.
    WorkerFailure,
    /// A worker of another node failed.
    PeerFailure,
    /// A member of the round is gone (or the round ended, or closed before every node
    /// finished).
    MemberLost,
    /// Nodes wait to be admitted (no restart counted).
    AdmitWaiting,
    /// This node's session lease was lost (no restart counted).
    LeaseLost,
    /// This node failed its health check and left the round (no restart counted).
    Unhealthy,
    /// Anything else (the nodes could not agree on their ranks).
    Other,
}

impl RestartCause {
    /// Every cause.
    pub const ALL: [RestartCause; 7] = [
        RestartCause::WorkerFailure,
        RestartCause::PeerFailure,
        RestartCause::MemberLost,
        RestartCause::AdmitWaiting,
        RestartCause::LeaseLost,
        RestartCause::Unhealthy,
        RestartCause::Other,
    ];

    /// The name in events and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartCause::WorkerFailure => "worker_failure",
            RestartCause::PeerFailure => "peer_failure",
            RestartCause::MemberLost => "member_lost",
            RestartCause::AdmitWaiting => "admit_waiting",
            RestartCause::LeaseLost => "lease_lost",
            RestartCause::Unhealthy => "unhealthy",
            RestartCause::Other => "other",
        }
    }
}

impl EventKind {
    /// The event's name (`round_formed`, `member_lost`, …), as in its JSON.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::RoundFormed { .. } => "round_formed",
            EventKind::SparePromoted { .. } => "spare_promoted",
            EventKind::MemberLost { .. } => "member_lost",
            EventKind::RunClosed { .. } => "run_closed",
            EventKind::LeaseRefreshFailed { .. } => "lease_refresh_failed",
            EventKind::NodesWaiting { .. } => "nodes_waiting",
            EventKind::Restart { .. } => "restart",
            EventKind::WorkerExited { .. } => "worker_exited",
            EventKind::HealthCheckFailed { .. } => "health_check_failed",
            EventKind::Drained { .. } => "drained",
            EventKind::Excluded { .. } => "excluded",
            EventKind::Readmitted { .. } => "readmitted",
        }
    }
}

/// The JSON form of an event: its time first, then who, then what.
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    run_id: &'a str,
    node: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    segment: Option<&'a str>,
    #[serde(flatten)]
    kind: &'a EventKind,
}

impl Event {
    /// The event as one JSON object, without a newline: `time` (RFC 3339, UTC, to the
    /// millisecond), `run_id`, `node`, `segment` (only when the worker has one), `event` (its
    /// [name](EventKind::name)), and its fields.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use rdzv_core::events::{Event, EventKind};
    ///
    /// let event = Event {
    ///     time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
    ///     run_id: "job".into(),
    ///     node: "n1".into(),
    ///     segment: None,
    ///     kind: EventKind::SparePromoted { version: 4, rank: 1, waited_behind: 3 },
    /// };
    /// assert_eq!(
    ///     event.json_line(),
    ///     r#"{"time":"2023-11-14T22:13:20.250Z","run_id":"job","node":"n1","event":"spare_promoted","version":4,"rank":1,"waited_behind":3}"#
    /// );
    /// ```
    pub fn json_line(&self) -> String {
        let line = Line {
            time: humantime::format_rfc3339_millis(self.time).to_string(),
            run_id: &self.run_id,
            node: &self.node,
            segment: self.segment.as_deref(),
            kind: &self.kind,
        };
        // Every field serializes (strings, numbers, lists): this cannot fail.
        serde_json::to_string(&line)
            .unwrap_or_else(|e| format!(r#"{{"event":"unserializable","error":"{e}"}}"#))
    }
}

/// A subscriber: called with each event on the thread that reports it.
pub(crate) type Subscriber = Arc<dyn Fn(&Event) + Send + Sync>;

/// The subscribers of one worker, and who it is (stamped on each event).
pub(crate) struct Subscribers {
    run_id: Arc<str>,
    node: Arc<str>,
    segment: Option<Arc<str>>,
    list: RwLock<Vec<Subscriber>>,
}

impl Subscribers {
    pub(crate) fn new(run_id: &str, node: &str, segment: Option<&str>) -> Subscribers {
        Subscribers {
            run_id: run_id.into(),
            node: node.into(),
            segment: segment.map(Into::into),
            list: RwLock::new(Vec::new()),
        }
    }

    pub(crate) fn add(&self, subscriber: Subscriber) {
        self.list.write().unwrap_or_else(|p| p.into_inner()).push(subscriber);
    }

    /// Reports the event `kind` builds, stamped now, to every subscriber; builds nothing
    /// when nobody listens.
    pub(crate) fn emit(&self, kind: impl FnOnce() -> EventKind) {
        // Cloned out of the lock: a subscriber that subscribes another must not deadlock.
        let list = self.list.read().unwrap_or_else(|p| p.into_inner()).clone();
        if list.is_empty() {
            return;
        }
        let event = Event {
            time: SystemTime::now(),
            run_id: self.run_id.clone(),
            node: self.node.clone(),
            segment: self.segment.clone(),
            kind: kind(),
        };
        for subscriber in &list {
            subscriber(&event);
        }
    }
}

impl std::fmt::Debug for Subscribers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.list.read().map_or(0, |l| l.len());
        f.debug_struct("Subscribers").field("node", &self.node).field("subscribers", &count).finish()
    }
}

/// Seconds as a JSON-friendly number (milliseconds are plenty for what events tell).
pub(crate) fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_names_itself_as_its_json_does() {
        let kinds = [
            EventKind::RoundFormed {
                version: 2,
                rank: 0,
                world_size: 2,
                previous_version: Some(1),
                previous_rank: None,
                left: Arc::from([1usize]),
                joined: Arc::from([]),
                seconds: 0.25,
            },
            EventKind::SparePromoted { version: 2, rank: 1, waited_behind: 1 },
            EventKind::MemberLost {
                version: 2,
                reason: LostReason::MemberGone,
                rank: Some(1),
                member: Some("b".into()),
                after_seconds: 3.5,
            },
            EventKind::RunClosed { outcome: Some(RunOutcome::Failed), by_this_worker: true },
            EventKind::LeaseRefreshFailed { lease: 7, error: "unreachable".into() },
            EventKind::NodesWaiting { waiting: 1, spares: 2 },
            EventKind::Restart {
                cause: RestartCause::PeerFailure,
                counted: true,
                count: 1,
                max_restarts: 3,
                reason: "rank 0 failed".into(),
            },
            EventKind::WorkerExited { rank: 3, local_rank: 1, status: "SIGKILL".into() },
            EventKind::HealthCheckFailed { reason: "status 1".into(), consecutive: 2, member_of: Some(2) },
            EventKind::Drained { version: 2, rank: 1, reason: "status 1".into() },
            EventKind::Excluded { reason: "status 1".into() },
            EventKind::Readmitted { excluded_seconds: 30.5 },
        ];
        for kind in kinds {
            let event = Event {
                time: SystemTime::UNIX_EPOCH,
                run_id: "r".into(),
                node: "n".into(),
                segment: None,
                kind,
            };
            let line = event.json_line();
            let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object");
            assert_eq!(v["event"], event.kind.name(), "{line}");
            assert_eq!(
                (v["time"].as_str(), v["run_id"].as_str(), v["node"].as_str()),
                (Some("1970-01-01T00:00:00.000Z"), Some("r"), Some("n"))
            );
            assert!(!line.contains('\n'));
        }
    }

    #[test]
    fn the_fields_are_spelled_as_documented() {
        let event = Event {
            time: SystemTime::UNIX_EPOCH,
            run_id: "r".into(),
            node: "n".into(),
            segment: Some("rack1".into()),
            kind: EventKind::MemberLost {
                version: 2,
                reason: LostReason::MemberGone,
                rank: Some(1),
                member: Some("b".into()),
                after_seconds: 3.5,
            },
        };
        let v: serde_json::Value = serde_json::from_str(&event.json_line()).expect("JSON");
        assert_eq!(v["reason"], "member_gone");
        assert_eq!(
            (v["rank"].as_u64(), v["member"].as_str(), v["node"].as_str()),
            (Some(1), Some("b"), Some("n"))
        );
        assert_eq!(v["after_seconds"], 3.5);
        assert_eq!(v["segment"], "rack1");
        let closed = EventKind::RunClosed { outcome: Some(RunOutcome::Succeeded), by_this_worker: false };
        let v = serde_json::to_value(&closed).expect("JSON");
        assert_eq!((v["outcome"].as_str(), v["by_this_worker"].as_bool()), (Some("succeeded"), Some(false)));
    }

    #[test]
    fn nothing_is_built_without_a_subscriber_and_each_gets_every_event() {
        let subs = Subscribers::new("r", "n", None);
        subs.emit(|| panic!("built without a subscriber"));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        for _ in 0..2 {
            let seen = seen.clone();
            subs.add(Arc::new(move |e: &Event| seen.lock().expect("lock").push(e.kind.name())));
        }
        subs.emit(|| EventKind::NodesWaiting { waiting: 1, spares: 0 });
        assert_eq!(*seen.lock().expect("lock"), ["nodes_waiting", "nodes_waiting"]);
    }
}
