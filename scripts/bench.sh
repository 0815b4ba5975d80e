#!/usr/bin/env bash
# Regenerates BENCHMARKS.md and its plots from scratch: builds the benches (release), runs
# every criterion bench and the cost figures on in-memory, a real etcd and a real Redis
# (started by the benches themselves), the multi-process runs against a local etcd (on
# tmpfs, on disk, and a 3-member cluster), one client per worker (`rdzv bench
# --client-per-worker`), the failure-detection runs (scripts/etcd_figures.py), and
# scripts/plot.py. Takes ~40 minutes on 2 cores (a cost size that hangs adds up to its
# 10-minute limit). Not part of CI.
#
#   scripts/bench.sh
#
# Environment: CARGO_TARGET_DIR (default target); MP_RUNS (multi-process runs per size,
# default 5); MP_SIZES (default 16,64,128); MP_CLI_SIZES (the `rdzv join` processes,
# default 16,64,128,256,512); MP_EXTRA_SIZE (the on-disk and cluster runs, default 128);
# COST_SIZES (default 16,64,128,512,1024,4096,8192; memory also COST_MEM_EXTRA, default 16384);
# CLIENTS_WORKERS (default 1024); ROUNDS_ROUNDS (default 4) and ROUNDS_RUNS (default 5) for
# 1,024 and 8,192 workers' rounds back to back on etcd and Redis, interleaved (scripts/bench_rounds.sh); KILL_WORKERS (default 4096) and KILL_TTL (default 10, the default keep_alive_ttl; at 3 s,
# 4,096 sessions on one client lose their leases on this machine) for a member
# cut off among in-process workers; CEILING_SIZES (default 8192,16384,32768,49152,65536,98304) for the largest
# round on one etcd; RATIO_RUNS (default 4) for the medians of rounds of 8,192 and 98,304 on one etcd
# (about 4 minutes a run of each);
# DETECT_TTLS (default 2,5,10); PROMOTE_TTLS (default 3,10); C10D_SIZES (default 16,32,64) and
# C10D_RUNS (default 1: each c10d run at 64 waits out its 120 s timeout) for the comparison with PyTorch's c10d rendezvous; RDZV_JOIN_BIN (a worker command for the multi-process runs,
# called as `$RDZV_JOIN_BIN <url>`; default: the join_once example).
# RDZV_BENCH_URL / RDZV_BENCH_BACKENDS are passed to the benches (see benches/common/mod.rs).
#
# Open files: with one client per worker, each worker holds about 3 open files in the bench
# (2 connections) and etcd one per connection, so the soft limit is raised to 16384 (or the hard limit, if lower) for everything
# started here; the limit in force is recorded in machine.json.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
results="$root/benches/results"
export RDZV_BENCH_OUT="$results"
mkdir -p "$results"
rm -f "$results"/*.jsonl "$results"/machine.json

want_files=16384
soft_files=$(ulimit -Sn)
hard_files=$(ulimit -Hn)
if [ "$soft_files" != unlimited ] && [ "$soft_files" -lt "$want_files" ]; then
    if [ "$hard_files" = unlimited ] || [ "$hard_files" -ge "$want_files" ]; then
        ulimit -Sn "$want_files"
    else
        ulimit -Sn "$hard_files"
        echo "bench: the open-file limit is $hard_files (hard); one client per worker may run out of files"
    fi
fi
open_files=$(ulimit -Sn)

echo "== building (release)"
# Build once, then run the executables: the work tree may change meanwhile, and a rebuild
# in the middle would mix versions.
declare -A exe
while IFS=' ' read -r name path; do exe[$name]=$path; done < <(
    cargo bench -j2 --bench cas_contention --bench store_ops --bench rendezvous_latency --bench cost \
        --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])')
cargo build -j2 --release --example join_once
cargo build -j2 --release -p rdzv-cli || echo "bench: the CLI did not build; skipping its multi-process runs"

load() { cut -d' ' -f1-3 /proc/loadavg; }
# The build just before leaves a 1-minute load of about 2 that takes minutes to fall: wait
# (up to 5 minutes) until it is under 0.9, as the figure scripts do before each run, so that
# the first benches do not start on what reads as a busy machine.
for _ in $(seq 60); do
    awk '{ exit !($1 < 0.9) }' /proc/loadavg && break
    sleep 5
done
load_before=$(load)

for bench in cas_contention store_ops rendezvous_latency; do
    echo "== $bench"
    "${exe[$bench]:?no executable for $bench}" --bench
done

echo "== cost"
if [ -n "${RDZV_BENCH_URL:-}" ]; then
    "${exe[cost]}" --bench
else
    # One process (and one fresh server) per backend and size: the peak memory (VmHWM) is
    # then this size's own, and no earlier size's leftovers load the server. A size that
    # crashes or outlasts its time limit is recorded as failed, and the script goes on.
    for backend in $(echo "${RDZV_BENCH_BACKENDS:-mem,etcd,redis}" | tr ',' ' '); do
        sizes="${COST_SIZES:-16,64,128,512,1024,4096,8192}"
        if [ "$backend" = mem ]; then sizes="$sizes,${COST_MEM_EXTRA:-16384}"; fi
        for n in $(echo "$sizes" | tr ',' ' '); do
            started=$(date +%s.%N)
            status=0
            timeout 600 "${exe[cost]}" --bench --backends "$backend" --sizes "$n" || status=$?
            if [ "$status" -ne 0 ]; then
                echo "cost: $backend N=$n failed (exit $status)"
                python3 - "$results/cost.jsonl" "$backend" "$n" "$status" "$started" <<'PY'
import json, sys, time
path, backend, n, status, started = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
why = "killed at the 600 s time limit" if status == 124 else f"the bench process exited with status {status}"
with open(path, "a") as f:
    f.write(json.dumps({"backend": backend, "workers": n, "round": "crashed", "failed": why,
                        "seconds": time.time() - started}) + "\n")
PY
            fi
        done
    done
fi

echo "== multi-process runs"
worker="${RDZV_JOIN_BIN:-$CARGO_TARGET_DIR/release/examples/join_once}"
# Each worker leaves its session lease to expire; a fresh run id per run keeps them apart, and
# each run starts after the earlier ones' leases expired (12 s), so that every run counts clean.
python3 scripts/multiproc.py --worker "${worker%% *}" --worker-args "$(echo "$worker" | cut -s -d' ' -f2-)" \
    --sizes "${MP_SIZES:-16,64,128}" --runs "${MP_RUNS:-5}" --settle-every-run --out "$results/multiproc.jsonl"

# The same with the CLI, when it is built (`cargo build --release -p rdzv-cli`): no start
# gate there, so the time includes spawning; it holds its membership 2 s after printing, then
# leaves the run (proposals are read before and after the leaves: scripts/multiproc.py).
cli="${RDZV_CLI_BIN:-$CARGO_TARGET_DIR/release/rdzv}"
if [ -x "$cli" ]; then
    join_args="join --hold 2s --format json"
    python3 scripts/multiproc.py --worker "$cli" --worker-args "$join_args" --no-gate \
        --sizes "${MP_CLI_SIZES:-16,64,128,256,512}" --runs 3 --out "$results/multiproc_cli.jsonl"

    echo "== etcd with its data on disk, and a 3-member cluster"
    # The same CLI runs at one size: etcd's data directory on disk (every commit fsynced)
    # instead of tmpfs, then three etcd processes on loopback (the URL lists all three).
    python3 scripts/multiproc.py --worker "$cli" --worker-args "$join_args" --no-gate \
        --sizes "${MP_EXTRA_SIZE:-128}" --runs 3 --data-on-disk --label disk --out "$results/multiproc_disk.jsonl" ||
        echo "bench: the on-disk etcd runs failed"
    python3 scripts/multiproc.py --worker "$cli" --worker-args "$join_args" --no-gate \
        --sizes "${MP_EXTRA_SIZE:-128}" --runs 3 --members 3 --label cluster-3 \
        --out "$results/multiproc_cluster.jsonl" || echo "bench: the 3-member etcd runs failed"

    echo "== one client per worker (rdzv bench --client-per-worker) on etcd"
    python3 scripts/etcd_figures.py clients --rdzv "$cli" --workers "${CLIENTS_WORKERS:-1024}" --runs 3 \
        --out "$results/clients.jsonl" || echo "bench: the client-per-worker runs failed"

    echo "== failure at scale: in-process workers on etcd, one member cut off, a spare in its place"
    python3 scripts/etcd_figures.py killone --rdzv "$cli" --workers "${KILL_WORKERS:-4096}" --ttl "${KILL_TTL:-10}" --runs 3 \
        --out "$results/killone.jsonl" || echo "bench: the failure-at-scale runs failed"

    echo "== back to back: rdzv bench, rounds one after another (old rounds deleted beside the new ones)"
    for backend in etcd redis; do
        BACKEND=$backend RDZV="$cli" scripts/bench_rounds.sh 1024,8192 "${ROUNDS_ROUNDS:-4}" "${ROUNDS_RUNS:-5}" \
            "$results/rounds.jsonl" > /dev/null || echo "bench: the back-to-back runs on $backend failed"
    done

    echo "== the ceiling: the largest round of in-process workers on one etcd with its default limits"
    python3 scripts/etcd_figures.py ceiling --rdzv "$cli" --sizes "${CEILING_SIZES:-8192,16384,32768,49152,65536,98304}" \
        --out "$results/ceiling.jsonl" || echo "bench: the ceiling runs failed"

    echo "== the ratio: rounds of 8,192 and 98,304 in turn, each on a fresh etcd and a quiet machine"
    python3 scripts/etcd_figures.py ratio --rdzv "$cli" --runs "${RATIO_RUNS:-4}" \
        --out "$results/ratio.jsonl" || echo "bench: the ratio runs failed"

    echo "== failure detection: survivors told of a SIGKILLed member, against the keep-alive TTL"
    python3 scripts/etcd_figures.py detect --rdzv "$cli" --workers 8 --ttls "${DETECT_TTLS:-2,5,10}" --runs 3 \
        --out "$results/detect.jsonl" || echo "bench: the failure-detection runs failed"

    echo "== spare promotion: a spare takes a SIGKILLed member's place, against the keep-alive TTL"
    python3 scripts/etcd_figures.py promote --rdzv "$cli" --workers 4 --ttls "${PROMOTE_TTLS:-3,10}" --runs 5 \
        --out "$results/promote.jsonl" || echo "bench: the spare-promotion runs failed"

    echo "== segments: in-process workers on etcd, unlabelled and with 64 interleaved segment labels"
    python3 scripts/etcd_figures.py segments --rdzv "$cli" --sizes "${SEGMENT_SIZES:-1024,8192}" --labels 64 --runs 6 \
        --out "$results/segments.jsonl" || echo "bench: the segment runs failed"

    echo "== health drain: a member whose check fails is replaced by the spare"
    python3 scripts/etcd_figures.py drain --rdzv "$cli" --workers 3 --intervals "${DRAIN_INTERVALS:-1,5}" --runs 5 \
        --out "$results/drain.jsonl" || echo "bench: the health-drain runs failed"

    # Last: c10d's workers spin (a 1-minute load of 50 at 64 processes), and the load they
    # leave behind would fall on whatever ran next (the segment runs did, at 9-13).
    echo "== against PyTorch's default rendezvous (c10d over a TCPStore), separate processes"
    torch_python=$(source scripts/venv.sh && venv_for crates/rdzv-py/requirements-test.txt)/bin/python
    if [ -x "$torch_python" ] && "$torch_python" -c 'import torch, rdzv' 2>/dev/null; then
        # Workers that stay after their round and workers that exit; c10d with torch's defaults and
        # with a backoff after a lost write and no heartbeats during the join (BENCHMARKS.md says why).
        python3 scripts/c10d_compare.py --python "$torch_python" --sizes "${C10D_SIZES:-16,32,64}" --runs "${C10D_RUNS:-1}" \
            --after-round stay,exit --c10d-conf ';cas_backoff_max_seconds=0.5,keep_alive_interval=600' \
            --out "$results/c10d.jsonl" || echo "bench: the c10d comparison failed"
    else
        echo "bench: no venv with torch and rdzv at $torch_python (run scripts/test-python.sh once); skipping the c10d comparison"
    fi
fi

load_after=$(load)
python3 - "$results/machine.json" "$load_before" "$load_after" "$open_files" <<'PY'
import json, os, platform, re, subprocess, sys
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
ram = next((l.split(":", 1)[1].strip() for l in open("/proc/meminfo") if l.startswith("MemTotal")), "?")
m = {
    "date": run("date", "-u", "+%Y-%m-%d %H:%M UTC"),
    "cpu": cpu, "nproc": run("nproc"),
    "ram": f"{int(ram.split()[0]) / 1024 / 1024:.1f} GiB" if ram != "?" else "?",
    "kernel": platform.release(),
    "etcd": run("etcd", "--version").splitlines()[0] if run("etcd", "--version") else "?",
    "redis": run("redis-server", "--version"),
    "rustc": run("rustc", "--version"),
    "load_before": f"load average {sys.argv[2]} (1/5/15 min) when the benches started",
    "load_after": f"load average {sys.argv[3]} when they ended",
    "open_files": f"{sys.argv[4]} (soft limit on open files of the bench processes and the servers they started)",
    "git": run("git", "rev-parse", "--short", "HEAD"),
}
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY

echo "== BENCHMARKS.md"
python3 scripts/plot.py "$results" BENCHMARKS.md "$results"
echo "done: BENCHMARKS.md and its plots in $results"
