//! Property tests of the protocol's state machine driven directly — no tokio runtime, no
//! backend: a small synchronous model of the store answers each machine's actions, and
//! proptest chooses the interleaving of the workers, the sizing, and which write answers
//! are lost (the write happens, the worker is told it failed), and whether the backend counts
//! keys at a past revision. Whatever the schedule: the
//! round forms with `min(N, max)` members, all agree on it, ranks are `0..W`, nobody returns
//! a round it is not in, and every worker beyond `max` is left waiting as a late arrival.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use rdzv_core::kv::{
    CountedCreate, DeleteMode, DeleteOutcome, EventKind, KeyValue, LeaseId, PutMode, PutOutcome, Revision,
};
use rdzv_core::params::RankOrder;
use rdzv_core::protocol::Candidate;
use rdzv_core::protocol::Joiner;
use rdzv_core::protocol::RunKeys;
use rdzv_core::protocol::Sizing;
use rdzv_core::protocol::{Action, Bind, Call, Completed, Input, Machine, Observed};
use rdzv_core::protocol::{Forgotten, record_after, rounds_to_forget};
use rdzv_core::{KvError, Participant, RendezvousError};
use tokio::time::Instant;

/// The run lease of the model: never expires.
const RUN_LEASE: LeaseId = 1;

/// A synchronous store with revisions, leases (as ids only) and a full event history.
#[derive(Default)]
struct Model {
    revision: Revision,
    keys: BTreeMap<Vec<u8>, KeyValue>,
    history: Vec<(Revision, EventKind, KeyValue)>,
    next_lease: LeaseId,
}

impl Model {
    fn put(&mut self, key: &[u8], value: &[u8], mode: PutMode, lease: Option<LeaseId>) -> PutOutcome {
        let current = self.keys.get(key).cloned();
        let ok = match (mode, &current) {
            (PutMode::Overwrite, _) => true,
            (PutMode::Create, current) => current.is_none(),
            (PutMode::Update(revision), Some(kv)) => kv.mod_revision == revision,
            (PutMode::Update(_), None) => false,
        };
        if !ok {
            return PutOutcome::Conflict { current };
        }
        self.revision += 1;
        let kv = KeyValue {
            key: key.to_vec(),
            value: value.to_vec().into(),
            create_revision: current.as_ref().map_or(self.revision, |kv| kv.create_revision),
            mod_revision: self.revision,
            version: current.as_ref().map_or(1, |kv| kv.version + 1),
            lease,
        };
        self.keys.insert(key.to_vec(), kv.clone());
        self.history.push((self.revision, EventKind::Put, kv.clone()));
        PutOutcome::Written { revision: self.revision, create_revision: kv.create_revision }
    }

    fn delete(&mut self, key: &[u8], mode: DeleteMode) -> DeleteOutcome {
        let Some(kv) = self.keys.get(key) else {
            return match mode {
                DeleteMode::Any => DeleteOutcome::Missing,
                DeleteMode::IfRevision(_) => DeleteOutcome::Conflict { current: None },
            };
        };
        if let DeleteMode::IfRevision(revision) = mode
            && kv.mod_revision != revision
        {
            return DeleteOutcome::Conflict { current: Some(kv.clone()) };
        }
        let mut gone = self.keys.remove(key).expect("present");
        self.revision += 1;
        gone.mod_revision = self.revision;
        gone.version = 0;
        self.history.push((self.revision, EventKind::Delete, gone));
        DeleteOutcome::Deleted { revision: self.revision }
    }

    /// How many keys under `prefix` existed at revision `at`, from the history.
    fn count_at(&self, prefix: &[u8], at: Revision) -> u64 {
        let mut alive = BTreeMap::new();
        for (_, kind, kv) in self.history.iter().filter(|(revision, ..)| *revision <= at) {
            if kv.key.starts_with(prefix) {
                alive.insert(kv.key.clone(), *kind == EventKind::Put);
            }
        }
        alive.values().filter(|&&alive| alive).count() as u64
    }

    fn under(&self, prefix: &[u8]) -> impl Iterator<Item = &KeyValue> {
        self.keys.values().filter(move |kv| kv.key.starts_with(prefix))
    }

    /// The first event at or after `from` on `key` (or under it, as a prefix).
    fn event(&self, key: &[u8], prefix: bool, from: Revision) -> Option<(Revision, EventKind, KeyValue)> {
        self.history
            .iter()
            .find(|(revision, _, kv)| {
                *revision >= from && if prefix { kv.key.starts_with(key) } else { kv.key == key }
            })
            .cloned()
    }
}

