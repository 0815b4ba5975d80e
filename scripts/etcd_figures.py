#!/usr/bin/env python3
"""Figures on a local etcd started here (scripts/multiproc.py's `Etcd`), with the `rdzv` binary.

usage:
  etcd_figures.py clients --rdzv BIN --workers 1024 --runs 3 --out FILE
  etcd_figures.py detect  --rdzv BIN --workers 8 --ttls 2,5,10 --runs 2 --out FILE
  etcd_figures.py promote --rdzv BIN --workers 4 --ttls 3,10 --runs 5 --out FILE
  etcd_figures.py drain   --rdzv BIN --workers 3 --intervals 1,5 --runs 5 --out FILE
  etcd_figures.py killone --rdzv BIN --workers 4096 --ttl 3 --runs 3 --out FILE
  etcd_figures.py ceiling --rdzv BIN --sizes 8192,16384,24576,32768,40960,49152 --out FILE
  etcd_figures.py ratio   --rdzv BIN --small 8192 --large 98304 --runs 4 --out FILE
  etcd_figures.py segments --rdzv BIN --sizes 1024,8192 --labels 64 --runs 6 --out FILE

clients: `rdzv bench URL --workers N --rounds 1 --client-per-worker --format json`, each worker
  with its own client and connections (what the server sees from N hosts). Records the round's
  latency, the bench's client-side writes and reads per worker, and the server's side around the
  whole command (creating the N clients and sessions, the round, leaving): etcd's committed
  proposals and key ranges read per worker and its CPU seconds per 1000 workers.

detect: N `rdzv join URL --hold … --format json` processes with keep_alive_ttl=T form one round
  (min = N - 1, max = N, last_call_timeout=1s); then one of them (not rank 0) is killed with
  SIGKILL, and each survivor's stderr is watched for its "round … is over" line (the round-broken
  notification, `Rendezvous::round_broken`) and its stdout for the next round (N - 1 workers).
  Records, per TTL and run, the time from the kill to the first and the last survivor told,
  and to the last survivor in the next round.

promote: N `rdzv join URL --hold … --format json` processes with keep_alive_ttl=T form a full
  round (min = max = N), then one more joins and waits as a spare; a member (not rank 0) is
  killed with SIGKILL, and the spare's stdout is watched for its first round. Records, per TTL
  and run, the time from the kill to the spare's round, whether the spare took the dead
  member's rank, and whether every survivor kept its own.

drain: N `rdzv run URL --health-check …` agents (keep_alive_ttl 10 s, failures 2, check timeout
  5 s, --grace-period 2 s) form a full round (min = max = N), one more agent waits as a spare;
  each runs one worker that ignores SIGTERM (so stopping it takes the whole grace period). The
  health check of a member (not rank 0) then starts failing. Records, per check interval and
  run, the time from the check turning bad to the spare's worker starting, whether the spare
  took the drained member's group rank and every survivor kept its own, and the time until the
  drained node's worker was gone.

killone: `rdzv bench URL --workers N --rounds 1 --kill-one --format json` (N in-process workers on
  one client, keep_alive_ttl=T): after a round, one member is cut off (all its calls fail, as for
  a dead node) while one more worker waits as a spare. Records the round's time, when the
  survivors were told (first and last) and when the next round, the spare in its place, formed.

ceiling: `rdzv bench URL --workers N --rounds 1 --format json` for each N in turn, each on a
  fresh etcd with its default limits, until one fails (or all complete). Before each N it waits
  until the 1-minute load average is under --quiet-load (the previous size's own tail; at most
  --quiet-wait seconds, then it goes on and the record says so). Records for each N whether it
  completed, the round's time, the error of a failure, the load averages before it, and the
  server's cost per 1000 workers: CPU seconds, committed proposals and the database size.

ratio: the ceiling's bench of --small and of --large workers in turn, --runs times each, each
  on a fresh etcd and started once the machine is quiet (as the ceiling's sizes). Records each
  run as the ceiling does, with its `run`; plot.py gives the ratio of the medians (issue 43:
  t(98,304) <= 12 x t(8,192)), since single runs here spread by +-20 %.

segments: `rdzv bench URL --workers N --rounds 1 --format json` on one client, without segments,
  with `--segments L` (worker i labelled `s<i mod L>`: the labels arrive interleaved), and with
  those labels admitted as whole segments (`segment_size=N/L` in the URL),
  alternating, each on the same etcd. Records, per N, labelling and run, the round's time, the
  bench's writes and reads per worker and etcd's proposals and ranges per worker, with the
  1-minute load average before the run.

Results: one JSON line per run, appended to FILE.
"""

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# Importing multiproc.py would otherwise leave a scripts/__pycache__ in the work tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multiproc import Etcd, proc_stat, show  # noqa: E402


