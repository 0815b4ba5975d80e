//! `rdzv bench`: N in-process workers on one backend client (or, with
//! `--client-per-worker`, one client each), R rounds; latency, backend operations per worker
//! and round, peak memory.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rdzv::{Rendezvous, RendezvousParams};
use rdzv_core::Kv;
use rdzv_core::layer::{CountingKv, FaultyKv, OpCounts};
use serde_json::json;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::exit::CliError;
use crate::output::{ReportFormat, print_flush, seconds};
use crate::target::RunTarget;

const LONG_ABOUT: &str = "\
Runs N workers in this process, all on ONE backend client (as N agents on N machines would
each have one), and makes them rendezvous R times (after the first round, all re-enter
next_rendezvous together). Prints the latency of a round (until the last worker returned:
p50, p95, max over the rounds), the backend writes and reads per worker per round (from a
counting wrapper; lease keep-alives excluded, the bootstrap exchange through the round's
Store included), and the peak memory of the process (VmHWM). With --format json, also
each round's latency in order (`round_ms`) and every kind of operation per worker per round,
keep-alives included (`ops_per_worker_round`).

With --client-per-worker, each worker runs as on a host of its own instead: on a thread
and runtime of its own, with its own backend client and connections (what the server sees
from N machines); the operations are counted per client and summed, and the rounds are
started together from the main thread. Counted in this process, an etcd worker holds about
3 open files (2 connections) and a Redis worker about 6 (3 connections), and the server one
per connection: raise the limit first if needed (`ulimit -n 8192` for 1024 workers). On
mem:// all workers share the one process-wide store. Creating the workers (256 at a time on
one client) is not in the round latency.

