#!/usr/bin/env python3
"""rdzv against PyTorch's default rendezvous, side by side in one run, as separate processes.

usage: c10d_compare.py --python PY --sizes 32,64 --runs 5 [--after-round stay,exit]
                       [--stores multi,single] [--c10d-conf ";cas_backoff_max_seconds=0.5"] --out FILE

PY is a Python with torch and rdzv installed (the venv of scripts/test-python.sh: scripts/venv.sh
says where).
For each size N and run, N worker processes of each system are started and, once every one of
them has imported its library and connected (the *ready* line), all are told to go at the same
instant (one line on each one's stdin); the time runs from that instant until the last of them
has its round:

- c10d: torchrun's default backend, `DynamicRendezvousHandler` over a TCPStore
  (`get_rendezvous_handler(RendezvousParameters(backend="c10d", …))`, min = max = N), the
  store hosted by this script (as torchrun's first agent would host it);
- rdzv: `rdzv.connect("etcd://…/<run>?min_workers=N").next_rendezvous()` on a local etcd
  started here (scripts/multiproc.py's `Etcd`, data on tmpfs).

The two systems alternate run by run, so that the machine's noise falls on both alike.

Variants, to find what makes c10d slow (each run of each system in every combination asked for):

- `--after-round stay` (the default): a worker that has its round stays, as torchrun's agents do
  while their workers train: c10d's handler then sends a keep-alive heartbeat every 5 s, each a
  compare-and-set of the one state value that the workers still joining race to update; rdzv's
  refreshes its lease. `exit`: a worker exits as soon as it has its round.
- `--stores multi` (the default): the TCPStore is multi-tenant, as torchrun's agents share it;
  `single`: a plain one.
- `--stagger S`: the go lines are spread evenly over S seconds instead of sent at once (workers
  arriving one after another, as when each starts as soon as it has imported torch); the time
  still runs from the first go.
- `--c10d-conf`: c10d's own options (torchrun's `--rdzv-conf`), one set per variant, the sets
  separated by `;` (an empty set: torch's defaults, the default). `cas_backoff_max_seconds=0.5`
  makes a worker whose write of the state lost the race wait up to 0.5 s (torch's default:
  not at all); `keep_alive_interval=600` keeps the workers already joined from writing their
  heartbeats into the state while the others join.

Results: one JSON line per system, size, variant and run, appended to FILE; the load average
(1, 5, 15 min) before each run is in `load_before`.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multiproc import Etcd, free_port  # noqa: E402

WORKER = r'''
import json, sys, time
system, target, run_id, n, after_round = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
conf = dict(kv.split("=", 1) for kv in sys.argv[6].split(",") if kv)
if system == "c10d":
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    params = RendezvousParameters(backend="c10d", endpoint=target, run_id=run_id, min_nodes=n, max_nodes=n,
                                  is_host=False, join_timeout=120, last_call_timeout=1, **conf)
    handler = get_rendezvous_handler(params)
    go = lambda: handler.next_rendezvous()
    rank_of = lambda info: info.rank
else:
    import rdzv
    worker = rdzv.connect(f"etcd://{target}/{run_id}?min_workers={n}&timeout=120s")
    go = lambda: worker.next_rendezvous()
    rank_of = lambda r: r.rank
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
info = go()
print(json.dumps({"done": time.monotonic(), "took": time.monotonic() - started, "rank": rank_of(info)}), flush=True)
if after_round == "stay":
    sys.stdin.readline()
else:
    import os
    os._exit(0)
'''


def one_run(python, system, target, n, run_id, timeout, after_round, conf="", stagger=0.0):
    procs = [subprocess.Popen([python, "-c", WORKER, system, target, run_id, str(n), after_round, conf],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    r = {"system": system, "workers": n, "run_id": run_id, "after_round": after_round, "c10d_conf": conf,
         "stagger_s": stagger}
    try:
        deadline = time.monotonic() + timeout
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                r["failed"] = f"a worker did not get ready: {line!r} {p.stderr.read()[-400:] if p.poll() is not None else ''}"
                return r
        # How many tasks are runnable at the go (the harness itself among them): the check
        # that nothing else is busy, which the load averages, still counting the workers'
        # start-up, cannot give.
        r["runnable_at_go"] = int(open("/proc/loadavg").read().split()[3].split("/")[0])
        go = time.monotonic()
        for i, p in enumerate(procs):
            time.sleep(max(0.0, go + stagger * i / n - time.monotonic()))
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            line = p.stdout.readline()
            if not line or time.monotonic() > deadline:
                r["failed"] = f"a worker did not finish: {p.stderr.read()[-400:] if p.poll() is not None else 'timeout'}"
                return r
            results.append(json.loads(line))
        ranks = sorted(x["rank"] for x in results)
        if ranks != list(range(n)):
            r["failed"] = f"ranks {ranks[:8]}… are not 0..{n}"
            return r
        r.update({"seconds": max(x["done"] for x in results) - go,
                  "median_worker_seconds": sorted(x["took"] for x in results)[n // 2]})
        return r
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    p.stdin.write("bye\n")
                    p.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="a Python with torch and rdzv")
    ap.add_argument("--sizes", default="32,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--after-round", default="stay", help="stay and/or exit, comma-separated")
    ap.add_argument("--stores", default="multi", help="multi and/or single (the TCPStore), comma-separated")
    ap.add_argument("--stagger", type=float, default=0.0, help="spread the go lines over this many seconds")
    ap.add_argument("--c10d-conf", default="", help="c10d option sets (k=v,k=v), one per variant, `;`-separated")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    etcd = Etcd()
    stores = {kind: host_store(a.python, kind == "multi") for kind in a.stores.split(",")}
    c10d = [("c10d", kind, f"127.0.0.1:{port}", conf)
            for kind, (_, port) in stores.items() for conf in a.c10d_conf.split(";")]
    variants = c10d + [("rdzv", None, etcd.hosts, "")]
    try:
        load = loadavg()
        with open(a.out, "a") as out:
            sizes = [int(x) for x in a.sizes.split(",")]
            for n, run, after_round, (system, store, target, conf) in itertools.product(
                    sizes, range(a.runs), a.after_round.split(","), variants):
                run_id = f"cmp-{system}-{n}-{run}-{os.getpid()}-{time.time_ns()}"
                before = loadavg()
                r = one_run(a.python, system, target, n, run_id, a.timeout, after_round, conf, a.stagger)
                r.update({"run": run, "store": store, "load_before": before, "load": loadavg(),
                          "load_at_start": load, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
                print(f"{system} N={n} {after_round} store={store} conf={conf!r} stagger={a.stagger} "
                      f"run {run} (load {before}): "
                      + (f"{r['seconds']:.3f} s" if "seconds" in r else f"FAILED: {r['failed']}"),
                      flush=True)
                out.write(json.dumps(r) + "\n")
                out.flush()
    finally:
        for host, _ in stores.values():
            host.stdin.close()
            host.wait(10)
        etcd.stop()


def loadavg():
    """The load averages over 1, 5 and 15 minutes, as /proc/loadavg gives them."""
    return " ".join(open("/proc/loadavg").read().split()[:3])


def host_store(python, multi_tenant):
    """A c10d TCPStore hosted here (as torchrun's first agent would host it), and its port."""
    port = free_port()
    host = subprocess.Popen([python, "-c", (
        "import sys, datetime, torch.distributed as d\n"
        f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, multi_tenant={multi_tenant}, "
        "wait_for_workers=False, timeout=datetime.timedelta(seconds=600))\n"
        "print('ready', flush=True)\nsys.stdin.readline()\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert host.stdout.readline().strip() == "ready", "the TCPStore did not start"
    return host, port


if __name__ == "__main__":
    main()
