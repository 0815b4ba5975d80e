//! Model-based property test: random operation sequences (writes with every precondition,
//! leases, time advancing on a paused clock, compaction) applied both to `MemKv` and to a
//! plain reference model; results, final state and event streams must be identical.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use proptest::prelude::*;
use rdzv_core::kv::{
    DeleteMode, DeleteOutcome, DeletePrefixResponse, Event, EventKind, GetResponse, KeyValue, LeaseId,
    PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder, RangeResponse, Revision, WatchScope,
};
use rdzv_core::{Kv, KvError};
use rdzv_mem::MemKv;
use tokio::time::Instant;

const KEYS: &[&str] = &["a", "a/1", "a/2", "ab", "b", "b/1"];
const PREFIXES: &[&str] = &["a", "a/", "b", "x", ""];
const UNKNOWN_LEASE: LeaseId = 999_999;

#[derive(Clone, Debug)]
enum Rev {
    /// The key's current mod revision (or 1 if absent).
    Current,
    /// The store revision minus this.
    Back(i64),
}

#[derive(Clone, Debug)]
enum LeaseSel {
    None,
    /// The n-th granted lease (modulo how many there are; none granted: unknown).
    Granted(usize),
    Unknown,
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        key: usize,
        value: u8,
        mode: u8,
        rev: Rev,
        lease: LeaseSel,
    },
    Delete {
        key: usize,
        conditional: bool,
        rev: Rev,
    },
    DeletePrefix {
        prefix: usize,
    },
    Get {
        key: usize,
    },
    Range {
        prefix: usize,
        limit: Option<usize>,
        max_back: Option<i64>,
        by_create: bool,
        keys_only: bool,
        count_only: bool,
    },
    Grant {
        ttl_ms: u64,
    },
    KeepAlive {
        lease: LeaseSel,
    },
    Revoke {
        lease: LeaseSel,
    },
    Advance {
        ms: u64,
    },
    Compact {
        back: i64,
    },
    Increment {
        key: usize,
        delta: i64,
    },
}

fn rev() -> impl Strategy<Value = Rev> {
    prop_oneof![Just(Rev::Current), (0i64..4).prop_map(Rev::Back)]
}

fn lease_sel() -> impl Strategy<Value = LeaseSel> {
    prop_oneof![
        2 => Just(LeaseSel::None),
        3 => (0usize..8).prop_map(LeaseSel::Granted),
        1 => Just(LeaseSel::Unknown),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        8 => (key.clone(), prop_oneof![any::<u8>(), b'0'..=b'9'], 0u8..3, rev(), lease_sel())
            .prop_map(|(key, value, mode, rev, lease)| Op::Put { key, value, mode, rev, lease }),
        3 => (key.clone(), any::<bool>(), rev()).prop_map(|(key, conditional, rev)| Op::Delete { key, conditional, rev }),
        1 => (0..PREFIXES.len() - 1).prop_map(|prefix| Op::DeletePrefix { prefix }),
        2 => key.clone().prop_map(|key| Op::Get { key }),
        2 => (0..PREFIXES.len(), proptest::option::of(0usize..4), proptest::option::of(0i64..6), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(prefix, limit, max_back, by_create, keys_only, count_only)| Op::Range { prefix, limit, max_back, by_create, keys_only, count_only }),
        2 => prop_oneof![Just(100u64), Just(250), Just(1000)].prop_map(|ttl_ms| Op::Grant { ttl_ms }),
        2 => lease_sel().prop_map(|lease| Op::KeepAlive { lease }),
        1 => lease_sel().prop_map(|lease| Op::Revoke { lease }),
        3 => prop_oneof![Just(0u64), 1u64..120, Just(250), Just(1000)].prop_map(|ms| Op::Advance { ms }),
        1 => (-1i64..5).prop_map(|back| Op::Compact { back }),
        1 => (key, -3i64..4).prop_map(|(key, delta)| Op::Increment { key, delta }),
    ]
}

/// One key's change in a write: the new value and lease, or `None` for a delete.
type Change = (Vec<u8>, Option<(Vec<u8>, Option<LeaseId>)>);

/// The reference: the contract of docs/KV.md in the plainest terms.
#[derive(Debug)]
struct Model {
    revision: Revision,
    keys: BTreeMap<Vec<u8>, KeyValue>,
    /// Lease id → (ttl, deadline).
    leases: BTreeMap<LeaseId, (Duration, Instant)>,
    next_lease: LeaseId,
    events: Vec<Event>,
    history_limit: i64,
    first_available: Revision,
}

impl Model {
    fn new(history_limit: usize) -> Self {
        Model {
            revision: 0,
            keys: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: 1,
            events: Vec::new(),
            history_limit: history_limit as i64,
            first_available: 1,
        }
    }