With --metrics, every worker is observed as `rdzv run --metrics-addr` observes its own (its
backend's operations counted and timed, its events counted; nothing is served), to measure
what that costs.

min_workers = max_workers = N unless the URL says otherwise. Each invocation uses a fresh
run id (the URL's with a unique suffix) unless --run-id is given.

Examples:
  rdzv bench 'etcd://127.0.0.1:2379/bench' --workers 64 --rounds 5
  rdzv bench 'mem://b/bench' --workers 512 --format json
  rdzv bench 'etcd://127.0.0.1:2379/bench?keep_alive_ttl=3s' --workers 4096 --rounds 1 --kill-one
  rdzv bench 'etcd://127.0.0.1:2379/bench' --workers 1024 --rounds 1 --client-per-worker";

/// Arguments of `rdzv bench`.
#[derive(Debug, clap::Args)]
#[command(about = "Measure rendezvous latency and backend cost with N in-process workers", long_about = LONG_ABOUT)]
pub struct BenchArgs {
    /// The rendezvous URL (min_workers defaults to --workers; default: $RDZV_URL).
    #[arg(env = "RDZV_URL", hide_env_values = true, value_name = "URL")]
    url: String,
    /// How many workers.
    #[arg(long, short = 'n', value_parser = clap::value_parser!(u32).range(1..=100_000))]
    workers: u32,
    /// How many rounds.
    #[arg(long, short = 'r', default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    rounds: u32,
    /// Use this run id as is (default: the URL's run id plus a unique suffix).
    #[arg(long, value_name = "ID", value_parser = crate::args::run_id)]
    run_id: Option<String>,
    /// Give each worker its own thread, runtime, backend client and connections (as separate
    /// hosts would) instead of one client shared by all.
    #[arg(long)]
    client_per_worker: bool,
    /// Record metrics as `rdzv run --metrics-addr` does (with the shared client only).
    #[arg(long, conflicts_with = "client_per_worker")]
    metrics: bool,
    /// After the rounds, cut one member off (from then on all its backend calls fail, as for
    /// a node that died: its session lease ends by the server's clock) while one more worker
    /// waits as a spare, and measure how long the survivors take to be told
    /// (`round_broken`) and to form the next round with the spare in its place, re-entering
    /// as agents do. Uses the shared client.
    #[arg(long, conflicts_with = "client_per_worker")]
    kill_one: bool,
    /// Give the workers this many segment labels, worker `i` the label `s<i mod N>`: the
    /// workers of one segment arrive interleaved with the others', the most work for keeping
    /// segments together.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    segments: Option<u32>,
    /// How to print the results.
    #[arg(long, value_enum, default_value = "text")]
    format: ReportFormat,
}

/// The run's parameters, and how every bench worker's differ from them.
#[derive(Clone, Debug)]
struct Roster {
    params: RendezvousParams,
    /// How many segment labels the workers take in turn, if any.
    segments: Option<u32>,
}

impl Roster {
    /// Worker `i`'s parameters.
    fn worker(&self, i: usize) -> RendezvousParams {
        let mut params = self.params.clone();
        params.node_id = Some(format!("bench-{i}"));
        params.segment = self.segments.map(|n| format!("s{}", i % n as usize));
        params
    }
}

/// What `--kill-one` measured, from the instant the member was cut off.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Failure {
    /// When the first and the last survivor were told the round was broken.
    told: [Duration; 2],
    /// When the last worker of the next round (survivors and the spare) had it.
    formed: Duration,
    /// The workers' `keep_alive_ttl`.
    ttl: Duration,
}

/// How many workers connect at once while they are created (a burst of thousands of
/// simultaneous connects would only queue in the server's accept backlog).
const CONNECTING_AT_ONCE: usize = 64;

/// How many workers of one client are created (their sessions granted), or shut down, at
/// once: as many requests as an etcd client sends at once. One after another, a grant or a
/// revoke per round trip, 98,304 workers took about 30 s to create and 40 s to shut down.
const AT_ONCE: usize = 256;

/// The round number that tells the workers of `--client-per-worker` to leave.
const LEAVE: u32 = u32::MAX;

/// One measured round.
#[derive(Clone, Copy, Debug)]
struct RoundStats {
    latency: Duration,
    ops: OpCounts,
}

/// Runs `rdzv bench`.
pub async fn run(args: BenchArgs) -> Result<ExitCode, CliError> {
    let n = args.workers as usize;
    let target = RunTarget::connect(&args.url).await?;
    let run_id =
        args.run_id.clone().unwrap_or_else(|| format!("{}-bench-{}", target.address.run_id, unique_suffix()));
    let roster = Roster { params: target.params(n, n, Some(&run_id))?, segments: args.segments };
    let (stats, clients, failure) = if args.client_per_worker {
        let (stats, counting) = own_clients(&args.url, &roster, n, args.rounds).await?;
        (stats, counting.len(), None)
    } else if args.kill_one {
        let (stats, failure) = kill_one(target.kv.clone(), &roster, n, args.rounds).await?;
        (stats, 1, Some(failure))
    } else {
        let metrics = args.metrics.then(rdzv_core::metrics::Metrics::new);
        (shared_client(target.kv.clone(), &roster, n, args.rounds, metrics.as_ref()).await?, 1, None)
    };
    let report = Report::new(&stats, n, target.kv.name(), &run_id, peak_memory_kib())
        .with_clients(clients)
        .with_failure(failure)
        .with_segments(args.segments);
    let text = match args.format {
        ReportFormat::Json => format!("{}\n", report.json()),
        ReportFormat::Text => report.text(),
    };
    print_flush(&text);
    Ok(ExitCode::SUCCESS)
}

/// `n` workers on this runtime, all on the one client `kv`, `rounds` rounds.
async fn shared_client(
    kv: Arc<dyn Kv>,
    roster: &Roster,
    n: usize,
    rounds: u32,
    metrics: Option<&rdzv_core::metrics::Metrics>,
) -> Result<Vec<RoundStats>, CliError> {
    let kv = CountingKv::new(kv);
    let shared: Arc<dyn Kv> = match metrics {
        Some(metrics) => metrics.instrument(kv.clone()),
        None => kv.clone(),
    };
    let workers = all_bounded(n, |i| Rendezvous::new(shared.clone(), roster.worker(i))).await?;
    if let Some(metrics) = metrics {
        workers.iter().for_each(|worker| metrics.attach(worker.handler()));
    }
    let stats = rounds_of(&kv, &workers, rounds).await;
    all_bounded(n, |i| {
        let worker = workers[i].clone();
        async move {
            let _ = worker.shutdown().await;
            Ok::<_, CliError>(())
        }
    })
    .await?;
    stats
}

/// Runs `make(0)` … `make(n - 1)`, [`AT_ONCE`] at a time, and returns their outputs in that
/// order; the first error ends it (the calls still running are dropped).
async fn all_bounded<T, E, Fut>(n: usize, make: impl Fn(usize) -> Fut) -> Result<Vec<T>, CliError>
where
    T: Send + 'static,
    E: Into<CliError> + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    let mut done: Vec<Option<T>> = std::iter::repeat_with(|| None).take(n).collect();
    let mut running = JoinSet::new();
    let mut next = 0;
    while next < n || !running.is_empty() {
        while next < n && running.len() < AT_ONCE {
            let call = make(next);
            running.spawn(async move { (next, call.await) });
            next += 1;
        }
        if let Some(joined) = running.join_next().await {
            let (i, output) = joined.map_err(|e| CliError::other(format!("a bench worker failed: {e}")))?;
            done[i] = Some(output.map_err(Into::into)?);
        }
    }
    Ok(done.into_iter().flatten().collect())
}

