//! Cost figures that do not depend on the machine's speed: for N in-process workers
//! (min = max = N) on one shared client, the backend writes and reads per worker per round
//! (counted by `CountingKv`; lease refreshes aside, like docs/PROTOCOL.md's cost section), and on etcd
//! the server's own committed Raft proposals per worker (`etcd_server_proposals_committed_total`
//! from its `/metrics`, before and after the round), with the server's key ranges read
//! (`etcd_mvcc_range_total`: range requests and a transaction's compares and reads) and its
//! CPU time (`process_cpu_seconds_total`, utime + stime of the etcd process, reported per
//! 1000 workers). Round 1 is a first rendezvous; round 2
//! is everyone calling `next_rendezvous` again (a re-rendezvous). Creating the workers is
//! reported apart (`setup`). The process's peak resident memory (VmHWM, reset before each
//! size where the kernel allows) is reported too, and at the end whether all N handlers
//! leaving at once on the one client did so without a failed request (`leave`).
//!
//! `cargo bench --bench cost [-- --sizes 16,64 --backends mem,etcd]`; results go to stdout
//! and `<results>/cost.jsonl`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdzv_core::layer::{CountingKv, OpCounts};
use rdzv_core::{Kv, RendezvousHandler, RendezvousInfo, RendezvousParams};
use rdzv_etcd::testing::{PROPOSALS_COMMITTED, metric_value};

const SIZES: [usize; 5] = [16, 64, 128, 512, 1024];

/// `VmHWM` and `VmRSS` of this process, in KiB.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Resets VmHWM to the current RSS (Linux ≥ 4.0); whether it worked.
fn reset_peak_memory() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// What the etcd server reports about its own work, from its `/metrics`.
#[derive(Clone, Copy)]
struct ServerCounters {
    proposals: f64,
    ranges: f64,
    cpu_s: f64,
}

async fn server(backend: &common::Backend) -> Option<ServerCounters> {
    let text = backend.etcd()?.metrics().await.expect("etcd /metrics");
    let value =
        |name: &str| metric_value(&text, name).unwrap_or_else(|| panic!("no `{name}` in etcd's /metrics"));
    // Etcd 3.4 has both range counters (the debugging one is older); an etcd with neither, or
    // without the process collector, records null (NaN becomes null in JSON).
    let optional =
        |names: &[&str]| names.iter().find_map(|name| metric_value(&text, name)).unwrap_or(f64::NAN);
    Some(ServerCounters {
        proposals: value(PROPOSALS_COMMITTED),
        ranges: optional(&["etcd_mvcc_range_total", "etcd_debugging_mvcc_range_total"]),
        cpu_s: optional(&["process_cpu_seconds_total"]),
    })
}

/// The server's work between two readings, as JSON fields: proposals and ranges per worker,
/// CPU seconds per 1000 workers (null off etcd).
fn server_json(before: Option<ServerCounters>, after: Option<ServerCounters>, n: usize) -> serde_json::Value {
    match (before, after) {
        (Some(a), Some(b)) => serde_json::json!({
            "proposals": (b.proposals - a.proposals) / n as f64,
            "server_ranges": (b.ranges - a.ranges) / n as f64,
            "server_cpu_s": b.cpu_s - a.cpu_s,
            "server_cpu_s_per_1000": (b.cpu_s - a.cpu_s) * 1000.0 / n as f64,
        }),
        _ => serde_json::json!({"proposals": null}),
    }
}

/// `base` with the fields of `extra` added.
fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(base), serde_json::Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

fn per_worker(x: u64, n: usize) -> f64 {
    x as f64 / n as f64
}

fn counts_json(used: &OpCounts, n: usize) -> serde_json::Value {
    serde_json::json!({
        "writes": per_worker(used.writes(), n),
        "reads": per_worker(used.reads(), n),
        "watches": per_worker(used.watches, n),
        "lease_keep_alives": per_worker(used.lease_keep_alives, n),
        "raw": format!("{used:?}"),
    })
}