    /// One write: the next revision, applied to each key.
    fn write(&mut self, changes: Vec<Change>) -> Revision {
        self.revision += 1;
        let rev = self.revision;
        for (key, change) in changes {
            match change {
                Some((value, lease)) => {
                    let (create_revision, version) = match self.keys.get(&key) {
                        Some(old) => (old.create_revision, old.version + 1),
                        None => (rev, 1),
                    };
                    let kv = KeyValue {
                        key: key.clone(),
                        value: value.into(),
                        create_revision,
                        mod_revision: rev,
                        version,
                        lease,
                    };
                    self.keys.insert(key, kv.clone());
                    self.events.push(Event { kind: EventKind::Put, kv });
                }
                None => {
                    self.keys.remove(&key);
                    let kv = KeyValue {
                        key,
                        value: Default::default(),
                        create_revision: 0,
                        mod_revision: rev,
                        version: 0,
                        lease: None,
                    };
                    self.events.push(Event { kind: EventKind::Delete, kv });
                }
            }
        }
        self.first_available = self.first_available.max(self.revision - self.history_limit + 1);
        rev
    }

    fn delete_keys(&mut self, keys: Vec<Vec<u8>>) -> u64 {
        if !keys.is_empty() {
            self.write(keys.iter().map(|k| (k.clone(), None)).collect());
        }
        keys.len() as u64
    }

    fn expire(&mut self, now: Instant) {
        loop {
            let due =
                self.leases.iter().filter(|(_, (_, d))| *d <= now).min_by_key(|(id, (_, d))| (*d, **id));
            let Some((&id, _)) = due else { return };
            self.leases.remove(&id);
            self.delete_keys(self.keys_of(id));
        }
    }

    fn keys_of(&self, lease: LeaseId) -> Vec<Vec<u8>> {
        self.keys.values().filter(|kv| kv.lease == Some(lease)).map(|kv| kv.key.clone()).collect()
    }

    fn put(&mut self, key: &[u8], value: &[u8], options: PutOptions) -> Result<PutOutcome, String> {
        let current = self.keys.get(key).cloned();
        let ok = match options.mode {
            PutMode::Overwrite => true,
            PutMode::Create => current.is_none(),
            PutMode::Update(r) => current.as_ref().is_some_and(|kv| kv.mod_revision == r),
        };
        if !ok {
            return Ok(PutOutcome::Conflict { current });
        }
        if let Some(lease) = options.lease
            && !self.leases.contains_key(&lease)
        {
            return Err("LeaseNotFound".into());
        }
        let revision = self.write(vec![(key.to_vec(), Some((value.to_vec(), options.lease)))]);
        Ok(PutOutcome::Written { revision, create_revision: self.keys[key].create_revision })
    }

    fn delete(&mut self, key: &[u8], mode: DeleteMode) -> DeleteOutcome {
        let current = self.keys.get(key).cloned();
        match (mode, current) {
            (DeleteMode::Any, None) => DeleteOutcome::Missing,
            (DeleteMode::IfRevision(r), Some(kv)) if kv.mod_revision != r => {
                DeleteOutcome::Conflict { current: Some(kv) }
            }
            (DeleteMode::IfRevision(_), None) => DeleteOutcome::Conflict { current: None },
            (_, Some(_)) => DeleteOutcome::Deleted { revision: self.write(vec![(key.to_vec(), None)]) },
        }
    }

    fn range(&self, prefix: &[u8], o: RangeOptions) -> RangeResponse {
        let mut kvs: Vec<KeyValue> = self
            .keys
            .values()
            .filter(|kv| {
                kv.key.starts_with(prefix) && o.max_create_revision.is_none_or(|m| kv.create_revision <= m)
            })
            .cloned()
            .collect();
        let count = kvs.len() as u64;
        if o.order == RangeOrder::ByCreateRevision {
            kvs.sort_by_key(|kv| kv.create_revision);
        }
        kvs.truncate(o.limit.unwrap_or(usize::MAX));
        if o.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value.clear());
        }
        if o.count_only {
            kvs.clear();
        }
        RangeResponse { kvs, count, revision: self.revision }
    }
}

fn kind(e: &KvError) -> String {
    match e {
        KvError::LeaseNotFound(_) => "LeaseNotFound".into(),
        KvError::InvalidArgument(_) => "InvalidArgument".into(),
        other => format!("{other:?}"),
    }
}

/// Maps MemKv's lease ids to the model's (grant order), wherever they appear in a result.
struct Ids(HashMap<LeaseId, LeaseId>);