/// `rounds` rounds of all `workers` together, counted by `kv`.
async fn rounds_of(
    kv: &CountingKv,
    workers: &[Rendezvous],
    rounds: u32,
) -> Result<Vec<RoundStats>, CliError> {
    let mut stats = Vec::new();
    for _ in 0..rounds {
        let before = kv.snapshot();
        let started = Instant::now();
        let mut set = JoinSet::new();
        for w in workers {
            let w = w.clone();
            set.spawn(async move { w.next_rendezvous().await.map(|r| r.info.world_size) });
        }
        while let Some(joined) = set.join_next().await {
            joined.map_err(|e| CliError::other(format!("a bench worker failed: {e}")))??;
        }
        stats.push(RoundStats { latency: started.elapsed(), ops: kv.snapshot() - before });
    }
    Ok(stats)
}

/// `--kill-one`: `rounds` rounds of `n` workers on the one client `kv` (the last of them
/// through a link that can be cut), then one more worker as a spare, then the cut.
async fn kill_one(
    kv: Arc<dyn Kv>,
    roster: &Roster,
    n: usize,
    rounds: u32,
) -> Result<(Vec<RoundStats>, Failure), CliError> {
    if n < 2 {
        return Err(CliError::other("--kill-one needs at least 2 workers (one dies, the others survive)"));
    }
    let kv = CountingKv::new(kv);
    let shared: Arc<dyn Kv> = kv.clone();
    let link = FaultyKv::new(shared.clone(), 0);
    let mut workers = Vec::with_capacity(n);
    for i in 0..n {
        let through = if i + 1 == n { link.clone() as Arc<dyn Kv> } else { shared.clone() };
        workers.push(Rendezvous::new(through, roster.worker(i)).await?);
    }
    let stats = rounds_of(&kv, &workers, rounds).await?;
    let spare = Rendezvous::new(shared.clone(), roster.worker(n)).await?;
    let waits = {
        let spare = spare.clone();
        tokio::spawn(async move { spare.next_rendezvous().await.map(|_| Instant::now()) })
    };
    let registered = Instant::now() + roster.params.timeout;
    while workers[0].waiting().await?.waiters.is_empty() {
        if Instant::now() > registered {
            return Err(CliError::other("the spare did not register as waiting within the timeout"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cut = Instant::now();
    link.set_failure_probability(1.0);
    let mut survivors = JoinSet::new();
    for w in &workers[..n - 1] {
        let w = w.clone();
        survivors.spawn(async move {
            w.round_broken().await;
            let told = cut.elapsed();
            w.next_rendezvous().await?;
            Ok::<_, CliError>((told, cut.elapsed()))
        });
    }
    let (mut first, mut last, mut formed) = (Duration::MAX, Duration::ZERO, Duration::ZERO);
    while let Some(done) = survivors.join_next().await {
        let (told, joined) = done.map_err(|e| CliError::other(format!("a bench worker failed: {e}")))??;
        (first, last, formed) = (first.min(told), last.max(told), formed.max(joined));
    }
    let spare_joined = waits.await.map_err(|e| CliError::other(format!("the spare failed: {e}")))??;
    formed = formed.max(spare_joined - cut);
    for w in workers[..n - 1].iter().chain([&spare]) {
        let _ = w.shutdown().await;
    }
    Ok((stats, Failure { told: [first, last], formed, ttl: roster.params.keep_alive_ttl }))
}

/// `n` workers, each on a thread and runtime of its own with its own client connected from
/// `url` (as on a host of its own: a client is shared only within one runtime), `rounds`
/// rounds started together from here. The stats of each round, and each worker's counter.
async fn own_clients(
    url: &str,
    roster: &Roster,
    n: usize,
    rounds: u32,
) -> Result<(Vec<RoundStats>, Vec<Arc<CountingKv>>), CliError> {
    let (go, _) = watch::channel(0u32);
    let (ready_tx, mut ready) = mpsc::unbounded_channel();
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let mut threads = Vec::with_capacity(n);
    let mut started = Ok(());
    for i in 0..n {
        let worker = OwnWorker {
            index: i,
            url: url.to_string(),
            params: roster.worker(i),
            go: go.subscribe(),
            ready: ready_tx.clone(),
            done: done_tx.clone(),
            connecting: connecting.clone(),
        };
        match std::thread::Builder::new().name(format!("bench-{i}")).spawn(move || worker.run()) {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                started = Err(CliError::other(format!(
                    "cannot start the thread of worker {i} of {n}: {e} (--client-per-worker runs one thread \
                     per worker)"
                )));
                break;
            }
        }
    }
    drop((ready_tx, done_tx));
    let result = match started {
        Ok(()) => drive(&go, &mut ready, &mut done, n, rounds).await,
        Err(e) => Err(e),
    };
    go.send_replace(LEAVE);
    // Every worker leaves the run before this returns (a thread has nothing left to block on).
    let _ = tokio::task::spawn_blocking(move || {
        for thread in threads {
            let _ = thread.join();
        }
    })
    .await;
    result
}

/// Waits for the `n` workers to be ready, then starts `rounds` rounds one after the other
/// and times each until the last worker returned.
async fn drive(
    go: &watch::Sender<u32>,
    ready: &mut mpsc::UnboundedReceiver<Result<Arc<CountingKv>, CliError>>,
    done: &mut mpsc::UnboundedReceiver<Result<(), CliError>>,
    n: usize,
    rounds: u32,
) -> Result<(Vec<RoundStats>, Vec<Arc<CountingKv>>), CliError> {
    let ended = || CliError::other("a bench worker's thread ended unexpectedly");
    let mut counting = Vec::with_capacity(n);
    while counting.len() < n {
        counting.push(ready.recv().await.ok_or_else(ended)??);
    }
    let snapshot =
        |counting: &[Arc<CountingKv>]| counting.iter().fold(OpCounts::default(), |acc, c| acc + c.snapshot());
    let mut stats = Vec::new();
    for round in 1..=rounds {
        let before = snapshot(&counting);
        let started = Instant::now();
        go.send_replace(round);
        for _ in 0..n {
            done.recv().await.ok_or_else(ended)??;
        }
        stats.push(RoundStats { latency: started.elapsed(), ops: snapshot(&counting) - before });
    }
    Ok((stats, counting))
}

/// One worker of `--client-per-worker`, on its own thread.
struct OwnWorker {
    index: usize,
    url: String,
    params: RendezvousParams,
    /// The round to run (1, 2, …), or [`LEAVE`].
    go: watch::Receiver<u32>,
    ready: mpsc::UnboundedSender<Result<Arc<CountingKv>, CliError>>,
    done: mpsc::UnboundedSender<Result<(), CliError>>,
    connecting: Arc<Semaphore>,
}

impl OwnWorker {
    fn run(self) {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime.block_on(self.rendezvous()),
            Err(e) => {
                let message = format!("cannot start the runtime of worker {}: {e}", self.index);
                let _ = self.ready.send(Err(CliError::other(message)));
            }
        }
    }

    async fn rendezvous(mut self) {
        let worker = match self.connect().await {
            Ok((kv, worker)) => {
                let _ = self.ready.send(Ok(kv));
                worker
            }
            Err(e) => {
                let _ = self.ready.send(Err(e));
                return;
            }
        };
        let mut round = 0;
        loop {
            let Ok(next) = self.go.wait_for(|&r| r > round).await.map(|r| *r) else { break };
            if next == LEAVE {
                break;
            }
            round = next;
            let result = tokio::select! {
                r = worker.next_rendezvous() => r.map(|_| ()).map_err(CliError::from),
                _ = self.go.wait_for(|&r| r == LEAVE) => break,
            };
            if self.done.send(result).is_err() {
                break;
            }
        }
        let _ = worker.shutdown().await;
    }

    async fn connect(&self) -> Result<(Arc<CountingKv>, Rendezvous), CliError> {
        let _turn = self.connecting.acquire().await.map_err(|e| CliError::other(e.to_string()))?;
        let target = RunTarget::connect(&self.url).await.map_err(|e| {
            CliError::from(e).context(format_args!(
                "worker {} cannot connect its client (--client-per-worker opens connections per \
                 worker, in this process and in the server: if this says too many open files, raise \
                 `ulimit -n`)",
                self.index
            ))
        })?;
        let kv = CountingKv::new(target.kv);
        let worker = Rendezvous::new(kv.clone(), self.params.clone()).await?;
        Ok((kv, worker))
    }
}

/// The summary of a bench.
#[derive(Debug, Clone, PartialEq)]
struct Report {
    backend: String,
    run_id: String,
    workers: usize,
    rounds: usize,
    latency_ms: [f64; 3],
    /// Each round's latency, in the order they ran.
    round_ms: Vec<f64>,
    writes_per_worker_round: f64,
    reads_per_worker_round: f64,
    keys_visited_per_worker_round: f64,
    /// Every kind of operation, per worker per round.
    ops_per_worker_round: serde_json::Value,
    peak_memory_kib: Option<u64>,
    /// How many backend clients the workers used (1: shared; `workers`: one each).
    clients: usize,
    /// What `--kill-one` measured.
    failure: Option<Failure>,
    /// How many segment labels the workers took in turn (`--segments`), if any: a record
    /// says what it measured.
    segments: Option<u32>,
}

impl Report {
    fn new(stats: &[RoundStats], workers: usize, backend: &str, run_id: &str, peak: Option<u64>) -> Report {
        let round_ms: Vec<f64> = stats.iter().map(|s| s.latency.as_secs_f64() * 1000.0).collect();
        let mut latencies = round_ms.clone();
        latencies.sort_by(f64::total_cmp);
        let total = stats.iter().fold(OpCounts::default(), |acc, s| acc + s.ops);
        let per = (workers * stats.len()).max(1) as f64;
        Report {
            backend: backend.to_string(),
            run_id: run_id.to_string(),
            workers,
            rounds: stats.len(),
            latency_ms: [
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.95),
                percentile(&latencies, 1.0),
            ],
            round_ms,
            writes_per_worker_round: total.writes() as f64 / per,
            reads_per_worker_round: total.reads() as f64 / per,
            keys_visited_per_worker_round: total.keys_visited as f64 / per,
            ops_per_worker_round: per_worker_round(total, per),
            peak_memory_kib: peak,
            clients: 1,
            failure: None,
            segments: None,
        }
    }

    fn with_clients(self, clients: usize) -> Report {
        Report { clients, ..self }
    }

    fn with_failure(self, failure: Option<Failure>) -> Report {
        Report { failure, ..self }
    }

    fn with_segments(self, segments: Option<u32>) -> Report {
        Report { segments, ..self }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "backend": self.backend,
            "run_id": self.run_id,
            "workers": self.workers,
            "rounds": self.rounds,
            "latency_ms": { "p50": self.latency_ms[0], "p95": self.latency_ms[1], "max": self.latency_ms[2] },
            "round_ms": self.round_ms,
            "writes_per_worker_round": self.writes_per_worker_round,
            "reads_per_worker_round": self.reads_per_worker_round,
            "keys_visited_per_worker_round": self.keys_visited_per_worker_round,
            "ops_per_worker_round": self.ops_per_worker_round,
            "peak_memory_kib": self.peak_memory_kib,
            "clients": self.clients,
            "segments": self.segments,
            "failure": self.failure.map(|f| json!({
                "told_first_s": f.told[0].as_secs_f64(),
                "told_last_s": f.told[1].as_secs_f64(),
                "formed_s": f.formed.as_secs_f64(),
                "keep_alive_ttl_s": f.ttl.as_secs_f64(),
            })),
        })
    }

    fn text(&self) -> String {
        let ms = |v: f64| seconds(Duration::from_secs_f64(v / 1000.0));
        let memory =
            self.peak_memory_kib.map_or("unknown".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
        let failure = self.failure.map_or(String::new(), |f| {
            format!(
                "one member cut off (keep_alive_ttl {}): survivors told after {} to {}, next round (the spare in \
                 its place) formed after {}\n",
                seconds(f.ttl),
                seconds(f.told[0]),
                seconds(f.told[1]),
                seconds(f.formed)
            )
        });
        let clients = if self.clients == 1 {
            "one shared client".to_string()
        } else {
            format!("{} clients", self.clients)
        };
        format!(
            "{} workers on {} ({clients}; run {}), {} rounds\n\
             round latency: p50 {}, p95 {}, max {}\n\
             backend per worker per round: {:.2} writes, {:.2} reads, {:.1} keys visited by reads (lease keep-alives excluded)\n\
             peak memory: {memory}\n{failure}",
            self.workers,
            self.backend,
            self.run_id,
            self.rounds,
            ms(self.latency_ms[0]),
            ms(self.latency_ms[1]),
            ms(self.latency_ms[2]),
            self.writes_per_worker_round,
            self.reads_per_worker_round,
            self.keys_visited_per_worker_round,
        )
    }
}

