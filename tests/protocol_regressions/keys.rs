//! The keys under a run stay bounded over many rounds, through failed clean-ups and lost answers.

use super::*;

/// Defect 5: the number of keys under a run stays bounded however many rounds pass, and a
/// worker that gave up waiting no longer counts as waiting.
#[test]
fn keys_stay_bounded_over_many_rounds() {
    paused(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let workers = [handler(kv.clone(), 2, 2, "a").await, handler(kv.clone(), 2, 2, "b").await];
        let mut most = 0;
        for round in 0..150u64 {
            let (x, y) = tokio::join!(workers[0].next_rendezvous(), workers[1].next_rendezvous());
            let (x, y) = (x.unwrap(), y.unwrap());
            assert_eq!(x.version, y.version, "round {round}");
            let keys = kv.count(PREFIX.as_bytes(), None).await.unwrap();
            most = most.max(keys);
        }
        // Two workers: their join, keep-alive and waiting keys of the last few rounds, the
        // state, the counter and the run lease.
        assert!(most <= 16, "{most} keys under the run after 150 rounds");

        // A spare (behind the full round) waits beyond its timeout; once its call ends (here
        // cancelled), it is no longer counted as waiting.
        let mut p = worker_params(2, 2, "late");
        p.timeout = Duration::from_secs(3);
        let late = RendezvousHandler::new(kv.clone(), p).await.unwrap();
        let pending = tokio::spawn(async move { late.next_rendezvous().await });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!pending.is_finished(), "a spare timed out behind a full round");
        assert_eq!(workers[0].waiting().await.unwrap().waiters.len(), 1);
        assert_eq!(
            workers[0].num_nodes_waiting().await.unwrap(),
            0,
            "a spare counts as waiting to be admitted"
        );
        pending.abort();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(workers[0].waiting().await.unwrap().waiters.is_empty(), "a cancelled waiter still counts");
    });
}

