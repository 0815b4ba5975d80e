//! The world engine of the protocol's property tests, shared by the in-memory run under a
//! paused clock (`protocol_props.rs`) and the runs against real etcd and Redis in real time
//! (`protocol_props_real.rs`).
//!
//! A *world* is a group of workers of one run with random `min ≤ max`, arrival times,
//! keep-alive TTL and last call. Until its *heal time* it is hostile: some workers' links
//! fail calls at random (before the request, or after it took effect with only the answer
//! lost), drop their watches, or are slow; some workers die (their link is cut, no goodbye)
//! or shut down (racing a pending call); the run may be closed. At the heal time every live
//! link becomes clean. From then on the world must be *live*: every worker that stays and
//! keeps calling completes a round within [`healed_bound`] — a timeout is a failure there —
//! and once all have, they all re-enter together and must complete again within
//! [`rerun_bound`]. Every record of the world is then checked against the guarantees
//! (see [`check`]).
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use rdzv_core::{Kv, RendezvousError, RendezvousHandler, RendezvousInfo, RendezvousParams, RoundBroken};
// (`RendezvousParams` is also what the final-state recorder reads the run's keys from.)
use rdzv_core::layer::{FaultyKv, Latency};
use tokio::sync::watch;
use tokio::time::Instant;

/// Every call's deadline. Deliberately far beyond the heal time plus [`healed_bound`]: in a
/// world that has healed, no call may reach its deadline, so any timeout there is a call
/// that stayed stuck after the faults stopped — the class of bug these tests exist to see.
pub const TIMEOUT: Duration = Duration::from_secs(150);
/// How long a `setup` left behind by a creator that failed half-way may block the run: the
/// short lease of its own (5 s) that the protocol gives it.
pub const SETUP_TTL: Duration = Duration::from_secs(5);
/// How long a `frozen` state lives when a member never confirms (`machine/io.rs`, `FROZEN_TTL`).
pub const FROZEN_TTL: Duration = Duration::from_secs(10);
/// The longest retry backoff: 2 s, with up to 100 % jitter on top.
pub const BACKOFF_MAX: Duration = Duration::from_secs(4);
/// How often a member of a round checks `num_nodes_waiting` (the elastic agent's rule:
/// re-enter to admit waiters while the round has room).
pub const AGENT_POLL: Duration = Duration::from_secs(1);
/// Round trips, scheduling and rounding: what a bound allows beyond its named terms.
pub const SLACK: Duration = Duration::from_secs(2);
/// The key count under a run may not exceed `KEYS_PER_WORKER × workers + KEYS_CONSTANT`:
/// a worker owns at most a join key, a keep-alive key and a waiting key of the current
/// round (3), doubled for a round being replaced while the next one forms; the constant
/// covers the run's own keys (state, version counter, run lease) and one round's extra data.
pub const KEYS_PER_WORKER: u64 = 6;
/// See [`KEYS_PER_WORKER`].
pub const KEYS_CONSTANT: u64 = 10;

/// Faults on one worker's link, active until the world heals.
#[derive(Clone, Debug)]
pub struct Faults {
    /// Probability that a call fails with `Unavailable`.
    pub fail_p: f64,
    /// Whether a failed call took effect first (its answer lost) rather than never reaching
    /// the backend.
    pub lost_answers: bool,
    /// Cut every open watch of this worker this often (a flapping connection), if set.
    pub drop_watches_every_ms: Option<u64>,
}

/// What becomes of a worker.
#[derive(Clone, Copy, Debug)]
pub enum Fate {
    /// Stays and keeps calling: re-enters after holding its round a while (before healing),
    /// when told its round broke, when waiters are admitted, and when the world heals.
    Stay,
    /// Dies (link cut, no goodbye, whatever it is doing) this long after arriving.
    DieAt(u64),
    /// Calls `shutdown` this long after arriving, whatever it is doing (possibly racing its
    /// own pending `next_rendezvous`).
    LeaveAt(u64),
}

/// One worker of a world.
#[derive(Clone, Debug)]
pub struct Plan {
    pub arrive_ms: u64,
    pub fate: Fate,
    /// Upper bound of uniform random latency per call, before healing (0: none).
    pub latency_ms: u64,
    pub faults: Option<Faults>,
}

/// A generated world.
#[derive(Clone, Debug)]
pub struct World {
    pub min: usize,
    pub max: usize,
    pub last_call_ms: u64,
    pub ttl_ms: u64,
    /// When every live link becomes clean (0: the world never had faults).
    pub heal_ms: u64,
    pub plans: Vec<Plan>,
    /// When a separate handler closes the run (always before healing).
    pub close_at_ms: Option<u64>,
    /// Whether workers hold a round for `2 × TTL + 3 s` and re-enter, before healing.
    pub hold_ms: u64,
}

impl World {
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    pub fn last_call(&self) -> Duration {
        Duration::from_millis(self.last_call_ms)
    }

    pub fn heal(&self) -> Duration {
        Duration::from_millis(self.heal_ms)
    }

    /// A world without any fault, death, leave or close.
    pub fn calm(&self) -> bool {
        self.close_at_ms.is_none()
            && self
                .plans
                .iter()
                .all(|p| matches!(p.fate, Fate::Stay) && p.faults.is_none() && p.latency_ms == 0)
    }

    /// The workers that stay to the end (nobody stays in a closed run).
    pub fn stayers(&self) -> Vec<usize> {
        if self.close_at_ms.is_some() {
            return Vec::new();
        }
        (0..self.plans.len()).filter(|&i| matches!(self.plans[i].fate, Fate::Stay)).collect()
    }

    /// Whether liveness is owed: enough workers stay to form a round.
    pub fn owes_liveness(&self) -> bool {
        self.stayers().len() >= self.min
    }

    /// How many stayers must complete a round after healing: all of them if they fit in a
    /// round, else `max` (the rest legitimately wait for a member to leave).
    pub fn owed_witnesses(&self) -> usize {
        self.stayers().len().min(self.max)
    }

    fn faulty(&self, worker: usize) -> bool {
        self.plans[worker].faults.is_some() || self.plans[worker].latency_ms > 0
    }
}