async fn measure(backend: &common::Backend, n: usize) {
    let label = backend.label();
    let reset = reset_peak_memory();
    let (_, rss_before) = memory();
    let counting = CountingKv::new(backend.kv().await);
    let kv = counting.clone() as Arc<dyn Kv>;
    let mut params = RendezvousParams::new(common::unique("cost"), n, n).expect("valid parameters");
    params.prefix = "/rdzv-bench".into();
    params.timeout = Duration::from_secs(60);

    let before = counting.snapshot();
    let s0 = server(backend).await;
    let created = (0..n).map(|i| {
        let mut p = params.clone();
        p.node_id = Some(format!("w{i}"));
        let kv = kv.clone();
        async move { RendezvousHandler::new(kv, p).await.expect("a worker") }
    });
    let handlers = futures::future::join_all(created).await;
    let setup = counting.snapshot() - before;
    let setup_server = server_json(s0, server(backend).await, n);
    println!(
        "{label} N={n} setup: {:.2} writes/worker, {:.2} reads/worker{}",
        per_worker(setup.writes(), n),
        per_worker(setup.reads(), n),
        setup_server["proposals"]
            .as_f64()
            .map(|p| format!(", {p:.2} etcd proposals/worker"))
            .unwrap_or_default()
    );
    common::record(
        "cost",
        merged(
            serde_json::json!({"backend": label, "workers": n, "round": "setup", "counts": counts_json(&setup, n)}),
            setup_server,
        ),
    );

    for round in [1, 2] {
        let before = counting.snapshot();
        let s0 = server(backend).await;
        let started = Instant::now();
        let tasks: Vec<_> = handlers
            .iter()
            .cloned()
            .map(|h| tokio::spawn(async move { h.next_rendezvous().await }))
            .collect();
        let mut infos: Vec<RendezvousInfo> = Vec::with_capacity(n);
        let mut errors: Vec<String> = Vec::new();
        for t in tasks {
            match t.await.expect("worker task") {
                Ok(info) => infos.push(info),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if !errors.is_empty() {
            // Evidence for whoever fixes it: what the state key says now, and the errors.
            let state = kv.get(&handlers[0].keys().state()).await.ok().and_then(|r| r.kv);
            let summary = state
                .map(|s| {
                    let text = String::from_utf8_lossy(&s.value);
                    let head: String = text.chars().take(160).collect();
                    format!("{} bytes at revision {}: {head}…", s.value.len(), s.mod_revision)
                })
                .unwrap_or_else(|| "absent".into());
            let mut distinct = errors.clone();
            distinct.sort();
            distinct.dedup();
            eprintln!(
                "{label} N={n} round {round}: {} of {n} workers failed after {:.1?} ({} returned); \
                 errors: {distinct:?}; state key: {summary}",
                errors.len(),
                started.elapsed(),
                infos.len()
            );
            common::record(
                "cost",
                serde_json::json!({"backend": label, "workers": n, "round": round, "failed": errors.len(),
                    "returned": infos.len(), "errors": distinct, "state": summary,
                    "seconds": started.elapsed().as_secs_f64()}),
            );
            break;
        }
        let took = started.elapsed();
        let used = counting.snapshot() - before;
        let server_used = server_json(s0, server(backend).await, n);
        let p = server_used["proposals"].as_f64();
        assert!(infos.iter().all(|i| i.world_size == n && i.version == infos[0].version), "one round of {n}");
        let writes = per_worker(used.writes(), n);
        let reads = per_worker(used.reads(), n);
        let slowest =
            |f: fn(&RendezvousInfo) -> Duration| infos.iter().map(f).max().unwrap_or_default().as_secs_f64();
        println!(
            "{label} N={n} round {round}: {took:.3?}; {writes:.2} writes/worker, {reads:.2} reads/worker, \
             {:.2} watches/worker{}; slowest joined {:.3}s frozen {:.3}s ({used:?})",
            per_worker(used.watches, n),
            p.map(|p| format!(
                ", {p:.2} etcd proposals/worker, {:.2} etcd ranges/worker, {:.3} etcd CPU s per 1000 workers",
                server_used["server_ranges"].as_f64().unwrap_or_default(),
                server_used["server_cpu_s_per_1000"].as_f64().unwrap_or_default()
            ))
            .unwrap_or_default(),
            slowest(|i| i.timings.joined),
            slowest(|i| i.timings.frozen),
        );
        common::record(
            "cost",
            merged(
                serde_json::json!({"backend": label, "workers": n, "round": round,
                    "seconds": took.as_secs_f64(), "counts": counts_json(&used, n),
                    "max_joined": slowest(|i| i.timings.joined), "max_frozen": slowest(|i| i.timings.frozen),
                    "max_completed": slowest(|i| i.timings.completed)}),
                server_used,
            ),
        );
    }
    let (hwm, _) = memory();
    println!(
        "{label} N={n} memory: peak {:.1} MiB (VmHWM{}), {:.1} MiB before the workers",
        hwm as f64 / 1024.0,
        if reset { ", reset before this size" } else { ", whole process: reset not allowed" },
        rss_before as f64 / 1024.0
    );
    common::record(
        "cost",
        serde_json::json!({"backend": label, "workers": n, "round": "memory",
            "vmhwm_kib": hwm, "rss_before_kib": rss_before, "peak_reset": reset}),
    );
    // All handlers leave at once on the one client: every request of it must still succeed.
    let started = Instant::now();
    let gone = handlers.iter().map(|h| h.shutdown());
    let mut errors: Vec<String> = Vec::new();
    for r in futures::future::join_all(gone).await {
        if let Err(e) = r {
            errors.push(e.to_string());
        }
    }
    let took = started.elapsed();
    let failed = errors.len();
    errors.sort();
    errors.dedup();
    if failed > 0 {
        eprintln!("{label} N={n}: {failed} of {n} workers could not leave: {errors:?}");
    }
    println!("{label} N={n} leave: {took:.3?}, {failed} failed");
    common::record(
        "cost",
        serde_json::json!({"backend": label, "workers": n, "round": "leave", "seconds": took.as_secs_f64(),
            "failed_leaves": failed, "errors": errors}),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut sizes: Vec<usize> = if common::quick() { vec![16, 64] } else { SIZES.to_vec() };
    let mut only: Option<String> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--sizes" => {
                let list = it.next().expect("--sizes needs a list like 16,64");
                sizes = list.split(',').map(|s| s.trim().parse().expect("--sizes: numbers")).collect();
            }
            "--backends" => only = Some(it.next().expect("--backends needs a list like mem,etcd").clone()),
            other => eprintln!("cost: ignoring argument `{other}`"),
        }
    }
    let rt = common::runtime();
    rt.block_on(async {
        let backends = match only {
            Some(list) => common::backends_from(&list).await,
            None => common::backends().await,
        };
        for backend in &backends {
            for &n in &sizes {
                measure(backend, n).await;
            }
        }
    });
}
