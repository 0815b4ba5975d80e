#!/usr/bin/env python3
"""Where a round's time goes: one `rdzv bench` on a fresh local etcd, sampled as it runs.

Usage:
  round_timeline.py --rdzv BIN --workers 98304 [--runs 3] [--query '&keep_alive_ttl=600s'] [--gctrace] --out FILE

Each run waits until the 1-minute load average is under --quiet-load (at most --quiet-wait
seconds), starts etcd (scripts/multiproc.py's `Etcd`, data on tmpfs) and `rdzv bench
'etcd://…' --workers N --rounds 1 --format json`, and samples every 0.1 s the CPU time of
the bench, of its `rdzv-keepalive` thread (the sessions' refreshes) and of etcd, with both
processes' minor page faults and resident memory and the machine's CPU from /proc/stat, and
every 0.5 s etcd's counters (leases granted, revoked and renewed, ranges, transactions). The
round is the stretch from the first read after every session was granted to the first revoke
(the bench shuts its workers down right after the round), to 0.5 s; a round much shorter
than a second (a few thousand workers here) may fall between two readings and is then
reported as not found. Printed and recorded per run: the round's time as the bench measured
it, the CPU each side spent in the round per worker, the operations per worker, each side's
page faults per worker and resident MiB at the round's start and end, the seconds in which
the client alone worked (a 0.1 s sample with the client above two thirds of the machine's
cores and etcd under a fifth), and the machine's core-seconds in the round: busy, idle, in
softirq and stolen by the host, and what other processes took (busy less the two sides; this
script's sampling included). With --gctrace, etcd runs with GODEBUG=gctrace=1 and each run
also records its garbage collections inside the round: how many, their CPU by Go's count
(idle-time marking included), and the live heap after each.

Results: one JSON line per run (summary and samples), appended to FILE.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

# Importing the sibling scripts would otherwise leave a scripts/__pycache__ in the work tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from etcd_figures import wait_until_quiet  # noqa: E402
from multiproc import CLK_TCK, Etcd, cpu_seconds, metric, proc_stat  # noqa: E402

COUNTERS = {
    "etcd_debugging_lease_granted_total": "grants",
    "etcd_debugging_lease_revoked_total": "revokes",
    "etcd_debugging_lease_renewed_total": "renews",
    "etcd_mvcc_range_total": "ranges",
    "etcd_mvcc_txn_total": "txns",
}


def counters(metrics_port):
    """etcd's counters of COUNTERS, by short name (those it has)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = {short: metric(text, name) for name, short in COUNTERS.items()}
    return {short: value for short, value in found.items() if value is not None}