/// The longest a stayer that keeps calling may go without completing a round once the world
/// has healed (counted from the heal time, or from its arrival if later). Each term is a wait
/// the protocol may legitimately impose after the last fault:
/// - the keys and `setup` of workers that died before healing expire (TTL, or `setup`'s own
///   lease);
/// - a round frozen with such a worker in it just before its key expired stalls until the
///   frozen lease ends;
/// - a worker may be asleep in a retry backoff;
/// - forming a round takes the last call plus a backup freezer's delay (one TTL), twice:
///   a stayer that arrives as a round freezes without it waits for a member to notice it
///   (one agent poll) and re-enter;
/// - a session lost during the faults is noticed at the next refresh (a TTL at most);
/// - round trips.
pub fn healed_bound(world: &World) -> Duration {
    let ttl = world.ttl();
    ttl.max(SETUP_TTL) + FROZEN_TTL + BACKOFF_MAX + 2 * (world.last_call() + ttl) + AGENT_POLL + ttl + SLACK
}

/// The longest a settled, healthy group may take to complete a round when all its members
/// re-enter together: the last call, one backup freezer's delay, round trips.
pub fn rerun_bound(world: &World) -> Duration {
    world.last_call() + world.ttl() + SLACK
}

/// Ranges of generated worlds.
#[derive(Clone, Debug)]
pub struct Shape {
    pub small: Range<usize>,
    pub medium: Range<usize>,
    pub large: Range<usize>,
    pub ttl_ms: Range<u64>,
    pub last_call_ms: Range<u64>,
    pub heal_ms: Range<u64>,
    pub arrive_ms: Range<u64>,
    /// Probability that a generated world is calm.
    pub calm: f64,
    /// Whether `max` may be below the number of workers (late arrivals wait).
    pub allow_overflow: bool,
    /// Probability that a worker of a hostile world has a faulty link.
    pub faulty: f64,
}

fn faults(rate: f64) -> impl Strategy<Value = Option<Faults>> {
    let some =
        (prop_oneof![Just(0.0), 0.02f64..0.15], any::<bool>(), prop::option::weighted(0.3, 300u64..3000))
            .prop_map(|(fail_p, lost_answers, drop_watches_every_ms)| Faults {
                fail_p,
                lost_answers,
                drop_watches_every_ms,
            });
    prop::option::weighted(rate, some)
}

fn plan(calm: bool, arrive: Range<u64>, faulty: f64) -> BoxedStrategy<Plan> {
    if calm {
        return arrive
            .prop_map(|arrive_ms| Plan { arrive_ms, fate: Fate::Stay, latency_ms: 0, faults: None })
            .boxed();
    }
    let fate = prop_oneof![
        6 => Just(Fate::Stay),
        2 => (0u64..8000).prop_map(Fate::DieAt),
        1 => (0u64..8000).prop_map(Fate::LeaveAt),
    ];
    (arrive, fate, prop_oneof![Just(0u64), 1u64..50], faults(faulty))
        .prop_map(|(arrive_ms, fate, latency_ms, faults)| Plan { arrive_ms, fate, latency_ms, faults })
        .boxed()
}

/// Worlds of the given shape.
pub fn worlds(shape: Shape) -> impl Strategy<Value = World> {
    let n = prop_oneof![6 => shape.small.clone(), 3 => shape.medium.clone(), 1 => shape.large.clone()];
    (n, prop::bool::weighted(shape.calm), prop::bool::weighted(0.4)).prop_flat_map(
        move |(n, calm, sized_to_max)| {
            let shape = shape.clone();
            (1..=n).prop_flat_map(move |min| {
                let max = if !shape.allow_overflow {
                    (n..=n + 2).boxed()
                } else if sized_to_max {
                    (min..=n).boxed()
                } else {
                    (min..=min + 4).boxed()
                };
                let heal = if calm { Just(0u64).boxed() } else { shape.heal_ms.clone().boxed() };
                (
                    Just(min),
                    max,
                    shape.last_call_ms.clone(),
                    shape.ttl_ms.clone(),
                    heal,
                    prop::collection::vec(plan(calm, shape.arrive_ms.clone(), shape.faulty), n),
                    if calm { Just(None).boxed() } else { prop::option::weighted(0.15, 0u64..1000).boxed() },
                )
                    .prop_map(
                        |(min, max, last_call_ms, ttl_ms, heal_ms, mut plans, close)| {
                            // Deaths and leaves happen before healing; a fate that would come later
                            // becomes a stay. Without a heal time there are no faults.
                            for p in &mut plans {
                                if let Fate::DieAt(ms) | Fate::LeaveAt(ms) = p.fate
                                    && p.arrive_ms + ms >= heal_ms
                                {
                                    p.fate = Fate::Stay;
                                }
                            }
                            // The close, if any, comes at a random point of the hostile period.
                            let close_at_ms = close.map(|permille| heal_ms * permille / 1000);
                            World {
                                min,
                                max,
                                last_call_ms,
                                ttl_ms,
                                heal_ms,
                                plans,
                                close_at_ms,
                                hold_ms: 2 * ttl_ms + 3000,
                            }
                        },
                    )
            })
        },
    )
}

/// How a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    Closed,
    Shutdown,
    Timeout,
    Unavailable,
    LeaseLost,
    Other(String),
}

impl From<&RendezvousError> for Failure {
    fn from(e: &RendezvousError) -> Self {
        match e {
            RendezvousError::Closed { .. } => Failure::Closed,
            RendezvousError::Shutdown => Failure::Shutdown,
            RendezvousError::Timeout { .. } => Failure::Timeout,
            RendezvousError::Unavailable(_) => Failure::Unavailable,
            RendezvousError::LeaseLost => Failure::LeaseLost,
            other => Failure::Other(format!("{other:?}")),
        }
    }
}