def delta(before, after, key, n, scale=1.0):
    if before.get(key) is None or after.get(key) is None:
        return None
    return (after[key] - before[key]) * scale / n


def raise_open_files(want):
    """Raises the soft limit on open files to `want` (or the hard limit, if lower), for this
    process and what it starts: each worker holds about 3 open files here (2 connections to
    etcd) and etcd one per connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def clients(a):
    open_files = raise_open_files(max(16384, 4 * a.workers))
    etcd = Etcd()
    try:
        with open(a.out, "a") as out:
            for run in range(a.runs):
                r = bench_once(etcd, a, a.workers, "", ["--client-per-worker"])
                r.update({"run": run, "open_files": open_files})
                print(f"clients N={a.workers} run {run}: "
                      + (f"round {r['seconds']:.3f}s, " if "seconds" in r else f"FAILED ({r['failed'][:200]}), ")
                      + f"whole command {r['wall_seconds']:.1f}s, {show(r['proposals_per_worker'])} proposals/worker, "
                      f"{show(r['ranges_per_worker'])} ranges/worker, etcd CPU {show(r['server_cpu_s'])} s", flush=True)
                out.write(json.dumps(r) + "\n")
                out.flush()
    finally:
        etcd.stop()


def bench_once(etcd, a, n, query, extra):
    """One `rdzv bench` of `n` workers on `etcd`; the record of it, with the server's side."""
    run_id = f"{a.what}-{os.getpid()}-{n}-{time.time_ns()}"
    url = f"etcd://{etcd.hosts}/{run_id}?timeout={a.timeout:.0f}s{query}"
    before = etcd.counters()
    started = time.monotonic()
    try:
        p = subprocess.run([a.rdzv, "bench", url, "--workers", str(n), "--rounds", "1", "--format", "json", *extra],
                           capture_output=True, text=True, timeout=a.timeout + 120)
        code, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code, stdout, stderr = None, "", f"timed out after {a.timeout + 120:.0f} s: {e.stderr or ''}"
    wall = time.monotonic() - started
    after = etcd.counters()
    r = {"workers": n, "wall_seconds": wall,
         "proposals_per_worker": delta(before, after, "proposals", n),
         "ranges_per_worker": delta(before, after, "ranges", n),
         "server_cpu_s": delta(before, after, "cpu_s", 1),
         "server_cpu_s_per_1000": delta(before, after, "cpu_s", n, 1000.0),
         "proposals_per_1000": delta(before, after, "proposals", n, 1000.0),
         "db_bytes": after.get("db_bytes"), "etcd_version": etcd.version()}
    report = None
    if code == 0:
        try:
            report = json.loads(stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            report = None
    if report is None:
        tail = stderr.strip()[-400:] if isinstance(stderr, str) else str(stderr)[-400:]
        r["failed"] = f"exit {code}: {tail or stdout.strip()[-400:]}"
    else:
        r.update({"clients": report.get("clients"),
                  "seconds": report["latency_ms"]["max"] / 1000.0, "peak_memory_kib": report.get("peak_memory_kib"),
                  "writes_per_worker_round": report["writes_per_worker_round"],
                  "reads_per_worker_round": report["reads_per_worker_round"],
                  "keys_visited_per_worker_round": report.get("keys_visited_per_worker_round"),
                  "failure": report.get("failure")})
    return r


def segments(a):
    etcd = Etcd()
    try:
        with open(a.out, "a") as out:
            for n in [int(x) for x in a.sizes.split(",")]:
                variants = [(0, None), (a.labels, None), (a.labels, n // a.labels)]
                for run in range(a.runs):
                    # Each run starts with another variant: a machine that warms up over a run's
                    # three rounds (its own load) would otherwise always favour the first.
                    shift = run % len(variants)
                    for labels, whole in variants[shift:] + variants[:shift]:
                        load = os.getloadavg()[0]
                        extra = ["--segments", str(labels)] if labels else []
                        r = bench_once(etcd, a, n, f"&segment_size={whole}" if whole else "", extra)
                        r.update({"run": run, "labels": labels, "segment_size": whole, "load_before": load})
                        print(f"segments N={n} labels={labels} segment_size={whole} run {run} (load {load:.2f}): "
                              + (f"round {r['seconds']:.3f}s, writes {r['writes_per_worker_round']:.2f}, "
                                 f"reads {r['reads_per_worker_round']:.2f} per worker"
                                 if "seconds" in r else f"FAILED ({r['failed'][:200]})"), flush=True)
                        out.write(json.dumps(r) + "\n")
                        out.flush()
    finally:
        etcd.stop()


def killone(a):
    raise_open_files(16384)
    etcd = Etcd()
    try:
        with open(a.out, "a") as out:
            for run in range(a.runs):
                r = bench_once(etcd, a, a.workers, f"&keep_alive_ttl={a.ttl:g}s", ["--kill-one"])
                r.update({"run": run, "ttl_s": a.ttl})
                f = r.get("failure") or {}
                print(f"killone N={a.workers} TTL {a.ttl:g}s run {run}: "
                      + (f"round {r['seconds']:.2f}s, told {f.get('told_first_s', 0):.2f}-{f.get('told_last_s', 0):.2f}s, "
                         f"formed {f.get('formed_s', 0):.2f}s" if "seconds" in r else f"FAILED ({r['failed'][:200]})"),
                      flush=True)
                out.write(json.dumps(r) + "\n")
                out.flush()
    finally:
        etcd.stop()


def loadavg():
    """The load averages over 1, 5 and 15 minutes, as /proc/loadavg gives them."""
    return " ".join(open("/proc/loadavg").read().split()[:3])


def wait_until_quiet(bound, longest):
    """Waits until the 1-minute load average is under `bound`, at most `longest` seconds; the
    load averages (1, 5, 15 min) then, and whether the machine was quiet."""
    deadline = time.monotonic() + longest
    # One reading decides and is recorded: the kernel's unrounded figure could be under the
    # bound while the two decimals that /proc/loadavg shows equal it (0.899 read as 0.90), which
    # went on as quiet and was recorded as not.
    while float((load := loadavg()).split()[0]) >= bound and time.monotonic() < deadline:
        time.sleep(5)
    return load, float(load.split()[0]) < bound


def quiet_bench(a, n):
    """One ceiling-style bench of `n` workers on a fresh etcd, started once the machine is quiet."""
    load, quiet = wait_until_quiet(a.quiet_load, a.quiet_wait)
    etcd = Etcd()
    try:
        r = bench_once(etcd, a, n, "", [])
    finally:
        etcd.stop()
    r.update({"load_before": load, "quiet": quiet, "quiet_load": a.quiet_load})
    if not quiet:
        print(f"N={n}: started at load {load} after waiting {a.quiet_wait:.0f} s for "
              f"{a.quiet_load}: not for the record", flush=True)
    return r


def ratio(a):
    raise_open_files(16384)
    with open(a.out, "a") as out:
        for run in range(a.runs):
            for n in (a.small, a.large):
                r = quiet_bench(a, n)
                r["run"] = run
                print(f"ratio N={n} run {run} (load {r['load_before']}): "
                      + (f"round {r['seconds']:.2f}s" if "seconds" in r else f"FAILED ({r['failed'][:300]})"),
                      flush=True)
                out.write(json.dumps(r) + "\n")
                out.flush()


def ceiling(a):
    raise_open_files(16384)
    with open(a.out, "a") as out:
        for n in [int(x) for x in a.sizes.split(",")]:
            r = quiet_bench(a, n)
            print(f"ceiling N={n}: " + (f"round {r['seconds']:.2f}s, " if "seconds" in r else f"FAILED ({r['failed'][:300]}), ")
                  + f"etcd CPU {show(r['server_cpu_s_per_1000'])} s, {show(r['proposals_per_1000'])} proposals per 1000 workers, "
                  f"DB {show(r['db_bytes'])} bytes", flush=True)
            out.write(json.dumps(r) + "\n")
            out.flush()
            if "failed" in r:
                break


class Worker:
    """One `rdzv join` process whose output lines are timestamped as they arrive."""

    def __init__(self, cmd, index):
        self.index = index
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.rounds = []  # (time, parsed JSON line)
        self.errors = []  # (time, line)
        self.changed = threading.Condition()
        for stream, sink, parse in ((self.proc.stdout, self.rounds, True), (self.proc.stderr, self.errors, False)):
            threading.Thread(target=self._read, args=(stream, sink, parse), daemon=True).start()

    def _read(self, stream, sink, parse):
        for line in stream:
            now = time.monotonic()
            value = line.strip()
            if parse:
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    continue
            with self.changed:
                sink.append((now, value))
                self.changed.notify_all()

    def wait_for(self, predicate, deadline):
        with self.changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not predicate(self):
                    return predicate(self)
                self.changed.wait(min(left, 0.2))
            return True

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: it leaves the run
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def told(w):
    return next((t for t, line in w.errors if "is over" in line), None)


def detect_once(etcd, a, ttl, run):
    n = a.workers
    run_id = f"detect-{os.getpid()}-{ttl}-{run}-{time.time_ns()}"
    url = (f"etcd://{etcd.hosts}/{run_id}?min_workers={n - 1}&max_workers={n}&keep_alive_ttl={ttl}s"
           f"&last_call_timeout=1s&timeout=120s")
    workers = [Worker([a.rdzv, "join", url, "--hold", "600s", "--format", "json", "--node-id", f"w{i}"], i)
               for i in range(n)]
    r = {"workers": n, "ttl_s": ttl, "run": run}
    try:
        deadline = time.monotonic() + 60
        if not all(w.wait_for(lambda w: w.rounds, deadline) for w in workers):
            r["failed"] = "the first round did not form within 60 s: " + "; ".join(
                line for w in workers for _, line in w.errors[-1:])[:400]
            return r
        sizes = {w.rounds[0][1].get("world_size") for w in workers}
        if sizes != {n}:
            r["failed"] = f"the first round had world sizes {sorted(sizes)}, not {n}"
            return r
        victim = next(w for w in workers if w.rounds[0][1].get("rank") not in (0, None))
        survivors = [w for w in workers if w is not victim]
        # Kill it a little after the round formed, so that its lease refreshes are in their
        # steady rhythm (the detection time depends on when its last refresh went out).
        time.sleep(a.after)
        killed = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        deadline = killed + 3 * ttl + 30
        for w in survivors:
            w.wait_for(lambda w: told(w) is not None and len(w.rounds) >= 2, deadline)
        notices = [told(w) for w in survivors]
        nexts = [w.rounds[1][0] if len(w.rounds) >= 2 else None for w in survivors]
        if any(t is None for t in notices):
            r["failed"] = (f"{sum(t is None for t in notices)} of {len(survivors)} survivors were not told "
                           f"within {3 * ttl + 30} s")
            return r
        notices = [t - killed for t in notices]
        r.update({"told_first_s": min(notices), "told_median_s": statistics.median(notices),
                  "told_last_s": max(notices),
                  # `rdzv: round V is over (WHY); joining the next round`
                  "reasons": sorted({line.split(" is over (", 1)[-1].rsplit("); joining", 1)[0]
                                     for w in survivors for _, line in w.errors if "is over" in line})})
        if all(t is not None for t in nexts):
            r["next_round_last_s"] = max(nexts) - killed
            r["next_world_sizes"] = sorted({w.rounds[1][1].get("world_size") for w in survivors})
        return r
    finally:
        for w in workers:
            w.stop()


def spares_now(a, url):
    """How many spares `rdzv status` sees in the run."""
    p = subprocess.run([a.rdzv, "status", url, "--format", "json"], capture_output=True, text=True, timeout=30)
    try:
        return json.loads(p.stdout).get("spares_count", 0)
    except json.JSONDecodeError:
        return 0


def promote_once(etcd, a, ttl, run):
    n = a.workers
    run_id = f"promote-{os.getpid()}-{ttl}-{run}-{time.time_ns()}"
    url = f"etcd://{etcd.hosts}/{run_id}?min_workers={n}&keep_alive_ttl={ttl}s&timeout=120s"
    join = lambda i: Worker([a.rdzv, "join", url, "--hold", "600s", "--format", "json", "--node-id", f"w{i}"], i)
    members = [join(i) for i in range(n)]
    spare = None
    r = {"workers": n, "ttl_s": ttl, "run": run}
    try:
        deadline = time.monotonic() + 60
        if not all(w.wait_for(lambda w: w.rounds, deadline) for w in members):
            r["failed"] = "the first round did not form within 60 s"
            return r
        first = {w.index: w.rounds[0][1]["rank"] for w in members}
        spare = join(n)
        waited = time.monotonic() + 30
        while spares_now(a, url) < 1:
            if time.monotonic() > waited:
                r["failed"] = "the spare was not seen waiting within 30 s"
                return r
            time.sleep(0.1)
        time.sleep(a.after)
        victim = next(w for w in members if first[w.index] != 0)
        killed = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        if not spare.wait_for(lambda w: w.rounds, killed + 3 * ttl + 30):
            r["failed"] = f"the spare was not admitted within {3 * ttl + 30} s"
            return r
        at, promoted = spare.rounds[0]
        r["promoted_s"] = at - killed
        r["spare_took_the_rank"] = promoted["rank"] == first[victim.index]
        survivors = [w for w in members if w is not victim]
        for w in survivors:
            w.wait_for(lambda w: len(w.rounds) >= 2, killed + 3 * ttl + 30)
        r["survivors_kept_ranks"] = all(len(w.rounds) >= 2 and w.rounds[1][1]["rank"] == first[w.index]
                                        for w in survivors)
        r["version"] = promoted["version"]
        return r
    finally:
        for w in members + [spare] * (spare is not None):
            w.stop()


def drain_once(etcd, a, interval, run):
    n, ttl, grace = a.workers, 10, 2
    run_id = f"drain-{os.getpid()}-{interval}-{run}-{time.time_ns()}"
    url = f"etcd://{etcd.hosts}/{run_id}?min_workers={n}&keep_alive_ttl={ttl}s&timeout=120s"
    scratch = tempfile.mkdtemp(prefix="rdzv-drain-")
    ward, out = os.path.join(scratch, "ward"), os.path.join(scratch, "out")
    os.makedirs(ward)
    os.makedirs(out)
    # Each start: a file named node-version-group_rank holding the start time (and the pid).
    worker = ('trap "" TERM; echo "$(date +%s.%N) $$" > "$DRAIN_OUT/$RDZV_NODE_ID-$RDZV_VERSION-$GROUP_RANK"; '
              "exec sleep 600")

    def agent(i):
        env = dict(os.environ, DRAIN_WARD=ward, DRAIN_OUT=out, DRAIN_NODE=f"w{i}")
        cmd = [a.rdzv, "run", url, "--node-id", f"w{i}", "--local-addr", "127.0.0.1",
               "--health-check", 'test ! -e "$DRAIN_WARD/sick-$DRAIN_NODE"',
               "--health-check-interval", f"{interval}s", "--health-check-failures", "2",
               "--health-check-timeout", "5s", "--grace-period", f"{grace}s", "--", "sh", "-c", worker]
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def starts():
        found = {}
        for name in os.listdir(out):
            node, version, rank = name.rsplit("-", 2)
            written = open(os.path.join(out, name)).read().split()
            if len(written) == 2:  # else still being written
                found[(node, int(version))] = (int(rank), float(written[0]), int(written[1]))
        return found

    def until(done, seconds):
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    agents = [agent(i) for i in range(n)]
    r = {"workers": n, "interval_s": interval, "failures": 2, "grace_s": grace, "ttl_s": ttl, "run": run}
    try:
        if not until(lambda: len(starts()) >= n, 60):
            r["failed"] = "the first round's workers did not all start within 60 s"
            return r
        first = {node: rank for (node, _), (rank, _, _) in starts().items()}
        agents.append(agent(n))
        if not until(lambda: spares_now(a, url) >= 1, 30):
            r["failed"] = "the spare was not seen waiting within 30 s"
            return r
        time.sleep(1)
        victim = next(node for node, rank in first.items() if rank != 0)
        victim_pid = next(pid for (node, _), (_, _, pid) in starts().items() if node == victim)
        sick_at = time.time()
        open(os.path.join(ward, f"sick-{victim}"), "w").close()
        spare = f"w{n}"
        bound = interval * 2 + grace + 30
        if not until(lambda: any(node == spare for node, _ in starts()), bound):
            r["failed"] = f"the spare's worker did not start within {bound} s"
            return r
        spare_version = next(ver for (node, ver) in starts() if node == spare)
        rank, stamp, _ = starts()[(spare, spare_version)]
        r["replaced_s"] = stamp - sick_at
        r["spare_took_the_rank"] = rank == first[victim]
        until(lambda: all((node, spare_version) in starts() for node in first if node != victim), 30)
        second = {node: rank for (node, ver), (rank, _, _) in starts().items() if ver == spare_version}
        r["survivors_kept_ranks"] = all(second.get(node) == rank for node, rank in first.items() if node != victim)
        # Gone, or a zombie (its parent has not reaped it yet).
        if until(lambda: (proc_stat(victim_pid) or ["Z"])[0] == "Z", 30):
            r["victim_worker_gone_s"] = time.time() - sick_at
        return r
    finally:
        for p in agents:
            if p.poll() is None:
                p.terminate()
        for p in agents:
            try:
                p.wait(grace + 15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def drain(a):
    per_value(a, "interval", a.intervals, drain_once, lambda r: (
        f"spare's worker started {r['replaced_s']:.2f} s after the check turned bad, took the rank: "
        f"{r['spare_took_the_rank']}, survivors kept theirs: {r['survivors_kept_ranks']}, drained worker gone "
        f"after {r.get('victim_worker_gone_s', float('nan')):.2f} s"))


def per_ttl(a, once, describe):
    """Runs `once(etcd, a, ttl, run)` for every TTL of `a.ttls` and run (see `per_value`)."""
    per_value(a, "ttl", a.ttls, once, describe)


def per_value(a, name, values, once, describe):
    """Runs `once(etcd, a, value, run)` for every value of the comma-separated `values` (seconds)
    and run, on one local etcd, appending each result to `a.out` and printing `describe(result)`
    (or its failure)."""
    etcd = Etcd()
    try:
        with open(a.out, "a") as out:
            for value in [float(v) for v in values.split(",")]:
                value = int(value) if value == int(value) else value
                for run in range(a.runs):
                    r = once(etcd, a, value, run)
                    r["etcd_version"] = etcd.version()
                    r["load"] = loadavg()
                    r["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                    print(f"{a.what} N={a.workers} {name}={value}s run {run}: "
                          + (describe(r) if "failed" not in r else f"FAILED: {r['failed']}"), flush=True)
                    out.write(json.dumps(r) + "\n")
                    out.flush()
    finally:
        etcd.stop()


def promote(a):
    per_ttl(a, promote_once, lambda r: f"spare in after {r['promoted_s']:.2f} s, took the rank: "
            f"{r['spare_took_the_rank']}, survivors kept theirs: {r['survivors_kept_ranks']}")


def detect(a):
    per_ttl(a, detect_once, lambda r: f"told after {r['told_first_s']:.2f}–{r['told_last_s']:.2f} s, next round of "
            f"{r.get('next_world_sizes')} after {r.get('next_round_last_s', float('nan')):.2f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("clients", help="rdzv bench --client-per-worker on etcd")
    c.add_argument("--workers", type=int, default=1024)
    c.add_argument("--runs", type=int, default=3)
    c.add_argument("--timeout", type=float, default=300, help="the rendezvous timeout, seconds")
    d = sub.add_parser("detect", help="time for survivors to learn of a SIGKILLed member")
    d.add_argument("--workers", type=int, default=8)
    d.add_argument("--ttls", default="2,5,10", help="keep_alive_ttl values, seconds")
    d.add_argument("--runs", type=int, default=2)
    d.add_argument("--after", type=float, default=1.0, help="seconds between the round and the kill")
    s = sub.add_parser("promote", help="time for a spare to take a SIGKILLed member's place")
    s.add_argument("--workers", type=int, default=4, help="members of the full round (a spare comes on top)")
    s.add_argument("--ttls", default="3,10", help="keep_alive_ttl values, seconds")
    s.add_argument("--runs", type=int, default=5)
    s.add_argument("--after", type=float, default=1.0, help="seconds between the spare waiting and the kill")
    dr = sub.add_parser("drain", help="time for a spare to replace a member whose health check fails")
    dr.add_argument("--workers", type=int, default=3, help="members of the full round (a spare comes on top)")
    dr.add_argument("--intervals", default="1,5", help="--health-check-interval values, seconds")
    dr.add_argument("--runs", type=int, default=5)
    k = sub.add_parser("killone", help="in-process workers on etcd, one cut off, a spare takes its place")
    k.add_argument("--workers", type=int, default=4096)
    k.add_argument("--ttl", type=float, default=3.0, help="keep_alive_ttl, seconds")
    k.add_argument("--runs", type=int, default=3)
    k.add_argument("--timeout", type=float, default=300, help="the rendezvous timeout, seconds")
    g = sub.add_parser("ceiling", help="the largest N of in-process workers that completes on one etcd")
    g.add_argument("--sizes", default="8192,16384,24576,32768,40960,49152")
    r = sub.add_parser("ratio", help="the round time of --large over that of --small, medians of quiet runs")
    r.add_argument("--small", type=int, default=8192)
    r.add_argument("--large", type=int, default=98304)
    r.add_argument("--runs", type=int, default=4)
    for p in (g, r):
        p.add_argument("--timeout", type=float, default=300, help="the rendezvous timeout, seconds")
        p.add_argument("--quiet-load", type=float, default=0.9,
                       help="start each bench once the 1-minute load average is under this")
        p.add_argument("--quiet-wait", type=float, default=600, help="the longest wait for it, seconds")
    sg = sub.add_parser("segments", help="in-process workers on etcd with and without segment labels")
    sg.add_argument("--sizes", default="1024,8192")
    sg.add_argument("--labels", type=int, default=64)
    sg.add_argument("--runs", type=int, default=3)
    sg.add_argument("--timeout", type=float, default=300, help="the rendezvous timeout, seconds")
    for p in (c, d, s, dr, k, g, r, sg):
        p.add_argument("--rdzv", required=True, help="the rdzv binary")
        p.add_argument("--out", required=True)
    a = ap.parse_args()
    {"clients": clients, "detect": detect, "promote": promote, "drain": drain, "killone": killone,
     "ceiling": ceiling, "ratio": ratio, "segments": segments}[a.what](a)


if __name__ == "__main__":
    main()
