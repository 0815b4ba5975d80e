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

pub mod check;

pub use check::check;

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
/// The pieces of member lists under one round may not exceed `PIECES_PER_WORKER × workers`:
/// in the worlds whose lists go to pieces, a piece holds one member or two; a round holds
/// the list its `frozen` and `final` values share, and the lists of other freeze attempts
/// left to their round until it is forgotten (answers lost, losers that could not delete
/// theirs). Up to 3.5 lists a round were seen in 6,000 worlds; the bound is against leaks
/// (pieces piling up under one round), not a count the protocol promises.
pub const PIECES_PER_WORKER: u64 = 6;

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
    /// The worker's segment (`s<N>`), in a world whose workers name one.
    pub segment: Option<u8>,
    /// The worker's `node_index`, in a world ordered by it (`rank_order=slurm`).
    pub node_index: Option<u64>,
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
    /// Whole segments of this many workers (`segment_size`), in a world whose workers all
    /// name a segment; `min` and `max` are then multiples of it.
    pub segment_size: Option<usize>,
    /// Whether newcomers take ranks by their `node_index` (`rank_order=slurm`), in a world
    /// without segments.
    pub slurm_order: bool,
    /// The workers' `members_inline_bytes`, in the worlds whose member lists go to pieces
    /// (so small that every round's list does: one or two members a piece).
    pub members_inline_bytes: Option<usize>,
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

    /// Whether liveness is owed: enough workers stay to form a round (in whole segments,
    /// with `segment_size`).
    pub fn owes_liveness(&self) -> bool {
        self.admissible(&self.stayers()) >= self.min
    }

    /// How many stayers must complete a round after healing: all of them if they fit in a
    /// round, else `max` (the rest legitimately wait for a member to leave); with
    /// `segment_size`, only those that make whole segments.
    pub fn owed_witnesses(&self) -> usize {
        self.admissible(&self.stayers()).min(self.max)
    }

    /// How many of `workers` a round could take, `max` aside: all of them, or with
    /// `segment_size = K` each segment's workers rounded down to a multiple of `K`.
    pub fn admissible(&self, workers: &[usize]) -> usize {
        let Some(k) = self.segment_size else { return workers.len() };
        let mut by_segment: BTreeMap<Option<u8>, usize> = BTreeMap::new();
        for &w in workers {
            *by_segment.entry(self.plans[w].segment).or_default() += 1;
        }
        by_segment.values().map(|n| n / k * k).sum()
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
            .prop_map(|arrive_ms| Plan {
                arrive_ms,
                fate: Fate::Stay,
                latency_ms: 0,
                faults: None,
                segment: None,
                node_index: None,
            })
            .boxed();
    }
    let fate = prop_oneof![
        6 => Just(Fate::Stay),
        2 => (0u64..8000).prop_map(Fate::DieAt),
        1 => (0u64..8000).prop_map(Fate::LeaveAt),
    ];
    (arrive, fate, prop_oneof![Just(0u64), 1u64..50], faults(faulty))
        .prop_map(|(arrive_ms, fate, latency_ms, faults)| Plan {
            arrive_ms,
            fate,
            latency_ms,
            faults,
            segment: None,
            node_index: None,
        })
        .boxed()
}

/// The segments of a world's `n` workers: in half the worlds none, in the others each worker
/// one of 1–4 labels at random.
fn segments(n: usize) -> impl Strategy<Value = Vec<Option<u8>>> {
    prop_oneof![
        Just(vec![None; n]),
        (1u8..=4).prop_flat_map(move |labels| prop::collection::vec((0..labels).prop_map(Some), n)),
    ]
}

/// The node indexes of a world's `n` workers, for a world ordered by them: each one of
/// `0..n` at random (ties happen, as two nodes of two jobs' lists may say the same), or none.
fn node_indexes(n: usize) -> impl Strategy<Value = Vec<Option<u64>>> {
    prop::collection::vec(prop::option::weighted(0.8, 0..n as u64), n)
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
                    segments(n),
                    prop::option::weighted(0.5, 1usize..=3),
                    prop::option::weighted(0.5, node_indexes(n)),
                    prop::option::weighted(0.5, 1usize..=80),
                )
                    .prop_map(world_from)
            })
        },
    )
}

