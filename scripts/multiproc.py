#!/usr/bin/env python3
"""Multi-process rendezvous benchmark: N separate worker processes, all started at the same
instant against a local etcd started here, min = max = N. One measurement is the time from
the common start instant until the last one returned its round (with --no-gate: from the
first spawn until every process had printed its round). Also reads, around each run, etcd's committed Raft proposals, the
key ranges it read (`etcd_mvcc_range_total`) and the CPU time of its process(es) (utime +
stime from /proc/<pid>/stat).

usage: multiproc.py --worker BIN [--worker-args ARGS] --sizes 16,64,128 --runs 5 --out FILE
                    [--members 3] [--data-on-disk [--data-parent DIR]] [--label NAME]

--members 3 starts a cluster of three etcd processes on loopback (the URL lists all three);
--data-on-disk puts etcd's data directory on disk (default parent: the system's temporary
directory) instead of tmpfs (/dev/shm), so every commit waits for an fsync.

BIN is called as `BIN [ARGS...] <url>` and must print one JSON line when its round completed
(the `join_once` example; `rdzv join … --format json` with --no-gate). Results: one JSON
line per run, with etcd's proposals per worker twice: to the round (every process printed)
and to the end (every process exited, its leave included).
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


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(pid, tid=None):
    """The fields of /proc/PID/stat (or of its thread `tid`) from field 3, the state, on
    (field N is at index N - 3), or None (Linux)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces: count from its closing parenthesis.
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid, tid=None):
    """utime + stime of a process (or of its thread `tid`), in seconds (Linux), or None."""
    fields = proc_stat(pid, tid)
    try:
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (TypeError, IndexError, ValueError):
        return None