/// Five workers (min 2, max 4: one is always left waiting) re-rendezvous as fast as they
/// can, for 200+ rounds; the key count under the run, sampled every second and at the end,
/// stays within a few keys per worker — per-round keys (join, keep-alive, waiting) of
/// finished rounds do not pile up.
#[test]
fn key_count_stays_bounded_over_hundreds_of_rounds() {
    const WORKERS: usize = 5;
    const ROUNDS: u64 = 220;
    paused(async {
        let kv = mem();
        let mut p = params(&run_id("keys"), 2, 4);
        p.last_call_timeout = Duration::from_millis(100);
        p.timeout = Duration::from_secs(60);
        let ws = support::workers(&kv, &p, WORKERS).await;
        let root = ws[0].handler.keys().root().as_bytes().to_vec();
        let limit = KEYS_PER_WORKER * WORKERS as u64 + KEYS_CONSTANT;
        let (done_tx, done) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for w in &ws {
            let (h, mut done) = (w.handler.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut last = 0;
                loop {
                    let r = tokio::select! {
                        r = h.next_rendezvous() => r,
                        _ = async { let _ = done.wait_for(|d| *d).await; } => return last,
                    };
                    let info = r.unwrap_or_else(|e| panic!("{}: {e}", h.participant().node));
                    assert!(info.version > last);
                    last = info.version;
                    // Hold the round a moment, as a training step would (and so that the
                    // paused clock moves).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
        let mut samples = Vec::new();
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let count = kv.count(&root, None).await.unwrap();
            let version = ws[0].handler.backend().get(&ws[0].handler.keys().version_counter()).await.unwrap();
            let version: u64 =
                version.kv.map(|kv| String::from_utf8_lossy(&kv.value).parse().unwrap()).unwrap();
            samples.push((version, count));
            assert!(
                count <= limit,
                "{count} keys under the run after {version} rounds ({WORKERS} workers, limit {limit}); samples \
                 (round, keys): {samples:?}"
            );
            if version >= ROUNDS {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(3600), "only {version} rounds in an hour");
        }
        done_tx.send_replace(true);
        for t in tasks {
            t.await.unwrap();
        }
        let count = kv.count(&root, None).await.unwrap();
        assert!(
            count <= limit,
            "{count} keys at the end (limit {limit}); samples (round, keys): {samples:?}"
        );
        println!("keys at the end: {count} (limit {limit}); samples (round, keys): {samples:?}");
    });
}

/// A clean-up that fails once must not leak a finished round's keys for as long as its
/// workers live: three workers re-rendezvous 25 times; from round 3 on, each worker's next
/// `delete_prefix` fails once (whoever opens a round and deletes an old one gets the
/// failure). At the end the key count is within the bound, and no round older than the
/// previous one has keys left.
#[test]
fn a_failed_cleanup_does_not_leak_a_round() {
    paused(async {
        let kv = mem();
        let p = params(&run_id("cleanup"), 3, 3);
        let ws = support::workers(&kv, &p, 3).await;
        let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
        let mut last = 0;
        for round in 0..25 {
            if round == 2 {
                ws.iter().for_each(|w| w.link.fail_next(rdzv_core::kv::Op::DeletePrefixLimited));
            }
            let infos: Vec<_> = timeout(Duration::from_secs(30), support::rendezvous_all(&handlers))
                .await
                .unwrap()
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_agreement(&infos, 3, 3);
            last = infos[0].version;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_no_round_left_before(&kv, ws[0].handler.keys().root(), last - 1, 3).await;
    });
}

/// Keys of round `keep` and later may exist under run `root`, and at most the bound for
/// `workers`; nothing of an older round.
async fn assert_no_round_left_before(kv: &Arc<dyn Kv>, root: &str, keep: u64, workers: u64) {
    let options = rdzv_core::kv::RangeOptions { keys_only: true, ..Default::default() };
    let read = kv.range(root.as_bytes(), options).await.unwrap();
    let old: BTreeSet<String> = read
        .kvs
        .iter()
        .filter_map(|kv| {
            let key = String::from_utf8_lossy(&kv.key[root.len()..]).into_owned();
            let version: u64 = key.strip_prefix("rdzv/v_")?.split('/').next()?.parse().ok()?;
            (version < keep).then_some(key)
        })
        .collect();
    let limit = KEYS_PER_WORKER * workers + KEYS_CONSTANT;
    assert!(
        old.is_empty() && read.count <= limit,
        "{} keys under the run (limit {limit}); keys of rounds before {keep}: {old:?}",
        read.count,
    );
}

/// Versions have gaps: a version handed out whose round never opened (the answer to the
/// counter's swap lost, the creator gone). Each creator used to delete "the round before
/// the previous one" by number, so a gap left a finished round's keys for as long as its
/// workers lived (found by `protocol_props`: four rounds' keys under a run). Three workers
/// re-rendezvous 12 times, and before every other round the counter skips a version; at
/// the end no round older than the previous one has keys left.
#[test]
fn gaps_in_the_versions_do_not_leave_rounds_behind() {
    paused(async {
        let kv = mem();
        let p = params(&run_id("gaps"), 3, 3);
        let ws = support::workers(&kv, &p, 3).await;
        let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
        let counter = ws[0].handler.keys().version_counter();
        let mut versions = Vec::new();
        for round in 0..12 {
            if round % 2 == 1 {
                let found = kv.get(&counter).await.unwrap().kv.expect("a version counter");
                let skipped: u64 = String::from_utf8_lossy(&found.value).parse().unwrap();
                let options = PutOptions { mode: PutMode::Update(found.mod_revision), lease: found.lease };
                kv.put(&counter, (skipped + 1).to_string().as_bytes(), options).await.unwrap();
            }
            let infos: Vec<_> = timeout(Duration::from_secs(30), support::rendezvous_all(&handlers))
                .await
                .unwrap()
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_agreement(&infos, 3, 3);
            versions.push(infos[0].version);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(versions.windows(2).filter(|w| w[1] > w[0] + 1).count() >= 5, "no gaps: {versions:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let keep = versions[versions.len() - 2];
        assert_no_round_left_before(&kv, ws[0].handler.keys().root(), keep, 3).await;
    });
}

/// `workers` (all of the run, `min = max`) form three rounds in turn; their versions.
async fn three_rounds(workers: &[Worker]) -> Vec<u64> {
    let handlers: Vec<_> = workers.iter().map(|w| w.handler.clone()).collect();
    let mut versions = Vec::new();
    for _ in 0..3 {
        let infos: Vec<_> = timeout(Duration::from_secs(60), support::rendezvous_all(&handlers))
            .await
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_agreement(&infos, workers.len(), workers.len());
        versions.push(infos[0].version);
    }
    versions
}

/// Records every prefix delete: the prefix, and the limit (`None`: the whole prefix).
#[derive(Debug)]
struct DeleteLog {
    inner: Arc<dyn Kv>,
    deletes: std::sync::Mutex<Vec<(String, Option<usize>)>>,
}

impl Decorator for DeleteLog {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn delete_prefix<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> rdzv_core::KvResult<rdzv_core::kv::DeletePrefixResponse> {
        self.deletes.lock().unwrap().push((String::from_utf8_lossy(prefix).into_owned(), None));
        self.inner.delete_prefix(prefix).await
    }

    async fn delete_prefix_limited<'a>(
        &'a self,
        prefix: &'a [u8],
        limit: usize,
    ) -> rdzv_core::KvResult<rdzv_core::kv::DeletePrefixResponse> {
        self.deletes.lock().unwrap().push((String::from_utf8_lossy(prefix).into_owned(), Some(limit)));
        self.inner.delete_prefix_limited(prefix, limit).await
    }
}

/// Issue 25: an old round is deleted a bounded piece at a time (on etcd one delete of a
/// whole 8,192-worker round stalled the server for seconds and lost the next round's
/// sessions). 600 workers rendezvous three times; the first round's 600 join keys and 600
/// keep-alive keys go in deletes of at most `KEYS_PER_DELETE` keys, none of an old round
/// goes in one unbounded delete, and no round before the previous one is left.
#[test]
fn old_rounds_are_deleted_in_bounded_pieces() {
    paused(async {
        const N: usize = 600;
        let log = Arc::new(DeleteLog { inner: mem(), deletes: Default::default() });
        let kv: Arc<dyn Kv> = log.clone();
        let p = params(&run_id("pieces"), N, N);
        let ws = support::workers(&kv, &p, N).await;
        let versions = three_rounds(&ws).await;
        // The deletes wait for the third round to be final, then pause between pieces.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let root = ws[0].handler.keys().root().to_string();
        assert_no_round_left_before(&kv, &root, versions[1], N as u64).await;
        let first_round = format!("{root}rdzv/v_{}/", versions[0]);
        let deletes = log.deletes.lock().unwrap().clone();
        let of_first: Vec<_> =
            deletes.iter().filter(|(prefix, _)| prefix.starts_with(&first_round)).collect();
        assert!(
            of_first.iter().all(|(_, limit)| *limit == Some(rdzv_core::protocol::KEYS_PER_DELETE)),
            "an old round deleted without a bound: {of_first:?}"
        );
        let joins = format!("{first_round}join/");
        let pieces = of_first.iter().filter(|(prefix, _)| *prefix == joins).count();
        // The full pieces, the rest, and one that finds nothing left.
        let expected = N.div_ceil(rdzv_core::protocol::KEYS_PER_DELETE) + 1;
        assert_eq!(pieces, expected, "{of_first:?}");
    });
}

/// On etcd a piece is listed, then deleted up to its last listed key: a listed key whose
/// lease expires in between is not counted, so the piece deletes fewer than its limit.
/// This layer does that to the first full piece of a round's join keys: it deletes one
/// of them first, as its expiry would, then the rest of the listed ones.
#[derive(Debug)]
struct ExpiresMidPiece {
    inner: Arc<dyn Kv>,
    done: std::sync::atomic::AtomicBool,
}

impl Decorator for ExpiresMidPiece {
    fn inner(&self) -> &dyn Kv {
        &*self.inner
    }

    async fn delete_prefix_limited<'a>(
        &'a self,
        prefix: &'a [u8],
        limit: usize,
    ) -> rdzv_core::KvResult<rdzv_core::kv::DeletePrefixResponse> {
        use std::sync::atomic::Ordering;
        let options =
            rdzv_core::kv::RangeOptions { limit: Some(limit), keys_only: true, ..Default::default() };
        let listed = self.inner.range(prefix, options).await?;
        let is_joins = prefix.ends_with(b"/join/");
        if !is_joins || listed.kvs.len() < limit || self.done.swap(true, Ordering::SeqCst) {
            return self.inner.delete_prefix_limited(prefix, limit).await;
        }
        self.inner.delete(&listed.kvs[0].key, DeleteMode::Any).await?;
        self.inner.delete_prefix_limited(prefix, limit - 1).await
    }
}

/// Issue 39, defect 5: a piece that came up short (a listed key expired before the delete)
/// was taken for the end of the prefix, and the record advanced past a round whose keys
/// were never all deleted: they stayed for the run's life. Every key of the old rounds
/// must go all the same.
#[test]
fn a_piece_cut_short_by_an_expiry_does_not_end_the_deletes() {
    paused(async {
        const N: usize = rdzv_core::protocol::KEYS_PER_DELETE + 44;
        let layer = Arc::new(ExpiresMidPiece { inner: mem(), done: Default::default() });
        let kv: Arc<dyn Kv> = layer.clone();
        let p = params(&run_id("short-piece"), N, N);
        let ws = support::workers(&kv, &p, N).await;
        let versions = three_rounds(&ws).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(layer.done.load(std::sync::atomic::Ordering::SeqCst), "no piece was cut short");
        let root = ws[0].handler.keys().root().to_string();
        assert_no_round_left_before(&kv, &root, versions[1], N as u64).await;
    });
}

/// Issue 23, defect 6: a key a call writes for itself is registered for clean-up before the
/// write. When the write takes effect but its answer is lost and the call then ends (here it
/// is cancelled), nothing of it may stay bound to the still-live session: neither a `setup`
/// (every other worker would wait on it) nor a join key (it would be frozen into a round as
/// a ghost, which then stalls for the frozen lease).
#[test]
fn a_lost_answer_then_an_ended_call_leaves_no_setup_and_no_ghost_join_key() {
    paused(async {
        // The setup of the first round.
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let link = FaultyKv::new(kv.clone(), 1);
        let creator = RendezvousHandler::new(link.clone(), worker_params(1, 1, "a")).await.unwrap();
        link.set_fail_after_applying(true);
        link.fail_next(rdzv_core::kv::Op::Put);
        assert!(tokio::time::timeout(Duration::from_millis(10), creator.next_rendezvous()).await.is_err());
        link.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other = handler(kv.clone(), 1, 1, "b").await;
        let round = tokio::time::timeout(Duration::from_secs(1), other.next_rendezvous()).await;
        assert!(matches!(round, Ok(Ok(_))), "a lost setup blocked the run: {round:?}");

        // A join key.
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let first = handler(kv.clone(), 2, 2, "b").await;
        let waiting = {
            let first = first.clone();
            tokio::spawn(async move { first.next_rendezvous().await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let link = FaultyKv::new(kv.clone(), 2);
        let ghost = RendezvousHandler::new(link.clone(), worker_params(2, 2, "a")).await.unwrap();
        link.set_fail_after_applying(true);
        // The join key is written by a counted create where the backend has one (memory does).
        assert!(kv.capabilities().counted_create);
        link.fail_next(rdzv_core::kv::Op::CreateCounted);
        assert!(tokio::time::timeout(Duration::from_millis(10), ghost.next_rendezvous()).await.is_err());
        link.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let late = handler(kv.clone(), 2, 2, "c").await;
        let round = tokio::time::timeout(Duration::from_secs(1), late.next_rendezvous()).await;
        let round = round.expect("a ghost join key stalled the round").unwrap();
        let theirs = tokio::time::timeout(Duration::from_secs(1), waiting).await.unwrap().unwrap().unwrap();
        assert_eq!(round.version, theirs.version);
        assert!(round.participants.iter().all(|p| p.node != "a"), "{:?}", round.participants);
    });
}