/// Each kind of operation in `total`, divided by `per` (workers × rounds).
fn per_worker_round(total: OpCounts, per: f64) -> serde_json::Value {
    let kinds = [
        ("gets", total.gets),
        ("ranges", total.ranges),
        ("puts", total.puts),
        ("counted_creates", total.counted_creates),
        ("increments", total.increments),
        ("deletes", total.deletes),
        ("delete_prefixes", total.delete_prefixes),
        ("lease_grants", total.lease_grants),
        ("lease_revokes", total.lease_revokes),
        ("lease_keep_alives", total.lease_keep_alives),
        ("watches", total.watches),
    ];
    kinds.into_iter().map(|(kind, count)| (kind.to_string(), json!(count as f64 / per))).collect()
}

/// The nearest-rank percentile `q` (0..=1) of sorted values (0 when empty).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Peak resident memory of this process in KiB (`VmHWM` of /proc/self/status; Linux only).
fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn unique_suffix() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{}-{}", std::process::id(), millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.95), 10.0);
        assert_eq!(percentile(&v, 1.0), 10.0);
        assert_eq!(percentile(&[3.0], 0.5), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    /// More calls than run at once, the later ones finishing first: the outputs come in the
    /// calls' order, no more than [`AT_ONCE`] run together, and an error ends it.
    #[tokio::test(start_paused = true)]
    async fn all_bounded_keeps_the_order_and_the_bound() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let n = 3 * AT_ONCE + 5;
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let outputs = all_bounded(n, |i| {
            let (running, most) = (running.clone(), most.clone());
            async move {
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis((n - i) as u64)).await;
                running.fetch_sub(1, SeqCst);
                Ok::<_, CliError>(i)
            }
        })
        .await
        .expect("no call fails");
        assert_eq!(outputs, (0..n).collect::<Vec<_>>());
        assert_eq!(most.load(SeqCst), AT_ONCE);

        let failed = all_bounded(n, |i| async move {
            if i == AT_ONCE { Err(CliError::other("call 256 failed")) } else { Ok(i) }
        })
        .await;
        assert_eq!(failed, Err(CliError::other("call 256 failed")));
    }

    #[test]
    fn report_per_worker_per_round() {
        let ops = OpCounts { puts: 6, gets: 4, ranges: 4, lease_keep_alives: 100, ..OpCounts::default() };
        let stats = [
            RoundStats { latency: Duration::from_millis(10), ops },
            RoundStats { latency: Duration::from_millis(30), ops },
        ];
        let r = Report::new(&stats, 2, "mem", "b", Some(2048));
        assert_eq!(r.writes_per_worker_round, 3.0);
        assert_eq!(r.reads_per_worker_round, 4.0);
        assert_eq!(r.latency_ms[2], 30.0);
        assert_eq!(r.json()["latency_ms"]["p50"], 10.0);
        assert_eq!(r.json()["round_ms"], json!([10.0, 30.0]), "in the order the rounds ran");
        assert_eq!(r.json()["ops_per_worker_round"]["lease_keep_alives"], 50.0);
        assert_eq!(r.json()["ops_per_worker_round"]["ranges"], 2.0);
        assert!(r.text().contains("2.0 MiB"), "{}", r.text());
        assert_eq!(r.json()["segments"], json!(null), "no labels");
        assert_eq!(r.with_segments(Some(64)).json()["segments"], 64);
    }

    /// `--kill-one`: the survivors are told within the TTL (the cut member's lease ends by
    /// the server's clock) and the time the news takes to reach them, and the next round, with
    /// the spare in its place, forms after that.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kill_one_times_the_survivors_and_the_next_round() {
        // A refresh of the cut member's lease that was already through at the cut keeps the
        // lease a whole TTL from then; its end then reaches the survivors through a watch and
        // their tasks, 6 ms late once in CI on two busy cores.
        const DELIVERY: Duration = Duration::from_millis(500);
        let target =
            RunTarget::connect("mem://bench-kill/b?keep_alive_ttl=2s").await.expect("a mem:// backend");
        let roster =
            Roster { params: target.params(4, 4, Some("kill")).expect("parameters"), segments: None };
        let (stats, failure) =
            kill_one(target.kv.clone(), &roster, 4, 1).await.expect("a round, a death, a round");
        assert_eq!(stats.len(), 1);
        let Failure { told: [first, last], formed, ttl } = failure;
        assert_eq!(ttl, Duration::from_secs(2));
        assert!(first <= last && last <= ttl + DELIVERY, "{failure:?}");
        assert!(formed >= last && formed < ttl + Duration::from_secs(2), "{failure:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_client_per_worker_each_counted_and_summed() {
        let url = "mem://bench-clients/b";
        let target = RunTarget::connect(url).await.expect("a mem:// backend");
        let roster = Roster { params: target.params(4, 4, Some("own")).expect("parameters"), segments: None };
        let (stats, counting) = own_clients(url, &roster, 4, 2).await.expect("two rounds of 4");
        assert_eq!(stats.len(), 2);
        assert_eq!(counting.len(), 4);
        for (i, c) in counting.iter().enumerate() {
            // A lease grant and a join write at least, on each worker's own client.
            assert!(c.snapshot().writes() >= 2, "worker {i}: {:?}", c.snapshot());
            for other in &counting[..i] {
                assert!(!Arc::ptr_eq(c, other), "two workers share a client");
            }
        }
        let total = counting.iter().fold(OpCounts::default(), |acc, c| acc + c.snapshot());
        let rounds = stats[0].ops + stats[1].ops;
        assert!(rounds.writes() >= 2 * 4, "{rounds:?}");
        assert!(rounds.writes() <= total.writes(), "{rounds:?} {total:?}");
    }

    #[tokio::test]
    async fn a_worker_that_cannot_connect_fails_the_bench() {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
        let url = format!("etcd://127.0.0.1:{port}/b?connect_timeout=1s");
        let roster = Roster { params: RendezvousParams::new("b", 2, 2).expect("parameters"), segments: None };
        let Err(e) = own_clients(&url, &roster, 2, 1).await else { panic!("no server, yet the bench ran") };
        assert!(e.message.contains("cannot connect its client"), "{}", e.message);
    }

    #[test]
    fn report_names_its_clients() {
        let ops = OpCounts { puts: 2, ..OpCounts::default() };
        let stats = [RoundStats { latency: Duration::from_millis(10), ops }];
        let shared = Report::new(&stats, 2, "etcd", "b", None);
        assert_eq!(shared.json()["clients"], 1);
        assert!(shared.text().contains("one shared client"), "{}", shared.text());
        let own = shared.with_clients(2);
        assert_eq!(own.json()["clients"], 2);
        assert!(own.text().contains("2 clients"), "{}", own.text());
    }

    #[test]
    fn reads_peak_memory() {
        assert!(peak_memory_kib().is_some_and(|k| k > 0));
    }
}