/// What happened in a world, with times since its start.
// A log of a few thousand records per world: boxing the large call results would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Record {
    Call {
        worker: usize,
        started: Duration,
        returned: Duration,
        result: Result<RendezvousInfo, Failure>,
    },
    /// The world ended, or the worker was killed, while this call was pending: it never
    /// returned, but it began (a member that re-entered no longer holds its round).
    Cancelled {
        worker: usize,
        started: Duration,
        at: Duration,
    },
    Killed {
        worker: usize,
        at: Duration,
    },
    Shutdown {
        worker: usize,
        started: Duration,
        returned: Duration,
        ok: bool,
    },
    Broken {
        worker: usize,
        version: u64,
        at: Duration,
        reason: RoundBroken,
    },
    HandlerFailed {
        worker: usize,
        at: Duration,
        error: String,
    },
    Closed {
        at: Duration,
    },
    /// Every member of the latest round (these workers) was told to re-enter.
    Rerun {
        at: Duration,
        members: Vec<usize>,
    },
    /// A round became final (as the state key showed it, read on a clean link).
    Final {
        at: Duration,
        version: u64,
        participants: Vec<String>,
    },
    /// The coordinator looked for further rounds after the healed world settled: the latest
    /// final round then, and again one settle window later (a livelock forms more).
    Settled {
        at: Duration,
        version: Option<u64>,
    },
    /// The key count under the run.
    Keys {
        at: Duration,
        count: u64,
        workers: usize,
        /// How many keys each part of the run holds (`rdzv/v_<N>/join`, …), to tell a leak.
        by_part: BTreeMap<String, u64>,
    },
    /// The world ended.
    End {
        at: Duration,
    },
}

type Log = Arc<Mutex<Vec<Record>>>;

/// The shared switches of one world.
#[derive(Clone)]
struct Ctl {
    t0: Instant,
    log: Log,
    /// Rerun generation: a member re-enters when it is above its call's.
    rerun: watch::Receiver<u32>,
    end: watch::Receiver<bool>,
}

impl Ctl {
    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn push(&self, r: Record) {
        self.log.lock().unwrap().push(r);
    }
}

async fn ended(mut end: watch::Receiver<bool>) {
    let _ = end.wait_for(|e| *e).await;
}

fn params_for(world: &World, run: &str) -> RendezvousParams {
    let mut p = RendezvousParams::new(run, world.min, world.max).unwrap();
    p.prefix = "/rdzv-props".into();
    p.timeout = TIMEOUT;
    p.last_call_timeout = world.last_call();
    p.keep_alive_ttl = world.ttl();
    p
}

/// Runs one world on `kv` (an empty namespace) under run id `run`, and returns its records.
pub async fn run_world(world: &World, kv: Arc<dyn Kv>, run: &str) -> Vec<Record> {
    let (rerun_tx, rerun) = watch::channel(0u32);
    let (end_tx, end) = watch::channel(false);
    let ctl = Ctl { t0: Instant::now(), log: Arc::default(), rerun, end };
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(record_finals(kv.clone(), params_for(world, run), ctl.clone())));
    for (i, plan) in world.plans.iter().enumerate() {
        let (kv, ctl, world, run, plan) =
            (kv.clone(), ctl.clone(), world.clone(), run.to_string(), plan.clone());
        tasks.push(tokio::spawn(async move { run_worker(i, plan, &world, kv, &run, ctl).await }));
    }
    if let Some(at) = world.close_at_ms {
        let (kv, ctl, params) = (kv.clone(), ctl.clone(), params_for(world, run));
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(ctl.t0 + Duration::from_millis(at)).await;
            let closer = RendezvousHandler::new(kv, params).await.unwrap();
            closer.set_closed().await.unwrap();
            ctl.push(Record::Closed { at: ctl.now() });
            closer.shutdown().await.unwrap();
        }));
    }
    coordinate(world, &kv, run, &ctl, &rerun_tx).await;
    end_tx.send_replace(true);
    ctl.push(Record::End { at: ctl.now() });
    for t in tasks {
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    std::mem::take(&mut *ctl.log.lock().unwrap())
}

/// Records every `final` value of the run's state key until the world ends, reading on the
/// shared, clean backend (watching from a read; a failed watch reads again).
async fn record_finals(kv: Arc<dyn Kv>, params: RendezvousParams, ctl: Ctl) {
    use rdzv_core::KvExt;
    use rdzv_core::kv::{EventKind, WatchScope};
    use rdzv_core::protocol::State;
    let key = rdzv_core::protocol::RunKeys::new(&params.prefix, &params.run_id).state();
    let mut seen = std::collections::BTreeSet::new();
    let mut note = |value: &rdzv_core::kv::Bytes| {
        if let Ok(State::Final { version, participants, .. }) = State::parse(&key, value)
            && seen.insert(version)
        {
            let participants = participants.iter().map(|p| p.node.clone()).collect();
            ctl.push(Record::Final { at: ctl.now(), version, participants });
        }
    };
    loop {
        let Ok(read) = kv.get(&key).await else { return };
        if let Some(kv) = &read.kv {
            note(&kv.value);
        }
        let Ok(mut watch) = kv.watch_from(&key, WatchScope::Key, read.revision + 1).await else { return };
        loop {
            tokio::select! {
                event = watch.next() => match event {
                    Ok(event) if event.kind == EventKind::Put => note(&event.kv.value),
                    Ok(_) => {}
                    Err(_) => break,
                },
                _ = ended(ctl.end.clone()) => return,
            }
        }
    }
}

/// The latest final round recorded so far.
fn latest_final(ctl: &Ctl) -> Option<(u64, Vec<String>)> {
    ctl.log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| match r {
            Record::Final { version, participants, .. } => Some((*version, participants.clone())),
            _ => None,
        })
        .max_by_key(|(version, _)| *version)
}

/// How long a healed group must go without forming a round before it counts as settled: a few
/// agent polls, a rerun's worth of forming, and slack.
pub fn settle_window(world: &World) -> Duration {
    3 * AGENT_POLL + rerun_bound(world) + SLACK
}