/// One worker: its machine, the action it is to perform, and its watches (as cursors).
struct Worker {
    machine: Machine,
    session: LeaseId,
    action: Option<Action>,
    states_from: Option<Revision>,
    prefix: Option<(Vec<u8>, Revision)>,
    outcome: Option<Result<Completed, String>>,
}

struct World {
    model: Model,
    /// Every count at a past revision fails (that revision compacted away).
    past_counts_fail: bool,
    /// How many counts of live keys up to a create revision the workers asked for.
    live_counts: usize,
    keys: RunKeys,
    workers: Vec<Worker>,
    base: Instant,
    now: Duration,
}

impl World {
    /// `count_at_revision`: whether the backend of the model counts at a past revision;
    /// `counted_create`: whether it counts creations in a tally.
    /// `segments`: each worker's segment (a worker beyond the list has none).
    fn new(
        n: usize,
        sizing: Sizing,
        count_at_revision: bool,
        counted_create: bool,
        segments: &[Option<String>],
    ) -> World {
        let keys = RunKeys::new("/t", "job");
        let base = Instant::now();
        let mut model = Model { next_lease: 100, ..Model::default() };
        let workers = (0..n)
            .map(|i| {
                model.next_lease += 1;
                let me = Participant {
                    node: format!("n{i}"),
                    addr: "h".into(),
                    pid: i as u32,
                    port: Some(1000),
                    segment: segments.get(i).cloned().flatten(),
                };
                let session = model.next_lease;
                let mut machine = Machine::new(Call {
                    me,
                    session,
                    keys: keys.clone(),
                    sizing,
                    count_at_revision,
                    counted_create,
                    retired: Vec::new(),
                    run_id: "job".into(),
                    started: base,
                    leave_first: None,
                    leaving: None,
                    last: None,
                    since: None,
                    node_index: None,
                });
                let action = Some(machine.start());
                Worker { machine, session, action, states_from: None, prefix: None, outcome: None }
            })
            .collect();
        World { model, past_counts_fail: false, live_counts: 0, keys, workers, base, now: Duration::ZERO }
    }

