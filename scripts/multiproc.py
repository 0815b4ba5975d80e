#!/usr/bin/env python3
"""Multi-process rendezvous benchmark: N separate worker processes, all started at the same
instant against a local etcd started here, min = max = N. One measurement is the time from
the common start (just before the first process is spawned) until the last one exited
after returning its round. Also reads etcd's committed Raft proposals around each run.

usage: multiproc.py --worker BIN [--worker-args ARGS] --sizes 16,64,128 --runs 5 --out FILE

BIN is called as `BIN [ARGS...] <url>` and must print one JSON line when its round completed
(the `join_once` example; `rdzv join … --format json` with --no-gate). Results: one JSON
line per run.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rdzv-bench-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.client, self.peer, self.metrics = free_port(), free_port(), free_port()
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [
                shutil.which("etcd") or "/usr/bin/etcd",
                "--name", "bench",
                "--data-dir", os.path.join(self.dir, "data"),
                "--listen-client-urls", f"http://127.0.0.1:{self.client}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.client}",
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
                "--initial-cluster", f"bench=http://127.0.0.1:{self.peer}",
                "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.client}/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        return
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                sys.exit(f"multiproc: etcd did not start; see its log above ({self.dir})")
            time.sleep(0.1)

    def proposals(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("etcd_server_proposals_committed_total"):
                    return float(line.split()[-1])
        return None

    def version(self):
        out = subprocess.run([shutil.which("etcd") or "/usr/bin/etcd", "--version"], capture_output=True, text=True)
        return out.stdout.splitlines()[0].split(":")[-1].strip() if out.stdout else "?"

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def one_run(etcd, worker, n, run, timeout, gate):
    """One round of n processes. With `gate`, every process is told the same start instant
    (RDZV_START_AT, a little after the last spawn) and waits for it before it connects, so
    the launcher's spawn speed is out of the figure; the time runs from that instant to the
    last worker's end (their clocks are this machine's). Without, from the first spawn."""
    run_id = f"mp-{os.getpid()}-{n}-{run}-{time.time_ns()}"
    url = f"etcd://127.0.0.1:{etcd.client}/{run_id}?min_workers={n}&max_workers={n}&timeout=120s"
    before = etcd.proposals()
    env = dict(os.environ)
    start_at = time.time() + 0.5 + 0.02 * n if gate else None
    if gate:
        env["RDZV_START_AT"] = f"{start_at:.6f}"
    outdir = tempfile.mkdtemp(prefix="rdzv-mp-")
    start = time.monotonic()
    procs = []
    for i in range(n):
        out = open(os.path.join(outdir, f"{i}.out"), "w")
        err = open(os.path.join(outdir, f"{i}.err"), "w")
        procs.append((subprocess.Popen(worker + [url], stdout=out, stderr=err, env=env), out, err))
    spawned = time.monotonic() - start
    failures, reports = [], []
    for i, (p, out, err) in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            failures.append("timeout")
        out.close()
        err.close()
        if p.returncode != 0:
            failures.append(open(os.path.join(outdir, f"{i}.err")).read().strip()[-300:])
            continue
        lines = open(os.path.join(outdir, f"{i}.out")).read().strip().splitlines()
        try:
            reports.append(json.loads(lines[-1]) if lines else {})
        except json.JSONDecodeError:
            reports.append({})
    wall = time.monotonic() - start
    shutil.rmtree(outdir, ignore_errors=True)
    after = etcd.proposals()
    ends = [r["end_unix_s"] for r in reports if "end_unix_s" in r]
    return {
        "workers": n,
        "run": run,
        "gated": gate,
        # From the common start instant (gate) or the first spawn, to the last worker's end.
        "seconds": (max(ends) - start_at) if gate and ends else wall,
        "wall_seconds": wall,
        "spawn_seconds": spawned,
        "max_late_s": max((r.get("late_s", 0) for r in reports), default=None),
        "failures": len(failures),
        "failure_sample": failures[:2],
        "proposals_per_worker": (after - before) / n if before is not None and after is not None else None,
        "max_connect_s": max((r.get("connect_s", 0) for r in reports), default=None),
        "max_completed_s": max((r.get("completed_s", 0) for r in reports), default=None),
        "max_total_s": max((r.get("total_s", 0) for r in reports), default=None),
        "end_spread_s": (max(ends) - min(ends)) if ends else None,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--worker-args", default="")
    ap.add_argument("--sizes", default="16,64,128")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--out", required=True)
    ap.add_argument("--settle", type=float, default=12.0,
                    help="seconds to wait before each size's first run, for earlier leases to expire")
    ap.add_argument("--no-gate", action="store_true",
                    help="time from the first spawn (for workers that do not read RDZV_START_AT)")
    a = ap.parse_args()
    worker = [a.worker] + a.worker_args.split()
    etcd = Etcd()
    try:
        with open(a.out, "a") as out:
            for n in [int(s) for s in a.sizes.split(",")]:
                for run in range(a.runs):
                    if run == 0:
                        # The workers exit without leaving, so their session leases expire
                        # (an etcd proposal each) ~10 s later, inside a later run's window.
                        # The first run of each size starts after those are gone, and only
                        # its proposal count is reported.
                        time.sleep(a.settle)
                    r = one_run(etcd, worker, n, run, a.timeout, not a.no_gate)
                    r["proposals_clean"] = run == 0
                    r["worker"] = " ".join(worker)
                    r["etcd_version"] = etcd.version()
                    print(f"multiproc N={n} run {run}: {r['seconds']:.3f}s (spawning took {r['spawn_seconds']:.2f}s, "
                          f"latest start {r['max_late_s']}s late), "
                          f"{r['proposals_per_worker']} proposals/worker, {r['failures']} failures", flush=True)
                    out.write(json.dumps(r) + "\n")
                    out.flush()
    finally:
        etcd.stop()


if __name__ == "__main__":
    main()