impl Ids {
    fn kv(&self, mut kv: KeyValue) -> KeyValue {
        kv.lease = kv.lease.map(|id| self.0.get(&id).copied().unwrap_or(-id));
        kv
    }
    fn put(&self, o: PutOutcome) -> PutOutcome {
        match o {
            PutOutcome::Conflict { current } => {
                PutOutcome::Conflict { current: current.map(|kv| self.kv(kv)) }
            }
            w => w,
        }
    }
    fn delete(&self, o: DeleteOutcome) -> DeleteOutcome {
        match o {
            DeleteOutcome::Conflict { current } => {
                DeleteOutcome::Conflict { current: current.map(|kv| self.kv(kv)) }
            }
            d => d,
        }
    }
    fn events(&self, events: Vec<Event>) -> Vec<Event> {
        events.into_iter().map(|e| Event { kind: e.kind, kv: self.kv(e.kv) }).collect()
    }
}

/// Drains a watch whose events are all queued already.
fn drain(events: &mut rdzv_core::kv::WatchStream) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(Some(item)) = events.next().now_or_never() {
        out.push(item.expect("no error in a live watch"));
    }
    out
}

async fn run(ops: Vec<Op>, history_limit: usize) -> Result<(), TestCaseError> {
    let kv = MemKv::builder().history_limit(history_limit).build();
    let mut model = Model::new(history_limit);
    let mut live = kv.watch(b"", WatchScope::Prefix, 1).await.unwrap();
    let mut ids = Ids(HashMap::new());
    // (MemKv id, model id) of every grant, in order.
    let mut granted: Vec<(LeaseId, LeaseId)> = Vec::new();
    let pick = |sel: &LeaseSel, granted: &Vec<(LeaseId, LeaseId)>| match sel {
        LeaseSel::None => None,
        LeaseSel::Granted(i) if !granted.is_empty() => Some(granted[i % granted.len()]),
        _ => Some((UNKNOWN_LEASE, UNKNOWN_LEASE)),
    };
    for (step, op) in ops.iter().enumerate() {
        model.expire(Instant::now());
        let at = |r: &Rev, key: &[u8], model: &Model| match r {
            Rev::Current => model.keys.get(key).map_or(1, |kv| kv.mod_revision),
            Rev::Back(n) => model.revision - n,
        };
        match op {
            Op::Put { key, value, mode, rev, lease } => {
                let k = KEYS[*key].as_bytes();
                let mode = match mode {
                    0 => PutMode::Overwrite,
                    1 => PutMode::Create,
                    _ => PutMode::Update(at(rev, k, &model)),
                };
                let lease = pick(lease, &granted);
                let got = kv.put(k, &[*value], PutOptions::new(mode).with_lease(lease.map(|l| l.0))).await;
                let want = model.put(k, &[*value], PutOptions::new(mode).with_lease(lease.map(|l| l.1)));
                prop_assert_eq!(
                    got.map(|o| ids.put(o)).map_err(|e| kind(&e)),
                    want,
                    "step {}: {:?}",
                    step,
                    op
                );
            }
            Op::Delete { key, conditional, rev } => {
                let k = KEYS[*key].as_bytes();
                let mode =
                    if *conditional { DeleteMode::IfRevision(at(rev, k, &model)) } else { DeleteMode::Any };
                let got = kv.delete(k, mode).await.unwrap();
                prop_assert_eq!(ids.delete(got), model.delete(k, mode), "step {}: {:?}", step, op);
            }
            Op::DeletePrefix { prefix } => {
                let p = PREFIXES[*prefix].as_bytes();
                let got = kv.delete_prefix(p).await.unwrap();
                let doomed: Vec<_> = model.keys.keys().filter(|k| k.starts_with(p)).cloned().collect();
                let deleted = model.delete_keys(doomed);
                prop_assert_eq!(
                    got,
                    DeletePrefixResponse { deleted, revision: model.revision },
                    "step {}",
                    step
                );
            }
            Op::Get { key } => {
                let k = KEYS[*key].as_bytes();
                let got = kv.get(k).await.unwrap();
                let want = GetResponse { kv: model.keys.get(k).cloned(), revision: model.revision };
                prop_assert_eq!(
                    GetResponse { kv: got.kv.map(|kv| ids.kv(kv)), ..got },
                    want,
                    "step {}",
                    step
                );
            }
            Op::Range { prefix, limit, max_back, by_create, keys_only, count_only } => {
                let options = RangeOptions {
                    limit: *limit,
                    max_create_revision: max_back.map(|b| model.revision - b),
                    order: if *by_create { RangeOrder::ByCreateRevision } else { RangeOrder::ByKey },
                    keys_only: *keys_only,
                    count_only: *count_only,
                };
                let p = PREFIXES[*prefix].as_bytes();
                let got = kv.range(p, options).await.unwrap();
                let got = RangeResponse { kvs: got.kvs.into_iter().map(|kv| ids.kv(kv)).collect(), ..got };
                prop_assert_eq!(got, model.range(p, options), "step {}: {:?}", step, op);
            }
            Op::Grant { ttl_ms } => {
                let ttl = Duration::from_millis(*ttl_ms);
                let id = kv.lease_grant(ttl).await.unwrap();
                let model_id = model.next_lease;
                model.next_lease += 1;
                model.leases.insert(model_id, (ttl, Instant::now() + ttl));
                prop_assert!(!ids.0.contains_key(&id), "lease id {} given twice", id);
                ids.0.insert(id, model_id);
                granted.push((id, model_id));
            }
            Op::KeepAlive { lease } => {
                let Some((id, model_id)) = pick(lease, &granted) else { continue };
                let got = kv.lease_keep_alive(id).await.map_err(|e| kind(&e));
                let want = match model.leases.get_mut(&model_id) {
                    Some((ttl, deadline)) => {
                        *deadline = Instant::now() + *ttl;
                        Ok(*ttl)
                    }
                    None => Err("LeaseNotFound".to_string()),
                };
                prop_assert_eq!(got, want, "step {}: {:?}", step, op);
            }
            Op::Revoke { lease } => {
                let Some((id, model_id)) = pick(lease, &granted) else { continue };
                let got = kv.lease_revoke(id).await.map_err(|e| kind(&e));
                let want = match model.leases.remove(&model_id) {
                    Some(_) => {
                        model.delete_keys(model.keys_of(model_id));
                        Ok(())
                    }
                    None => Err("LeaseNotFound".to_string()),
                };
                prop_assert_eq!(got, want, "step {}: {:?}", step, op);
            }
            Op::Advance { ms } => tokio::time::advance(Duration::from_millis(*ms)).await,
            Op::Compact { back } => {
                let rev = model.revision - back;
                let got = kv.compact(rev).await.map_err(|e| kind(&e));
                let want = if rev > model.revision {
                    Err("InvalidArgument".to_string())
                } else {
                    model.first_available = model.first_available.max(rev);
                    Ok(())
                };
                prop_assert_eq!(got, want, "step {}: {:?}", step, op);
            }
            Op::Increment { key, delta } => {
                let k = KEYS[*key].as_bytes();
                let got = kv.increment(k, *delta).await.map_err(|e| kind(&e));
                let current = match model.keys.get(k) {
                    None => Some(0),
                    Some(kv) => std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse::<i64>().ok()),
                };
                let want = match current.and_then(|n| n.checked_add(*delta)) {
                    Some(n) => {
                        model.put(k, n.to_string().as_bytes(), PutOptions::OVERWRITE).unwrap();
                        Ok(Some(n))
                    }
                    None => Err("InvalidArgument".to_string()),
                };
                prop_assert_eq!(got, want, "step {}: {:?}", step, op);
            }
        }
    }
    // Let every lease run out, so that expiry by the reaper alone (no calls) is covered too.
    tokio::time::advance(Duration::from_secs(2)).await;
    tokio::task::yield_now().await;
    model.expire(Instant::now());
    // Read the live watch before any call (calls expire overdue leases themselves).
    prop_assert_eq!(ids.events(drain(&mut live)), model.events.clone());

    prop_assert_eq!(kv.revision(), model.revision);
    prop_assert_eq!(kv.oldest_revision(), model.first_available);
    let all = kv.range(b"", RangeOptions::default()).await.unwrap();
    prop_assert_eq!(all.kvs, model.range(b"", RangeOptions::default()).kvs);

    // A watch from the oldest retained revision replays exactly the retained events; one
    // from before it is compacted.
    let mut replay = kv.watch(b"", WatchScope::Prefix, model.first_available).await.unwrap();
    let retained: Vec<Event> =
        model.events.iter().filter(|e| e.revision() >= model.first_available).cloned().collect();
    prop_assert_eq!(ids.events(drain(&mut replay)), retained);
    let mut prefixed = kv.watch(b"a/", WatchScope::Prefix, model.first_available).await.unwrap();
    let retained_a: Vec<Event> = model
        .events
        .iter()
        .filter(|e| e.revision() >= model.first_available && e.kv.key.starts_with(b"a/"))
        .cloned()
        .collect();
    prop_assert_eq!(ids.events(drain(&mut prefixed)), retained_a);
    if model.first_available > 1 {
        let mut old = kv.watch(b"", WatchScope::Prefix, model.first_available - 1).await.unwrap();
        let first = old.next().now_or_never().flatten();
        let compacted = matches!(first, Some(Err(KvError::Compacted { requested, oldest }))
                if requested == model.first_available - 1 && oldest == model.first_available);
        prop_assert!(compacted, "expected Compacted");
        prop_assert!(old.next().now_or_never().flatten().is_none());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mem_kv_matches_the_model(
        ops in proptest::collection::vec(op(), 1..80),
        history_limit in prop_oneof![Just(4usize), Just(1000)],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(run(ops, history_limit))?;
    }
}