def thread_cpu(pid, name):
    """CPU seconds of the threads of `pid` called `name`, or None."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
        except OSError:
            continue
        total += cpu_seconds(pid, tid) or 0.0
    return total


PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def machine_cpu():
    """The machine's CPU seconds so far, all cores together, from /proc/stat's `cpu` line:
    {"busy", "idle", "softirq", "steal"} (busy counts softirq and not steal; idle counts
    iowait) (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    seconds = lambda t: t / CLK_TCK
    return {"busy": seconds(user + nice + system + irq + softirq), "idle": seconds(idle + iowait),
            "softirq": seconds(softirq), "steal": seconds(steal)}


def faults_and_rss(pid):
    """(minor page faults so far, resident MiB) of a process (Linux), or (None, None)."""
    fields = proc_stat(pid)
    try:
        return int(fields[7]), int(fields[21]) * PAGE_MIB
    except (TypeError, IndexError, ValueError):
        return None, None


def sample(a, etcd):
    """One bench of `a.workers` on `etcd`: its report and the samples taken as it ran."""
    url = f"etcd://{etcd.hosts}/timeline-{os.getpid()}-{time.time_ns()}?timeout={a.timeout:.0f}s{a.query}"
    etcd_pid, metrics_port = etcd.pids()[0], etcd.members[0][2]
    started = time.monotonic()
    # Its log goes to a file: a pipe read only at the end would stall a bench that logs more
    # than the pipe holds.
    log = tempfile.TemporaryFile(mode="w+")
    bench = subprocess.Popen([a.rdzv, "bench", url, "--workers", str(a.workers), "--rounds", "1", "--format", "json"],
                             stdout=subprocess.PIPE, stderr=log, text=True)
    samples, tick = [], 0
    while bench.poll() is None:
        row = {"t": round(time.monotonic() - started, 2), "client": cpu_seconds(bench.pid),
               "keepalive": thread_cpu(bench.pid, "rdzv-keepalive"), "etcd": cpu_seconds(etcd_pid),
               "machine": machine_cpu()}
        row["client_faults"], row["client_rss_mib"] = faults_and_rss(bench.pid)
        row["etcd_faults"], row["etcd_rss_mib"] = faults_and_rss(etcd_pid)
        if tick % 5 == 0:
            try:
                row.update(counters(metrics_port))
            except OSError:
                pass
        samples.append(row)
        tick += 1
        time.sleep(0.1)
    out = bench.stdout.read()
    log.seek(0)
    err = log.read()
    log.close()
    if bench.returncode != 0:
        return {"failed": f"exit {bench.returncode}: {err.strip()[-400:]}"}, samples, started
    return json.loads(out.strip().splitlines()[-1]), samples, started


def summary(n, report, samples):
    """The round's window in `samples` and what each side did in it (see the module)."""
    counted = [s for s in samples if "ranges" in s and s["client"] is not None and s["etcd"] is not None]
    start = end = None
    for before, after in zip(counted, counted[1:]):
        if start is None and before.get("grants", 0) >= n and after["ranges"] > before["ranges"]:
            start = before
        elif start is not None and after.get("revokes", 0) > before.get("revokes", 0):
            end = after
            break
    if start is None or end is None:
        return {"failed": "no round found in the samples"}
    cores = os.cpu_count() or 1
    alone, previous = 0.0, None
    for s in samples:
        if previous and start["t"] < s["t"] <= end["t"] and None not in (s["client"], previous["client"], s["etcd"], previous["etcd"]):
            dt = s["t"] - previous["t"]
            if (s["client"] - previous["client"]) / dt > cores * 2 / 3 and (s["etcd"] - previous["etcd"]) / dt < cores / 5:
                alone += dt
        previous = s
    per_worker = lambda key, scale=1.0: round((end[key] - start[key]) * scale / n, 2)
    machine = (lambda key: round(end["machine"][key] - start["machine"][key], 2)
               if None not in (start["machine"], end["machine"]) else None)
    return {
        "seconds": report["latency_ms"]["max"] / 1000.0,
        "window_seconds": round(end["t"] - start["t"], 2),
        "window": [start["t"], end["t"]],
        "client_cpu_us_per_worker": per_worker("client", 1e6),
        "keepalive_cpu_us_per_worker": (per_worker("keepalive", 1e6)
                                        if None not in (start["keepalive"], end["keepalive"]) else None),
        "etcd_cpu_us_per_worker": per_worker("etcd", 1e6),
        "client_alone_seconds": round(alone, 2),
        "machine_core_seconds": machine and {key: machine(key) for key in ("busy", "idle", "softirq", "steal")},
        "others_core_seconds": machine and round(machine("busy") - (end["client"] - start["client"])
                                                 - (end["etcd"] - start["etcd"]), 2),
        "client_faults_per_worker": per_worker("client_faults"),
        "etcd_faults_per_worker": per_worker("etcd_faults"),
        "client_rss_mib": [round(start["client_rss_mib"]), round(end["client_rss_mib"])],
        "etcd_rss_mib": [round(start["etcd_rss_mib"]), round(end["etcd_rss_mib"])],
        **{f"{k}_per_worker": per_worker(k) for k in ("ranges", "txns", "renews")},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rdzv", required=True, help="the rdzv binary (a release build)")
    p.add_argument("--workers", type=int, default=8192)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--query", default="", help="appended to the URL's query, e.g. '&keep_alive_ttl=600s'")
    p.add_argument("--timeout", type=float, default=300, help="the rendezvous timeout, seconds")
    p.add_argument("--quiet-load", type=float, default=0.9)
    p.add_argument("--quiet-wait", type=float, default=600)
    p.add_argument("--gctrace", action="store_true",
                   help="run etcd with GODEBUG=gctrace=1 and record its garbage collections in the round")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.gctrace:
        os.environ["GODEBUG"] = "gctrace=1"
    for run in range(a.runs):
        load, quiet = wait_until_quiet(a.quiet_load, a.quiet_wait)
        etcd = Etcd()
        try:
            report, samples, started = sample(a, etcd)
            etcd_started = process_started(etcd.pids()[0])
            with open(os.path.join(etcd.dir, "etcd-0.log")) as f:
                etcd_log = f.read()
        finally:
            etcd.stop()
        result = report if "failed" in report else summary(a.workers, report, samples)
        if a.gctrace and "failed" not in result:
            result["gc"] = collections_in_round(etcd_log, result["window"], started - etcd_started)
        record = {"workers": a.workers, "run": run, "query": a.query, "load_before": load, "quiet": quiet,
                  "etcd_version": etcd.version(), **result, "samples": samples}
        with open(a.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps({k: v for k, v in record.items() if k != "samples"}), flush=True)


def process_started(pid):
    """When process `pid` started, on `time.monotonic()`'s clock (both count from boot here)."""
    return int(proc_stat(pid)[19]) / os.sysconf("SC_CLK_TCK")


def collections_in_round(log, window, offset):
    """etcd's garbage collections (its `gctrace` lines, timed from its start) inside the
    round's `window` (seconds after the bench started, which is `offset` after etcd did): how
    many, the CPU they took by Go's own count, and the heap after each (MB)."""
    start, end = window
    inside = []
    for m in re.finditer(r"gc \d+ @([\d.]+)s \d+%: [^,]*, ([\d.+/]+) ms cpu, \d+->\d+->(\d+) MB", log):
        at = float(m.group(1)) - offset
        if start <= at <= end:
            inside.append((sum(float(x) for x in re.split(r"[+/]", m.group(2))), int(m.group(3))))
    return {"collections": len(inside), "cpu_seconds": round(sum(c for c, _ in inside) / 1000, 2),
            "live_heap_mb": [heap for _, heap in inside]}


if __name__ == "__main__":
    main()
