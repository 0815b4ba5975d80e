//! `rdzv bench`: N in-process workers on one backend client (or, with
//! `--client-per-worker`, one client each), R rounds; latency, backend operations per worker
//! and round, peak memory.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rdzv::Rendezvous;
use rdzv::core::Kv;
use rdzv_core::testing::{CountingKv, OpCounts};
use serde_json::json;
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
Store included), and the peak memory of the process (VmHWM).

With --client-per-worker, each worker connects its own backend client instead (its own
connections, as N separate hosts would: what the server sees from N machines), and the
operations are counted per client and summed. Each etcd or Redis client holds two or three
connections (requests, lease keep-alives, and on Redis its key-event feed), so N workers
need 2N-3N open files here and in the server: raise the limit first if needed
(`ulimit -n 8192`).
On mem:// every client is the same process-wide store, so only the counting and the
keep-alive driver are per worker. Creating the clients is not in the round latency.

min_workers = max_workers = N unless the URL says otherwise. Each invocation uses a fresh
run id (the URL's with a unique suffix) unless --run-id is given.

Examples:
  rdzv bench 'etcd://127.0.0.1:2379/bench' --workers 64 --rounds 5
  rdzv bench 'mem://b/bench' --workers 512 --format json
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
    /// Give each worker its own backend client and connections (as separate hosts would)
    /// instead of one client shared by all.
    #[arg(long)]
    client_per_worker: bool,
    /// How to print the results.
    #[arg(long, value_enum, default_value = "text")]
    format: ReportFormat,
}

/// How many clients are connected at once while creating them (a burst of thousands of
/// simultaneous connects would only queue in the server's accept backlog).
const CONNECTING_AT_ONCE: usize = 64;

/// The workers' backend clients, each wrapped in its own [`CountingKv`]: one shared by all
/// workers, or one per worker.
struct Clients {
    counting: Vec<Arc<CountingKv>>,
}

impl Clients {
    /// One client (`first`, already connected) for all workers; or, if `per_worker`, `first`
    /// for worker 0 and `workers - 1` more connected from `url`.
    async fn connect(
        url: &str,
        first: Arc<dyn Kv>,
        workers: usize,
        per_worker: bool,
    ) -> Result<Clients, CliError> {
        let mut counting = vec![CountingKv::new(first)];
        if !per_worker {
            return Ok(Clients { counting });
        }
        let mut pending = JoinSet::new();
        let mut next = 1;
        while counting.len() < workers {
            while next < workers && pending.len() < CONNECTING_AT_ONCE {
                let url = url.to_string();
                pending.spawn(async move { (next, RunTarget::connect(&url).await) });
                next += 1;
            }
            let Some(joined) = pending.join_next().await else { break };
            let (i, connected) =
                joined.map_err(|e| CliError::other(format!("connecting a client failed: {e}")))?;
            let target = connected.map_err(|e| {
                CliError::from(e).context(format_args!(
                    "cannot connect the client of worker {i} of {workers} (--client-per-worker opens two or three \
                     connections per worker: if this says too many open files, raise `ulimit -n`)"
                ))
            })?;
            counting.push(CountingKv::new(target.kv));
        }
        Ok(Clients { counting })
    }

    /// The client of worker `i`.
    fn of(&self, i: usize) -> Arc<dyn Kv> {
        self.counting[i % self.counting.len()].clone()
    }

    /// How many clients there are.
    fn len(&self) -> usize {
        self.counting.len()
    }

    /// The operations of all clients so far, summed.
    fn snapshot(&self) -> OpCounts {
        self.counting.iter().fold(OpCounts::default(), |acc, c| add(acc, c.snapshot()))
    }

    /// The backend's name.
    fn backend(&self) -> &'static str {
        self.counting[0].inner().name()
    }
}

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
    let params = target.params(n, n, Some(&run_id))?;
    let clients = Clients::connect(&args.url, target.kv.clone(), n, args.client_per_worker).await?;
    let mut workers = Vec::with_capacity(n);
    for i in 0..n {
        let mut params = params.clone();
        params.node_id = Some(format!("bench-{i}"));
        workers.push(Rendezvous::new(clients.of(i), params).await?);
    }
    let mut stats = Vec::new();
    for _ in 0..args.rounds {
        let before = clients.snapshot();
        let started = Instant::now();
        let mut set = JoinSet::new();
        for w in &workers {
            let w = w.clone();
            set.spawn(async move { w.next_rendezvous().await.map(|r| r.info.world_size) });
        }
        while let Some(joined) = set.join_next().await {
            joined.map_err(|e| CliError::other(format!("a bench worker failed: {e}")))??;
        }
        stats.push(RoundStats { latency: started.elapsed(), ops: clients.snapshot() - before });
    }
    for w in &workers {
        let _ = w.shutdown().await;
    }
    let report =
        Report::new(&stats, n, clients.backend(), &run_id, peak_memory_kib()).with_clients(clients.len());
    let text = match args.format {
        ReportFormat::Json => format!("{}\n", report.json()),
        ReportFormat::Text => report.text(),
    };
    print_flush(&text);
    Ok(ExitCode::SUCCESS)
}