def metric(text, name):
    """The value of an unlabelled Prometheus metric, or None."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


# Ends etcd and removes its data when the script dies without `Etcd.stop` (SIGKILL, a closed
# terminal), which used to leave etcd running and, on tmpfs, its data in memory. It reads the
# members' process ids, one a line, until the end of its stdin: only the kernel closes that,
# when the script dies, since `stop` kills the reaper first.
REAPER = r"""
pids=
while read -r pid; do pids="$pids $pid"; done
[ -n "$pids" ] || exit 0
kill $pids 2>/dev/null
sleep 5
kill -9 $pids 2>/dev/null
rm -rf "$0"
"""


class Etcd:
    """A local etcd of `members` processes on loopback, data on tmpfs (or on disk)."""

    def __init__(self, members=1, on_disk=False, data_parent=None):
        parent = data_parent if on_disk else ("/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.dir = tempfile.mkdtemp(prefix="rdzv-bench-etcd-", dir=parent)
        self.on_disk = on_disk
        self.reaper = subprocess.Popen(["/bin/sh", "-c", REAPER, self.dir], stdin=subprocess.PIPE, text=True,
                                       start_new_session=True)
        ports = [(free_port(), free_port(), free_port()) for _ in range(members)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer, _) in enumerate(ports))
        self.members = []  # (process, client port, metrics port, log)
        for i, (client, peer, metrics_port) in enumerate(ports):
            log = open(os.path.join(self.dir, f"etcd-{i}.log"), "w")
            proc = subprocess.Popen(
                [
                    shutil.which("etcd") or "/usr/bin/etcd",
                    "--name", f"m{i}",
                    "--data-dir", os.path.join(self.dir, f"data-{i}"),
                    "--listen-client-urls", f"http://127.0.0.1:{client}",
                    "--advertise-client-urls", f"http://127.0.0.1:{client}",
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", cluster,
                    "--initial-cluster-state", "new",
                    "--initial-cluster-token", os.path.basename(self.dir),
                    "--listen-metrics-urls", f"http://127.0.0.1:{metrics_port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.members.append((proc, client, metrics_port, log))
            self.reaper.stdin.write(f"{proc.pid}\n")
            self.reaper.stdin.flush()
        self.client = ports[0][0]
        # The URL's host part: every member (etcd clients spread over them and fail over).
        self.hosts = ",".join(f"127.0.0.1:{client}" for client, _, _ in ports)
        deadline = time.time() + 60
        for proc, client, _, _ in self.members:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                        if b'"true"' in r.read():
                            break
                except OSError:
                    pass
                if time.time() > deadline or proc.poll() is not None:
                    logs = self.dir
                    self.stop(keep=True)
                    sys.exit(f"multiproc: etcd did not start; see its logs in {logs}")
                time.sleep(0.1)

    def pids(self):
        return [proc.pid for proc, _, _, _ in self.members]

    def counters(self):
        """proposals (committed, as the first member counts them: every member commits the same
        entries), ranges (key ranges read, summed over members), CPU seconds (summed over
        the members' processes) and the first member's database size in bytes. Any may be None."""
        proposals, ranges, cpu, db = None, 0.0, 0.0, None
        for i, (proc, _, metrics_port, _) in enumerate(self.members):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return {"proposals": None, "ranges": None, "cpu_s": None, "db_bytes": None}
            if i == 0:
                proposals = metric(text, "etcd_server_proposals_committed_total")
                db = metric(text, "etcd_mvcc_db_total_size_in_bytes")
                if db is None:
                    db = metric(text, "etcd_debugging_mvcc_db_total_size_in_bytes")
            r = metric(text, "etcd_mvcc_range_total")
            if r is None:
                r = metric(text, "etcd_debugging_mvcc_range_total")
            ranges = None if r is None or ranges is None else ranges + r
            c = cpu_seconds(proc.pid)
            cpu = None if c is None or cpu is None else cpu + c
        return {"proposals": proposals, "ranges": ranges, "cpu_s": cpu, "db_bytes": db}

    def proposals(self):
        return self.counters()["proposals"]

    def version(self):
        out = subprocess.run([shutil.which("etcd") or "/usr/bin/etcd", "--version"], capture_output=True, text=True)
        return out.stdout.splitlines()[0].split(":")[-1].strip() if out.stdout else "?"

    def stop(self, keep=False):
        self.reaper.kill()
        self.reaper.wait()
        for proc, _, _, _ in self.members:
            proc.terminate()
        for proc, _, _, log in self.members:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def per(delta_of, key, n, scale=1.0):
    a, b = delta_of
    if a.get(key) is None or b.get(key) is None:
        return None
    return (b[key] - a[key]) * scale / n


def one_run(etcd, worker, n, run, timeout, gate):
    """One round of n processes. With `gate`, every process is told the same start instant
    (RDZV_START_AT, a little after the last spawn) and waits for it before it connects, so
    the launcher's spawn speed is out of the figure; the time runs from that instant to the
    last worker's end (their clocks are this machine's). Without, from the first spawn."""
    run_id = f"mp-{os.getpid()}-{n}-{run}-{time.time_ns()}"
    url = f"etcd://{etcd.hosts}/{run_id}?min_workers={n}&max_workers={n}&timeout=120s"
    before = etcd.counters()
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
    # Each process prints its line when its round completed and may leave right after (an
    # etcd proposal: its lease revoked). The counters read once every process has printed (or
    # exited) count the rendezvous itself, its lease grants included; those read after the
    # exits count the leaves too. Workers that hold their membership a moment after printing
    # (`rdzv join --hold 2s`) keep the leaves out of the first reading.
    printed_at, exited_first = wait_printed(procs, outdir, start, timeout)
    at_round = etcd.counters()
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
    after = etcd.counters()
    ends = [r["end_unix_s"] for r in reports if "end_unix_s" in r]
    return {
        "workers": n,
        "run": run,
        "gated": gate,
        # From the common start instant (gate) to the last worker's end, or from the first
        # spawn to the instant the last worker had printed its round (seen by polling).
        "seconds": (max(ends) - start_at) if gate and ends else printed_at,
        "wall_seconds": wall,
        "spawn_seconds": spawned,
        "max_late_s": max((r.get("late_s", 0) for r in reports), default=None),
        "failures": len(failures),
        "failure_sample": failures[:2],
        "proposals_per_worker": per((before, after), "proposals", n),
        # The same from the start to the round (every process printed), before the leaves;
        # `exited_before_round` processes had exited by then (their leaves counted in it).
        "proposals_per_worker_to_round": per((before, at_round), "proposals", n),
        "exited_before_round": exited_first,
        # Key ranges the server read, and its CPU seconds per 1000 workers (all members).
        "ranges_per_worker": per((before, after), "ranges", n),
        "server_cpu_s": per((before, after), "cpu_s", 1),
        "server_cpu_s_per_1000": per((before, after), "cpu_s", n, 1000.0),
        "max_connect_s": max((r.get("connect_s", 0) for r in reports), default=None),
        "max_completed_s": max((r.get("completed_s", 0) for r in reports), default=None),
        "max_total_s": max((r.get("total_s", 0) for r in reports), default=None),
        "end_spread_s": (max(ends) - min(ends)) if ends else None,
    }


def wait_printed(procs, outdir, start, timeout):
    """Waits until every process has written its output line or exited. Returns the seconds
    from `start` until then, and how many had exited (their leave, if any, already done).
    Looks at one process at a time (every 5 ms), so that polling takes no CPU from the
    workers: the last to print is seen within 5 ms whatever the order."""
    exited = 0
    for i, (p, _, _) in enumerate(procs):
        out = os.path.join(outdir, f"{i}.out")
        while time.monotonic() - start < timeout:
            if p.poll() is not None:
                exited += 1
                break
            if os.path.getsize(out) > 0:
                break
            time.sleep(0.005)
    return time.monotonic() - start, exited


def show(x):
    return "?" if x is None else f"{x:.2f}"


def filesystem_of(path):
    """The type of the file system holding `path` (from /proc/mounts), e.g. tmpfs, ext4."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and (path + "/").startswith(parts[1].rstrip("/") + "/") and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


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
    ap.add_argument("--settle-every-run", action="store_true",
                    help="wait --settle before every run, not only each size's first, so that every run's "
                         "proposals are clean (for workers that leave their leases to expire)")
    ap.add_argument("--no-gate", action="store_true",
                    help="time from the first spawn (for workers that do not read RDZV_START_AT)")
    ap.add_argument("--members", type=int, default=1, help="etcd cluster members (processes), on loopback")
    ap.add_argument("--data-on-disk", action="store_true",
                    help="etcd's data directory on disk (fsync) instead of tmpfs")
    ap.add_argument("--data-parent", default=None,
                    help="with --data-on-disk: where to create the data directory (default: the temp dir)")
    ap.add_argument("--label", default=None, help="recorded in every result (e.g. disk, cluster-3)")
    a = ap.parse_args()
    worker = [a.worker] + a.worker_args.split()
    etcd = Etcd(members=a.members, on_disk=a.data_on_disk, data_parent=a.data_parent)
    data_fs = filesystem_of(etcd.dir)
    try:
        with open(a.out, "a") as out:
            for n in [int(s) for s in a.sizes.split(",")]:
                for run in range(a.runs):
                    if run == 0 or a.settle_every_run:
                        # Workers that exit without leaving have their session leases expire
                        # (an etcd proposal each) ~10 s later, inside a later run's window. A
                        # run started after those are gone has a clean proposal count: each
                        # size's first, or every run with --settle-every-run (the count varies
                        # from run to run with how many first arrivals race to create the
                        # run's setup, so one run is too few to compare with a bound).
                        time.sleep(a.settle)
                    r = one_run(etcd, worker, n, run, a.timeout, not a.no_gate)
                    r["proposals_clean"] = run == 0 or a.settle_every_run
                    r["worker"] = " ".join(worker)
                    r["etcd_version"] = etcd.version()
                    r["etcd_members"] = a.members
                    r["etcd_data"] = data_fs
                    if a.label:
                        r["label"] = a.label
                    print(f"multiproc N={n} run {run}: {r['seconds']:.3f}s (spawning took {r['spawn_seconds']:.2f}s, "
                          f"latest start {r['max_late_s']}s late), "
                          f"{show(r['proposals_per_worker'])} proposals/worker, {show(r['ranges_per_worker'])} "
                          f"ranges/worker, etcd CPU {show(r['server_cpu_s'])} s, {r['failures']} failures", flush=True)
                    out.write(json.dumps(r) + "\n")
                    out.flush()
    finally:
        etcd.stop()


if __name__ == "__main__":
    main()