    /// The input answering worker `i`'s pending action now, or `None` if it must wait.
    /// `lose` makes a write happen but answer as failed (a lost answer).
    fn answer(&mut self, i: usize, lose: bool) -> Option<Input> {
        let now = self.base + self.now;
        let state_key = self.keys.state();
        let w = &mut self.workers[i];
        let model = &mut self.model;
        let action = w.action.as_ref()?;
        let input = match action {
            Action::ReadState => Input::State(
                Observed::from_kv(model.keys.get(&state_key).cloned(), Some(model.revision))
                    .expect("valid state"),
            ),
            Action::WatchState { from } => {
                w.states_from = Some(*from);
                Input::Ack
            }
            Action::WatchPrefix { prefix, from } => {
                w.prefix = Some((prefix.clone(), *from));
                Input::Ack
            }
            Action::Await { until, prefix } => {
                if !prefix {
                    w.prefix = None;
                }
                let state = w.states_from.and_then(|from| model.event(&state_key, false, from));
                let under = w.prefix.as_ref().and_then(|(p, from)| model.event(p, true, *from));
                let state_first = match (&state, &under) {
                    (Some(s), Some(u)) => s.0 <= u.0,
                    (Some(_), None) => true,
                    _ => false,
                };
                match (state, under) {
                    (Some(s), _) if state_first => {
                        w.states_from = Some(s.0 + 1);
                        Input::State(match s.1 {
                            EventKind::Put => Observed::from_kv(Some(s.2), Some(s.0)).expect("valid state"),
                            EventKind::Delete => Observed::absent(s.0),
                        })
                    }
                    (_, Some(u)) if !state_first => {
                        if let Some((_, from)) = w.prefix.as_mut() {
                            *from = u.0 + 1;
                        }
                        Input::KeyEvent { kind: u.1, created: u.2.version == 1 }
                    }
                    _ => match until {
                        Some(at) if *at <= now => Input::Timer,
                        _ => return None,
                    },
                }
            }
            Action::Put { .. } | Action::PutState { .. } => {
                let (key, value, mode, bind) = match action {
                    Action::Put { key, value, mode, bind } => (key, value.clone(), mode, bind),
                    // This model keeps every member list whole.
                    Action::PutState { key, state, mode, bind } => (key, state.to_bytes(), mode, bind),
                    _ => unreachable!("matched above"),
                };
                let value = &value;
                let lease = match bind {
                    Bind::Session => w.session,
                    Bind::RunLease => RUN_LEASE,
                    Bind::Fresh(_) => {
                        model.next_lease += 1;
                        model.next_lease
                    }
                };
                let outcome = model.put(key, value, *mode, Some(lease));
                if lose { Input::Failed(lost()) } else { Input::Put(outcome, Some(lease)) }
            }
            Action::CreateCounted { key, value, tally, tally_lease } => {
                let outcome = model.put(key, value, PutMode::Create, Some(w.session));
                let counted = outcome.is_written().then(|| {
                    let before = model.keys.get(tally).map_or(0, |kv| kv.version);
                    model.put(tally, b"", PutMode::Overwrite, *tally_lease);
                    before as u64 + 1
                });
                if lose {
                    Input::Failed(lost())
                } else {
                    Input::Counted(CountedCreate { outcome, tally: counted })
                }
            }
            Action::CountAtRevision { .. } if self.past_counts_fail => {
                Input::Failed(RendezvousError::Backend(KvError::Compacted { requested: 1, oldest: 2 }))
            }
            Action::CountAtRevision { prefix, revision } => Input::Count(model.count_at(prefix, *revision)),
            Action::Count { prefix, created_up_to } => {
                self.live_counts += usize::from(created_up_to.is_some());
                Input::Count(
                    model
                        .under(prefix)
                        .filter(|kv| created_up_to.is_none_or(|up_to| kv.create_revision <= up_to))
                        .count() as u64,
                )
            }
            Action::ReadJoiners { prefix } => {
                let mut all: Vec<&KeyValue> = model.under(prefix).collect();
                all.sort_by_key(|kv| kv.create_revision);
                let candidates = all
                    .iter()
                    .map(|kv| Candidate {
                        joiner: Joiner::parse(&kv.key, &kv.value).expect("valid descriptor"),
                        created: kv.create_revision,
                    })
                    .collect();
                Input::Joiners(candidates, model.revision)
            }
            Action::ReadMembers { prefix } => Input::Members(
                model
                    .under(prefix)
                    .map(|kv| Participant::parse(&kv.key, &kv.value).expect("valid descriptor"))
                    .collect(),
            ),
            Action::Get { key } => Input::Key(model.keys.get(key).cloned()),
            // The model's workers are all alive (none restarts with an old node id).
            Action::ProcessAlive { .. } => Input::Alive(true),
            Action::Delete { key, mode } => Input::Deleted(model.delete(key, *mode)),
            Action::AwaitDelete { key, .. } => {
                if model.keys.contains_key(key) {
                    return None;
                }
                Input::Ack
            }
            Action::ForgetRounds { version, previous, .. } => {
                // What `forget.rs` does in the background, done at once.
                let record_key = self.keys.forgotten();
                let record = model.keys.get(&record_key).and_then(|kv| Forgotten::parse(&kv.value));
                for old in rounds_to_forget(*version, Some(*previous), record) {
                    let prefix = self.keys.round(old).into_bytes();
                    let doomed: Vec<Vec<u8>> = model.under(&prefix).map(|kv| kv.key.clone()).collect();
                    for key in doomed {
                        model.delete(&key, DeleteMode::Any);
                    }
                }
                let record = record_after(*version, *previous).to_bytes();
                model.put(&record_key, &record, PutMode::Overwrite, None);
                Input::Ack
            }
            Action::Backoff => Input::Timer,
            Action::Done(_) | Action::Fail(_) => return None,
        };
        Some(input)
    }

    /// Performs worker `i`'s action if it can; `true` if it did.
    fn step(&mut self, i: usize, lose: bool) -> bool {
        let Some(input) = self.answer(i, lose) else { return false };
        let now = self.base + self.now;
        let w = &mut self.workers[i];
        match w.machine.on(input, now) {
            Action::Done(done) => {
                w.outcome = Some(Ok(done));
                w.action = None;
            }
            Action::Fail(e) => {
                w.outcome = Some(Err(e.to_string()));
                w.action = None;
            }
            next => w.action = Some(next),
        }
        true
    }

    /// The earliest timer any waiting worker has.
    fn next_timer(&self) -> Option<Instant> {
        self.workers
            .iter()
            .filter_map(|w| match &w.action {
                Some(Action::Await { until: Some(at), .. }) => Some(*at),
                _ => None,
            })
            .min()
    }
}

fn lost() -> RendezvousError {
    RendezvousError::Unavailable(KvError::Timeout {
        backend: "model",
        operation: "a write whose answer was lost".into(),
        after: Duration::from_secs(1),
    })
}