/// Waits for the healed world's witnesses, triggers the rerun, waits for its witnesses,
/// checks that the group settles, counts the keys: each stage ends early when done, or at its
/// bound (the check then says what was missing).
async fn coordinate(world: &World, kv: &Arc<dyn Kv>, run: &str, ctl: &Ctl, rerun: &watch::Sender<u32>) {
    let tick = Duration::from_millis(100);
    let heal = world.heal();
    let latest_arrival = world.plans.iter().map(|p| p.arrive_ms).max().unwrap_or(0);
    let stage1_end = heal.max(Duration::from_millis(latest_arrival)) + healed_bound(world) + SLACK;
    let owed = world.owed_witnesses();
    let stayers = world.stayers();
    if !world.owes_liveness() {
        // Nothing is owed: let the hostile period play out, and the deaths be noticed.
        tokio::time::sleep_until(ctl.t0 + heal + world.ttl() + FROZEN_TTL + SLACK).await;
        count_keys(world, kv, run, ctl).await;
        return;
    }
    let witnesses = |log: &[Record], since: Duration| -> usize {
        let done: BTreeSet<usize> = log
            .iter()
            .filter_map(|r| match r {
                Record::Call { worker, result: Ok(_), returned, .. } if *returned >= since => Some(*worker),
                _ => None,
            })
            .filter(|w| stayers.contains(w))
            .collect();
        done.len()
    };
    loop {
        let now = ctl.now();
        if now >= stage1_end || (now >= heal && witnesses(&ctl.log.lock().unwrap(), heal) >= stayers.len()) {
            break;
        }
        tokio::time::sleep(tick).await;
    }
    // Once every owed stayer completed a round, the members re-enter together (spares, if
    // any, are still waiting in their calls).
    if witnesses(&ctl.log.lock().unwrap(), heal) >= owed {
        let at = ctl.now();
        let members: BTreeSet<usize> = latest_final(ctl)
            .map(|(_, nodes)| nodes.iter().filter_map(|n| n.strip_prefix('w')?.parse().ok()).collect())
            .unwrap_or_default();
        ctl.push(Record::Rerun { at, members: members.iter().copied().collect() });
        rerun.send_replace(1);
        let stage2_end = at + rerun_bound(world) + SLACK;
        loop {
            let done = {
                let log = ctl.log.lock().unwrap();
                let started_after: BTreeSet<usize> = log
                    .iter()
                    .filter_map(|r| match r {
                        Record::Call { worker, started, result: Ok(_), .. } if *started >= at => {
                            Some(*worker)
                        }
                        _ => None,
                    })
                    .collect();
                members.is_subset(&started_after)
            };
            if done || ctl.now() >= stage2_end {
                break;
            }
            tokio::time::sleep(tick).await;
        }
        // Settled: agents that re-enter whenever `num_nodes_waiting() > 0` form no further
        // round, however many spares wait.
        tokio::time::sleep(settle_window(world)).await;
        ctl.push(Record::Settled { at: ctl.now(), version: latest_final(ctl).map(|(v, _)| v) });
        tokio::time::sleep(settle_window(world)).await;
        ctl.push(Record::Settled { at: ctl.now(), version: latest_final(ctl).map(|(v, _)| v) });
    }
    count_keys(world, kv, run, ctl).await;
}

async fn count_keys(world: &World, kv: &Arc<dyn Kv>, run: &str, ctl: &Ctl) {
    let root = rdzv_core::protocol::RunKeys::new(&params_for(world, run).prefix, run);
    let options = rdzv_core::kv::RangeOptions { keys_only: true, ..Default::default() };
    if let Ok(read) = kv.range(root.root().as_bytes(), options).await {
        let mut by_part = BTreeMap::new();
        for kv in &read.kvs {
            let key = String::from_utf8_lossy(&kv.key[root.root().len()..]).into_owned();
            // Up to the part inside a round: `rdzv/v_3/join`, `rdzv/v_3/rank_2` → `rdzv/v_3/rank`.
            let part: String = key.split('/').take(3).collect::<Vec<_>>().join("/");
            let part = part.trim_end_matches(|c: char| c.is_ascii_digit()).to_string();
            *by_part.entry(part).or_default() += 1;
        }
        ctl.push(Record::Keys { at: ctl.now(), count: read.count, workers: world.plans.len(), by_part });
    }
}

async fn run_worker(i: usize, plan: Plan, world: &World, kv: Arc<dyn Kv>, run: &str, ctl: Ctl) {
    let arrive = ctl.t0 + Duration::from_millis(plan.arrive_ms);
    let heal_at = ctl.t0 + world.heal();
    tokio::select! {
        _ = tokio::time::sleep_until(arrive) => {}
        _ = ended(ctl.end.clone()) => return,
    }
    let link = FaultyKv::new(kv, 0x5eed ^ i as u64);
    // Whether this worker died: a dead link stays cut after healing.
    let dead = Arc::new(Mutex::new(false));
    if Instant::now() < heal_at {
        if plan.latency_ms > 0 {
            link.set_latency(Latency::Uniform {
                min: Duration::ZERO,
                max: Duration::from_millis(plan.latency_ms),
            });
        }
        if let Some(f) = &plan.faults {
            link.set_failure_probability(f.fail_p);
            link.set_fail_after_applying(f.lost_answers);
            let (link, dead, every) = (link.clone(), dead.clone(), f.drop_watches_every_ms);
            tokio::spawn(async move {
                if let Some(every) = every {
                    let mut tick = tokio::time::interval(Duration::from_millis(every));
                    tick.tick().await;
                    while Instant::now() < heal_at {
                        tokio::select! {
                            _ = tick.tick() => link.drop_open_watches(),
                            _ = tokio::time::sleep_until(heal_at) => {}
                        }
                    }
                }
                tokio::time::sleep_until(heal_at).await;
                let dead = dead.lock().unwrap();
                if !*dead {
                    link.clear();
                }
            });
        } else if plan.latency_ms > 0 {
            let (link, dead) = (link.clone(), dead.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(heal_at).await;
                if !*dead.lock().unwrap() {
                    link.clear();
                }
            });
        }
    }
    let (stop_tx, stop) = watch::channel(false);
    let mut p = params_for(world, run);
    p.node_id = Some(format!("w{i}"));
    let handler = loop {
        if *stop.borrow() || *ctl.end.borrow() {
            return;
        }
        match RendezvousHandler::new(link.clone() as Arc<dyn Kv>, p.clone()).await {
            Ok(h) => break h,
            Err(e) => {
                ctl.push(Record::HandlerFailed { worker: i, at: ctl.now(), error: e.to_string() });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    match plan.fate {
        Fate::Stay => {}
        Fate::DieAt(ms) => {
            let (link, ctl, stop_tx, dead) = (link.clone(), ctl.clone(), stop_tx.clone(), dead.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(arrive + Duration::from_millis(ms)).await;
                *dead.lock().unwrap() = true;
                link.set_failure_probability(1.0);
                link.set_fail_after_applying(false);
                link.drop_open_watches();
                ctl.push(Record::Killed { worker: i, at: ctl.now() });
                stop_tx.send_replace(true);
            });
        }
        Fate::LeaveAt(ms) => {
            let (h, ctl) = (handler.clone(), ctl.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(arrive + Duration::from_millis(ms)).await;
                let started = ctl.now();
                let ok = h.shutdown().await.is_ok();
                ctl.push(Record::Shutdown { worker: i, started, returned: ctl.now(), ok });
            });
        }
    }
    calls(i, world, &handler, &ctl, stop).await;
    if matches!(plan.fate, Fate::DieAt(_)) && *dead.lock().unwrap() {
        // A dead process does not say goodbye.
        std::mem::forget(handler);
    }
}