/// The summary of a bench.
#[derive(Debug, Clone, PartialEq)]
struct Report {
    backend: String,
    run_id: String,
    workers: usize,
    rounds: usize,
    latency_ms: [f64; 3],
    writes_per_worker_round: f64,
    reads_per_worker_round: f64,
    peak_memory_kib: Option<u64>,
    /// How many backend clients the workers used (1: shared; `workers`: one each).
    clients: usize,
}

impl Report {
    fn new(stats: &[RoundStats], workers: usize, backend: &str, run_id: &str, peak: Option<u64>) -> Report {
        let mut latencies: Vec<f64> = stats.iter().map(|s| s.latency.as_secs_f64() * 1000.0).collect();
        latencies.sort_by(f64::total_cmp);
        let total = stats.iter().fold(OpCounts::default(), |acc, s| add(acc, s.ops));
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
            writes_per_worker_round: total.writes() as f64 / per,
            reads_per_worker_round: total.reads() as f64 / per,
            peak_memory_kib: peak,
            clients: 1,
        }
    }

    fn with_clients(self, clients: usize) -> Report {
        Report { clients, ..self }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "backend": self.backend,
            "run_id": self.run_id,
            "workers": self.workers,
            "rounds": self.rounds,
            "latency_ms": { "p50": self.latency_ms[0], "p95": self.latency_ms[1], "max": self.latency_ms[2] },
            "writes_per_worker_round": self.writes_per_worker_round,
            "reads_per_worker_round": self.reads_per_worker_round,
            "peak_memory_kib": self.peak_memory_kib,
            "clients": self.clients,
        })
    }

    fn text(&self) -> String {
        let ms = |v: f64| seconds(Duration::from_secs_f64(v / 1000.0));
        let memory =
            self.peak_memory_kib.map_or("unknown".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
        let clients = if self.clients == 1 {
            "one shared client".to_string()
        } else {
            format!("{} clients", self.clients)
        };
        format!(
            "{} workers on {} ({clients}; run {}), {} rounds\n\
             round latency: p50 {}, p95 {}, max {}\n\
             backend per worker per round: {:.2} writes, {:.2} reads (lease keep-alives excluded)\n\
             peak memory: {memory}\n",
            self.workers,
            self.backend,
            self.run_id,
            self.rounds,
            ms(self.latency_ms[0]),
            ms(self.latency_ms[1]),
            ms(self.latency_ms[2]),
            self.writes_per_worker_round,
            self.reads_per_worker_round,
        )
    }
}

fn add(a: OpCounts, b: OpCounts) -> OpCounts {
    OpCounts {
        gets: a.gets + b.gets,
        ranges: a.ranges + b.ranges,
        puts: a.puts + b.puts,
        deletes: a.deletes + b.deletes,
        delete_prefixes: a.delete_prefixes + b.delete_prefixes,
        lease_grants: a.lease_grants + b.lease_grants,
        lease_keep_alives: a.lease_keep_alives + b.lease_keep_alives,
        lease_revokes: a.lease_revokes + b.lease_revokes,
        watches: a.watches + b.watches,
        compactions: a.compactions + b.compactions,
        increments: a.increments + b.increments,
    }
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
        assert!(r.text().contains("2.0 MiB"), "{}", r.text());
    }

    #[tokio::test]
    async fn one_client_per_worker_counted_and_summed() {
        let url = "mem://bench-clients/b";
        let first = RunTarget::connect(url).await.expect("a mem:// backend").kv;
        let shared = Clients::connect(url, first.clone(), 5, false).await.expect("one shared client");
        assert_eq!(shared.len(), 1);
        assert!(Arc::ptr_eq(&shared.of(0), &shared.of(4)));

        let own = Clients::connect(url, first, 5, true).await.expect("a client per worker");
        assert_eq!(own.len(), 5);
        for i in 0..5 {
            for j in 0..i {
                assert!(!Arc::ptr_eq(&own.of(i), &own.of(j)), "workers {i} and {j} share a client");
            }
        }
        for i in 0..5 {
            own.of(i).get(format!("/k{i}").as_bytes()).await.expect("a get");
        }
        own.of(2).get(b"/again").await.expect("a get");
        assert_eq!(own.snapshot().gets, 6, "{:?}", own.snapshot());
        assert_eq!(own.backend(), "mem");
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