/// Runs the world until nobody can move and no timer is left: `schedule` picks who moves
/// (indices modulo the number of workers), `losses` which of the first moves lose their
/// answer (after them the world has healed: no answer is lost any more).
fn run(world: &mut World, schedule: &[usize], losses: &[bool]) {
    let n = world.workers.len();
    let mut picks = schedule.iter().cycle();
    let mut lose = losses.iter();
    for _ in 0..20_000 {
        // Try the scheduled worker first, then anyone who can move.
        let first = picks.next().copied().unwrap_or(0) % n;
        let lose_now = lose.next().copied().unwrap_or(false);
        let moved = (0..n).map(|k| (first + k) % n).any(|i| world.step(i, lose_now));
        if moved {
            continue;
        }
        match world.next_timer() {
            Some(at) => world.now = at.duration_since(world.base),
            None => return,
        }
    }
    panic!("the world did not settle in 20000 steps: a livelock");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn a_round_forms_whatever_the_schedule(
        n in 1usize..9,
        min in 1usize..5,
        extra in 0usize..4,
        schedule in proptest::collection::vec(0usize..64, 1..64),
        losses in proptest::collection::vec(proptest::bool::weighted(0.1), 1..32),
        count_at_revision in proptest::bool::ANY,
        counted_create in proptest::bool::ANY,
        segment_size in proptest::option::of(1usize..=2),
        labels in proptest::collection::vec(0u8..2, 8),
    ) {
        // With whole segments of `k`, every worker names one of two segments, the sizes are
        // multiples of `k`, and the round takes whole blocks only: the workers of a segment
        // rounded down to a multiple of `k`.
        let k = segment_size.unwrap_or(1);
        let (min, max) = (min.div_ceil(k) * k, (min + extra).div_ceil(k) * k);
        let segments: Vec<Option<String>> = match segment_size {
            Some(_) => labels.iter().take(n).map(|l| Some(format!("s{l}"))).collect(),
            None => Vec::new(),
        };
        let admissible = match segment_size {
            Some(k) => (0..2).map(|l| labels.iter().take(n).filter(|x| **x == l).count() / k * k).sum(),
            None => n,
        };
        prop_assume!(admissible >= min);
        let sizing = Sizing {
            min,
            max,
            last_call: Duration::from_secs(30),
            backup: Duration::from_secs(10),
            order: if segment_size.is_some() { RankOrder::Segment } else { RankOrder::Arrival },
            segment_size,
        };
        let mut world = World::new(n, sizing, count_at_revision, counted_create, &segments);
        run(&mut world, &schedule, &losses);
        let done: Vec<&Completed> =
            world.workers.iter().filter_map(|w| w.outcome.as_ref().and_then(|o| o.as_ref().ok())).collect();
        let failed: Vec<&String> =
            world.workers.iter().filter_map(|w| w.outcome.as_ref().and_then(|o| o.as_ref().err())).collect();
        prop_assert!(failed.is_empty(), "calls failed: {failed:?}");
        let w = admissible.min(max);
        prop_assert_eq!(done.len(), w, "expected {} members of {} workers", w, n);
        let version = done[0].version;
        let mut ranks: Vec<usize> = done.iter().map(|d| d.rank).collect();
        ranks.sort_unstable();
        prop_assert_eq!(ranks, (0..w).collect::<Vec<_>>());
        for d in &done {
            prop_assert_eq!(d.version, version);
            prop_assert_eq!(&d.participants, &done[0].participants);
            prop_assert_eq!(d.participants.len(), w);
        }
        // Every block of `k` ranks holds workers of one segment.
        for block in done[0].participants.chunks(k) {
            prop_assert!(block.iter().all(|p| p.segment == block[0].segment), "a block mixes segments: {:?}", block);
        }
        for worker in world.workers.iter().filter(|w| w.outcome.is_none()) {
            // Beyond `max`, or of an incomplete segment: waiting for the running round to
            // end, as a late arrival (a spare).
            prop_assert_eq!(worker.machine.phase_name(), "late");
        }
    }
}

/// A backend that counts at a past revision but fails to (the revision was compacted away):
/// each position is counted again from the live keys created up to it, and the round forms.
#[test]
fn a_failed_count_at_a_past_revision_is_taken_from_the_live_keys() {
    let sizing = Sizing {
        min: 3,
        max: 3,
        last_call: Duration::from_secs(30),
        backup: Duration::from_secs(10),
        order: RankOrder::Arrival,
        segment_size: None,
    };
    let mut world = World::new(3, sizing, true, false, &[]);
    world.past_counts_fail = true;
    run(&mut world, &[0, 1, 2], &[]);
    let done: Vec<_> = world.workers.iter().filter_map(|w| w.outcome.as_ref()).collect();
    assert!(done.len() == 3 && done.iter().all(|o| o.is_ok()), "{done:?}");
    // Three join positions and three keep-alive positions, each counted live.
    assert_eq!(world.live_counts, 6);
}