/// The worker's life: call, hold the round, re-enter; until it dies, leaves, or the world ends.
async fn calls(i: usize, world: &World, h: &RendezvousHandler, ctl: &Ctl, stop: watch::Receiver<bool>) {
    let heal = world.heal();
    let stopped = || ended(stop.clone());
    loop {
        let started = ctl.now();
        let generation = *ctl.rerun.borrow();
        let result = tokio::select! {
            r = h.next_rendezvous() => r,
            _ = stopped() => {
                // Killed in the middle of a call: the call began all the same (without this
                // record the checker took a member that re-entered, and so ended its round,
                // for one still holding the round and owed the news of its end).
                ctl.push(Record::Cancelled { worker: i, started, at: ctl.now() });
                return;
            }
            _ = ended(ctl.end.clone()) => {
                ctl.push(Record::Cancelled { worker: i, started, at: ctl.now() });
                return;
            }
        };
        let returned = ctl.now();
        let info = result.as_ref().ok().cloned();
        let failure = result.as_ref().err().map(Failure::from);
        ctl.push(Record::Call {
            worker: i,
            started,
            returned,
            result: result.map_err(|e| Failure::from(&e)),
        });
        let info = match (info, failure) {
            (Some(info), _) => info,
            (None, Some(Failure::Closed | Failure::Shutdown)) => return,
            (None, _) => {
                // Keep calling, as an agent would.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    _ = stopped() => return,
                    _ = ended(ctl.end.clone()) => return,
                }
            }
        };
        let hold_until = ctl.t0 + returned + Duration::from_millis(world.hold_ms);
        let mut rerun = ctl.rerun.clone();
        loop {
            let healed = ctl.now() >= heal;
            let again = tokio::select! {
                reason = h.round_broken() => {
                    ctl.push(Record::Broken { worker: i, version: info.version, at: ctl.now(), reason });
                    true
                }
                _ = tokio::time::sleep_until(hold_until), if !healed => true,
                // A round from the hostile period: re-enter when the world heals.
                _ = tokio::time::sleep_until(ctl.t0 + heal), if returned < heal => true,
                _ = async { let _ = rerun.wait_for(|g| *g > generation).await; } => true,
                // As the shipped agents do: re-enter whenever nodes wait to be admitted.
                _ = tokio::time::sleep(AGENT_POLL) => {
                    matches!(h.num_nodes_waiting().await, Ok(n) if n > 0)
                }
                _ = stopped() => return,
                _ = ended(ctl.end.clone()) => return,
            };
            if again {
                break;
            }
        }
    }
}

/// A guarantee a world broke.
#[derive(Debug)]
pub struct Violation {
    /// A short name of the property.
    pub property: &'static str,
    pub message: String,
}

macro_rules! ensure {
    ($v:expr, $property:literal, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $v.push(Violation { property: $property, message: format!($($fmt)+) });
        }
    };
}

/// Checks every guarantee on the records of `world`; panics listing the broken ones.
pub fn check(world: &World, records: &[Record]) {
    let broken = violations(world, records);
    if broken.is_empty() {
        return;
    }
    let names: BTreeSet<&str> = broken.iter().map(|v| v.property).collect();
    let mut text = format!("broken: {names:?}\n");
    for name in &names {
        for v in broken.iter().filter(|v| v.property == *name).take(3) {
            text.push_str(&format!("- {}: {}\n", v.property, v.message));
        }
    }
    panic!("{text}");
}