/// What [`worlds`] draws for one world: min, max, last call, TTL and heal time (ms), the
/// plans, the close (‰ of the hostile period), the segments, the segment size, the node
/// indexes, the members' inline limit.
type Drawn = (
    usize,
    usize,
    u64,
    u64,
    u64,
    Vec<Plan>,
    Option<u64>,
    Vec<Option<u8>>,
    Option<usize>,
    Option<Vec<Option<u64>>>,
    Option<usize>,
);

/// The world that what was drawn makes, its parts made consistent.
fn world_from(drawn: Drawn) -> World {
    let (
        min,
        max,
        last_call_ms,
        ttl_ms,
        heal_ms,
        mut plans,
        close,
        segments,
        whole,
        indexes,
        members_inline_bytes,
    ) = drawn;
    let labelled = segments.iter().all(Option::is_some);
    for (p, segment) in plans.iter_mut().zip(segments) {
        p.segment = segment;
    }
    // Half the worlds without segments are ordered by node index.
    let indexes = indexes.filter(|_| plans.iter().all(|p| p.segment.is_none()));
    let slurm_order = indexes.is_some();
    for (p, index) in plans.iter_mut().zip(indexes.into_iter().flatten()) {
        p.node_index = index;
    }
    // Whole segments in half the labelled worlds: sizes rounded up to multiples of the
    // segment size.
    let segment_size = whole.filter(|_| labelled);
    let (min, max) = match segment_size {
        Some(k) => (min.div_ceil(k) * k, max.div_ceil(k) * k),
        None => (min, max),
    };
    // Deaths and leaves happen before healing; a fate that would come later becomes a stay.
    // Without a heal time there are no faults.
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
        segment_size,
        slurm_order,
        members_inline_bytes,
    }
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
        /// Each participant's segment, by rank.
        segments: Vec<Option<String>>,
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
    if world.slurm_order {
        p.rank_order = rdzv_core::params::RankOrder::Slurm;
    }
    if let Some(bytes) = world.members_inline_bytes {
        p.members_inline_bytes = bytes;
    }
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
    // Recorded before the workers hear of it: a worker that ends drops its handler, whose
    // lease is revoked, and the others are told of that; the record must come first.
    ctl.push(Record::End { at: ctl.now() });
    end_tx.send_replace(true);
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
    let keys = rdzv_core::protocol::RunKeys::new(&params.prefix, &params.run_id);
    let key = keys.state();
    let mut seen = std::collections::BTreeSet::new();
    loop {
        let Ok(read) = kv.get(&key).await else { return };
        if let Some(found) = &read.kv {
            note_final(&*kv, &keys, found, &mut seen, &ctl).await;
        }
        let Ok(mut watch) = kv.watch_from(&key, WatchScope::Key, read.revision + 1).await else { return };
        loop {
            tokio::select! {
                event = watch.next() => match event {
                    Ok(event) if event.kind == EventKind::Put => note_final(&*kv, &keys, &event.kv, &mut seen, &ctl).await,
                    Ok(_) => {}
                    Err(_) => break,
                },
                _ = ended(ctl.end.clone()) => return,
            }
        }
    }
}

/// Records the state value `found` if it is a `final` round not `seen` yet (its member list
/// read from its pieces where it names them).
async fn note_final(
    kv: &dyn Kv,
    keys: &rdzv_core::protocol::RunKeys,
    found: &rdzv_core::kv::KeyValue,
    seen: &mut std::collections::BTreeSet<u64>,
    ctl: &Ctl,
) {
    use rdzv_core::protocol::State;
    if let Ok(State::Final { version, participants, .. }) = State::read(kv, keys, found).await
        && seen.insert(version)
    {
        let segments = participants.iter().map(|p| p.segment.clone()).collect();
        let participants = participants.iter().map(|p| p.node.clone()).collect();
        ctl.push(Record::Final { at: ctl.now(), version, participants, segments });
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
    p.segment = plan.segment.map(|s| format!("s{s}"));
    p.segment_size = world.segment_size;
    p.node_index = plan.node_index;
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