/// Every guarantee `world` broke, by its records. The properties, by name:
/// - `deadline`: every call returns by its deadline (plus slack).
/// - `error-kinds`: a call fails only with `Closed`, `Shutdown`, `Timeout`, or — on a faulty
///   or dead link — `Unavailable`/`LeaseLost`; nothing else (no `State`, no raw backend error).
/// - `healed-calls-succeed`: when enough workers stay to form a round, a call begun after
///   healing never fails (least of all by timing out), and a handler can be made.
/// - `closed-propagates`: calls begun after the close fail with `Closed`; pending ones end
///   within slack of it.
/// - `shutdown-prompt`, `shutdown-cancels-pending-call`: `shutdown()` returns within slack
///   even while a call is pending; that call then fails with `Shutdown` (or `Closed`, when
///   the run was closed at that moment) within slack, and never returns a round after the
///   shutdown began.
/// - `bounds`, `agreement`, `unique-node-ids`, `monotonic`: every returned round has
///   `min ≤ W ≤ max`, the same participants for all its members, unique ranks naming their
///   holders, no node id twice; a worker's rounds strictly increase (it never gets back a
///   round it left).
/// - `completeness`: every participant of a completed round returned it, died, shut down, or
///   its call pending at that moment failed, or was cut by the world's end right after, or —
///   on a faulty link, begun before healing — lost track of the round, which then ended.
/// - `told-why`, `no-false-death`: a member is told why its round ended (never "no round",
///   never "left" unless it shut down), and never that a member is gone while that member,
///   on a clean link, is alive and still holding the round.
/// - `failure-detection`: members on clean links still holding a round are told of a
///   member's death within its TTL, of its leave within slack (a TTL if the leave failed).
/// - `calm-liveness`: in a calm world the first round completes within the last call of the
///   `min`-th arrival.
/// - `healed-liveness`, `rerun-liveness`: see [`healed_bound`] and [`rerun_bound`] (the
///   rerun: the members of the latest round re-enter together; spares keep waiting).
/// - `stable-ranks`: a worker that returned a round and the next final round keeps its rank
///   while it is below the new world size.
/// - `settles`: after the rerun the group forms no further round within two
///   [`settle_window`]s (agents re-enter whenever `num_nodes_waiting() > 0`).
/// - `key-count`: see [`KEYS_PER_WORKER`].
pub fn violations(world: &World, records: &[Record]) -> Vec<Violation> {
    let mut v: Vec<Violation> = Vec::new();
    let ttl = world.ttl();
    let heal = world.heal();
    let node = |w: usize| format!("w{w}");
    let worker_of = |n: &str| n.strip_prefix('w').and_then(|s| s.parse::<usize>().ok());
    let at_of = |f: &dyn Fn(&Record) -> Option<Duration>| records.iter().find_map(f);
    let closed_at = at_of(&|r| match r {
        Record::Closed { at } => Some(*at),
        _ => None,
    });
    let killed_at = |w: usize| {
        at_of(&|r| match r {
            Record::Killed { worker, at } if *worker == w => Some(*at),
            _ => None,
        })
    };
    let shutdown_of = |w: usize| {
        records.iter().find_map(|r| match r {
            Record::Shutdown { worker, started, returned, ok } if *worker == w => {
                Some((*started, *returned, *ok))
            }
            _ => None,
        })
    };
    let end = at_of(&|r| match r {
        Record::End { at } => Some(*at),
        _ => None,
    })
    .expect("the world has an end");
    let calls_of = |w: usize| {
        records.iter().filter_map(move |r| match r {
            Record::Call { worker, started, returned, result } if *worker == w => {
                Some((*started, *returned, result))
            }
            _ => None,
        })
    };

    // Every call's start, including a call still pending when the world ended.
    let starts_of = |w: usize| {
        records.iter().filter_map(move |r| match r {
            Record::Call { worker, started, .. } | Record::Cancelled { worker, started, .. }
                if *worker == w =>
            {
                Some(*started)
            }
            _ => None,
        })
    };

    // Per call: deadline; allowed errors; closed propagation; shutdown is prompt and wins.
    let mut rounds: BTreeMap<u64, Vec<(usize, &RendezvousInfo, Duration)>> = BTreeMap::new();
    let mut versions_of: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for r in records {
        let Record::Call { worker, started, returned, result } = r else { continue };
        let w = *worker;
        ensure!(
            v,
            "deadline",
            *returned - *started <= TIMEOUT + SLACK,
            "worker {w}: a call took {:?}",
            *returned - *started
        );
        match result {
            Err(Failure::Other(e)) => ensure!(v, "error-kinds", false, "worker {w}: unexpected error {e}"),
            Err(Failure::Timeout | Failure::Unavailable | Failure::LeaseLost) if *started >= heal => {
                // After healing, with enough stayers, every call completes.
                ensure!(
                    v,
                    "healed-calls-succeed",
                    !world.owes_liveness(),
                    "worker {w}: a call started at {started:?}, after healing at {heal:?}, failed at {returned:?}: {result:?}"
                );
            }
            Err(Failure::Unavailable | Failure::LeaseLost) => {
                ensure!(
                    v,
                    "error-kinds",
                    world.faulty(w) || killed_at(w).is_some(),
                    "worker {w}: {result:?} on a clean link"
                )
            }
            _ => {}
        }
        if let Some(tc) = closed_at
            && (!world.faulty(w) || *started >= heal)
        {
            if *started > tc + SLACK {
                ensure!(
                    v,
                    "closed-propagates",
                    matches!(result, Err(Failure::Closed | Failure::Shutdown)),
                    "worker {w}: {result:?} in a call started at {started:?}, after the close at {tc:?}"
                );
            } else if *returned > tc {
                ensure!(
                    v,
                    "closed-propagates",
                    *returned <= tc + SLACK,
                    "worker {w}: returned {:?} after the close",
                    *returned - tc
                );
            }
        }
        if let Some((s_started, _, _)) = shutdown_of(w)
            && *returned > s_started
        {
            // A call pending when shutdown started ends promptly, failing; it never joins a
            // round meanwhile.
            ensure!(
                v,
                "shutdown-cancels-pending-call",
                // `Closed` if the run was closed at the same moment: terminal either way.
                matches!(result, Err(Failure::Shutdown | Failure::Closed)),
                "worker {w}: shutdown started at {s_started:?}; its call {started:?}..{returned:?} gave {}",
                brief(r)
            );
            ensure!(
                v,
                "shutdown-cancels-pending-call",
                *returned <= s_started.max(*started) + SLACK,
                "worker {w}: shut down at {s_started:?}, its call returned at {returned:?}"
            );
        }
        if let Ok(info) = result {
            ensure!(
                v,
                "bounds",
                world.min <= info.world_size && info.world_size <= world.max,
                "W = {}",
                info.world_size
            );
            ensure!(v, "bounds", info.participants.len() == info.world_size, "{}", brief(r));
            ensure!(
                v,
                "agreement",
                info.participants.get(info.rank).is_some_and(|p| p.node == node(w)),
                "rank does not name its holder: {}",
                brief(r)
            );
            rounds.entry(info.version).or_default().push((w, info, *returned));
            versions_of.entry(w).or_default().push(info.version);
        }
    }
    for r in records {
        if let Record::HandlerFailed { worker, at, error } = r {
            ensure!(
                v,
                "healed-calls-succeed",
                *at <= heal + SLACK,
                "worker {worker}: no handler at {at:?}, after healing at {heal:?}: {error}"
            );
        }
    }
    for w in 0..world.plans.len() {
        if let Some((started, returned, _)) = shutdown_of(w) {
            ensure!(
                v,
                "shutdown-prompt",
                returned - started <= SLACK,
                "worker {w}: shutdown took {:?}",
                returned - started
            );
        }
    }
    // Agreement: same W and participants; ranks unique; no node id twice.
    for (version, members) in &rounds {
        let first = members[0].1;
        let mut ranks = BTreeSet::new();
        for (worker, info, _) in members {
            ensure!(
                v,
                "agreement",
                info.participants == first.participants,
                "round {version}: participants differ"
            );
            ensure!(
                v,
                "agreement",
                ranks.insert(info.rank),
                "round {version}: rank {} twice (worker {worker})",
                info.rank
            );
        }
        let nodes: BTreeSet<_> = first.participants.iter().map(|p| &p.node).collect();
        ensure!(
            v,
            "unique-node-ids",
            nodes.len() == first.participants.len(),
            "round {version}: a node id twice"
        );
    }
    // Monotonic rounds: a worker never gets a round twice, nor an older one.
    for (worker, versions) in &versions_of {
        ensure!(
            v,
            "monotonic",
            versions.windows(2).all(|w| w[0] < w[1]),
            "worker {worker}: rounds {versions:?}"
        );
    }
    // Completeness: every participant of a completed round returned it, died, left, or its
    // last call begun before the round completed ended in an error or was cut by the end.
    for (version, members) in &rounds {
        let completed = members.iter().map(|(_, _, at)| *at).min().unwrap_or_default();
        for p in members[0].1.participants.iter() {
            let w = worker_of(&p.node).expect("a node id of this world");
            if versions_of.get(&w).is_some_and(|v| v.contains(version))
                || killed_at(w).is_some()
                || shutdown_of(w).is_some()
            {
                continue;
            }
            // The call of `w` pending when the round completed: the last one begun before it
            // (`None` as its result: still pending when the world ended).
            let cancelled = records.iter().filter_map(|r| match r {
                Record::Cancelled { worker, started, .. } if *worker == w => Some((*started, None)),
                _ => None,
            });
            let pending = calls_of(w)
                .map(|(s, _, r)| (s, Some(r)))
                .chain(cancelled)
                .filter(|(s, _)| *s <= completed)
                .max_by_key(|(s, _)| *s);
            let failed = pending.is_some_and(|(_, r)| r.is_some_and(|r| r.is_err()));
            // Frozen in just before the world ended, its call cut before it could return.
            let cut = completed + SLACK >= end && pending.is_some_and(|(_, r)| r.is_none());
            // A fault before healing (a lost answer, a dropped watch) may send a confirmed
            // member back to the start, from where it can no longer see the round if it ended
            // meanwhile; it then goes on to a later one.
            // A round is over once a later one completed, a member was told it broke, or a
            // member re-entered (which ends it).
            let ended = rounds.keys().any(|later| later > version)
                || records.iter().any(|r| matches!(r, Record::Broken { version: b, .. } if b == version))
                || members.iter().any(|(m, _, got)| starts_of(*m).any(|s| s > *got));
            let faulted = world.faulty(w)
                && ended
                && pending.is_some_and(|(s, r)| {
                    s < heal && r.is_none_or(|r| r.as_ref().is_ok_and(|i| i.version > *version))
                });
            ensure!(
                v,
                "completeness",
                failed || cut || faulted,
                "round {version} (completed at {completed:?}) lists worker {w} ({:?}), which never returned it \
                 (its call pending then: {:?}); its history: {:#?}",
                world.plans[w],
                pending.map(|(s, r)| (s, r.map(|r| r.as_ref().map(|i| i.version)))),
                history(records, w)
            );
        }
    }
    // A member waiting on its round is told why it ended, never "no round"; and never that a
    // member is gone when that member is alive, in the round and on a clean link.
    for r in records {
        let Record::Broken { worker, version, at, reason } = r else { continue };
        let left =
            matches!(reason, RoundBroken::Left) && shutdown_of(*worker).is_some_and(|(s, _, _)| s <= *at);
        ensure!(
            v,
            "told-why",
            left || !matches!(reason, RoundBroken::NoRound | RoundBroken::Left),
            "worker {worker}: told {reason:?} at {at:?} about round {version}; its history: {:#?}",
            history(records, *worker)
        );
        if let RoundBroken::MemberGone { rank: Some(rank) } = reason
            && let Some(p) = rounds.get(version).and_then(|m| m[0].1.participants.get(*rank))
        {
            let g = worker_of(&p.node).expect("a node id of this world");
            let went = killed_at(g).is_some_and(|k| k <= *at)
                || shutdown_of(g).is_some_and(|(s, _, _)| s <= *at)
                || starts_of(g).any(|s| {
                    s <= *at
                        && calls_of(g)
                            .any(|(s0, _, r)| s0 < s && r.as_ref().is_ok_and(|i| i.version == *version))
                })
                || !versions_of.get(&g).is_some_and(|v| v.contains(version));
            ensure!(
                v,
                "no-false-death",
                went || world.faulty(g),
                "worker {worker} was told at {at:?} that worker {g} (rank {rank} of round {version}) is gone, \
                 but it was alive and holding the round"
            );
        }
    }
    // Failure detection: members still holding a round are told of a death within TTL, and of
    // a leave within a round trip (a TTL if the leave could not reach the server).
    for w in 0..world.plans.len() {
        let gone_at = match (killed_at(w), shutdown_of(w)) {
            (Some(k), _) => Some((k, k + ttl)),
            (None, Some((s, e, ok))) => Some((s, if ok { e } else { e + ttl })),
            _ => None,
        };
        let Some((gone, deadline)) = gone_at else { continue };
        let bound = deadline + SLACK;
        for (version, members) in &rounds {
            if !members[0].1.participants.iter().any(|p| p.node == node(w)) {
                continue;
            }
            for (j, _, joined) in members {
                if *j == w || world.faulty(*j) || *joined > bound {
                    continue;
                }
                // Only members still holding the round at the bound are owed the news.
                let left_before = starts_of(*j).any(|s| s > *joined && s <= bound)
                    || killed_at(*j).is_some_and(|k| k <= bound)
                    || shutdown_of(*j).is_some_and(|(s, _, _)| s <= bound);
                if left_before || end < bound {
                    continue;
                }
                let told = records.iter().find_map(|r| match r {
                    Record::Broken { worker, version: v, at, .. } if worker == j && v == version => Some(*at),
                    _ => None,
                });
                ensure!(
                    v,
                    "failure-detection",
                    told.is_some_and(|t| t <= bound),
                    "worker {j} (round {version}, since {joined:?}) was told of worker {w}'s end at {gone:?} \
                     only at {told:?}, bound {bound:?}; histories: {:#?} {:#?}",
                    history(records, *j),
                    history(records, w)
                );
            }
        }
    }
    // Liveness in a calm world: the first round completes within the last call plus round
    // trips of the `min`-th arrival.
    if world.calm() && world.plans.len() >= world.min {
        let mut arrivals: Vec<u64> = world.plans.iter().map(|p| p.arrive_ms).collect();
        arrivals.sort();
        let t_min = Duration::from_millis(arrivals[world.min - 1]);
        let first = rounds.values().flatten().map(|(_, _, at)| *at).min();
        let bound = t_min + world.last_call() + SLACK;
        ensure!(
            v,
            "calm-liveness",
            first.is_some_and(|t| t <= bound),
            "first round at {first:?}, bound {bound:?}"
        );
    }
    // Liveness after healing: every stayer completes a round within the bound (all of them if
    // they fit in a round, else at least `max`), then again within the rerun bound.
    if world.owes_liveness() {
        let bound = healed_bound(world);
        let mut late = Vec::new();
        let mut done = 0;
        for &w in &world.stayers() {
            let from = heal.max(Duration::from_millis(world.plans[w].arrive_ms));
            let first = calls_of(w).find_map(|(_, ret, r)| (r.is_ok() && ret >= heal).then_some(ret));
            if first.is_some_and(|t| t <= from + bound) {
                done += 1;
            } else {
                late.push((w, first, from + bound));
            }
        }
        ensure!(
            v,
            "healed-liveness",
            done >= world.owed_witnesses(),
            "after healing at {heal:?}, only {done} of {} stayers completed a round in time \
             (owed {}); late (worker, first round, bound): {late:?}; records:\n{}",
            world.stayers().len(),
            world.owed_witnesses(),
            records.iter().map(brief).collect::<Vec<_>>().join("\n")
        );
        if let Some((rerun_at, members)) = records.iter().find_map(|r| match r {
            Record::Rerun { at, members } => Some((*at, members)),
            _ => None,
        }) {
            let bound = rerun_at + rerun_bound(world);
            for &w in members.iter().filter(|w| world.stayers().contains(w)) {
                let again = calls_of(w).find_map(|(s, ret, r)| (s >= rerun_at && r.is_ok()).then_some(ret));
                ensure!(
                    v,
                    "rerun-liveness",
                    again.is_some_and(|t| t <= bound),
                    "worker {w}: re-entered at {rerun_at:?}, completed again at {again:?}, bound {bound:?}"
                );
            }
        }
    }
    // Stable ranks: a worker that returned a round and the next final round of the run keeps
    // its rank in it while the rank is below the new world size (the survivors of a round keep
    // their ranks; spares and newcomers only fill holes).
    let mut finals: Vec<(u64, &Vec<String>)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Final { version, participants, .. } => Some((*version, participants)),
            _ => None,
        })
        .collect();
    finals.sort_by_key(|(version, _)| *version);
    for pair in finals.windows(2) {
        let ((v1, before), (v2, after)) = (pair[0], pair[1]);
        for (rank, node) in before.iter().enumerate() {
            let w = worker_of(node).expect("a node id of this world");
            let returned = |version| versions_of.get(&w).is_some_and(|vs| vs.contains(&version));
            if !(returned(v1) && returned(v2)) || rank >= after.len() {
                continue;
            }
            ensure!(
                v,
                "stable-ranks",
                after.get(rank) == Some(node),
                "worker {w} was rank {rank} of round {v1} ({before:?}) and is in round {v2} of {} at rank {:?} ({after:?})",
                after.len(),
                after.iter().position(|n| n == node)
            );
        }
    }
    // Settling: once healed, agents that re-enter whenever `num_nodes_waiting() > 0` stop
    // forming rounds, however many workers are beyond `max`.
    let settled: Vec<(Duration, Option<u64>)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Settled { at, version } => Some((*at, *version)),
            _ => None,
        })
        .collect();
    if let [(t1, first), (t2, second)] = settled[..] {
        ensure!(
            v,
            "settles",
            first == second,
            "the healed group formed rounds {first:?} (at {t1:?}) → {second:?} (at {t2:?}) without any fault: a livelock"
        );
    }
    // Bounded key count.
    for r in records {
        if let Record::Keys { at, count, workers, by_part } = r {
            let limit = KEYS_PER_WORKER * *workers as u64 + KEYS_CONSTANT;
            ensure!(
                v,
                "key-count",
                *count <= limit,
                "{count} keys under the run at {at:?} ({workers} workers; limit {limit}): {by_part:?}"
            );
        }
    }
    v
}

/// The records about one worker (and the world's own), one line each, for failure messages.
fn history(records: &[Record], w: usize) -> Vec<String> {
    records
        .iter()
        .filter(|r| match r {
            Record::Call { worker, .. }
            | Record::Cancelled { worker, .. }
            | Record::Killed { worker, .. }
            | Record::Shutdown { worker, .. }
            | Record::Broken { worker, .. }
            | Record::HandlerFailed { worker, .. } => *worker == w,
            _ => true,
        })
        .map(brief)
        .collect()
}

/// One line about a record.
pub fn brief(r: &Record) -> String {
    match r {
        Record::Call { worker, started, returned, result: Ok(info) } => {
            let nodes: Vec<&str> = info.participants.iter().map(|p| p.node.as_str()).collect();
            format!(
                "w{worker} call {started:?}..{returned:?}: round {} rank {} of {nodes:?}",
                info.version, info.rank
            )
        }
        Record::Call { worker, started, returned, result: Err(e) } => {
            format!("w{worker} call {started:?}..{returned:?}: {e:?}")
        }
        other => format!("{other:?}"),
    }
}
