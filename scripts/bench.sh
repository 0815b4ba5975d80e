#!/usr/bin/env bash
# Regenerates BENCHMARKS.md and its plots from scratch: builds the benches (release), runs
# every criterion bench and the cost figures on in-memory, a real etcd and a real Redis
# (started by the benches themselves), the multi-process runs against a local etcd, and
# scripts/plot.py. Takes ~10–15 minutes on 2 cores. Not part of CI.
#
#   scripts/bench.sh
#
# Environment: CARGO_TARGET_DIR (default target); MP_RUNS (multi-process runs per size,
# default 5); MP_SIZES (default 16,64,128); RDZV_JOIN_BIN (a worker command for the
# multi-process runs, called as `$RDZV_JOIN_BIN <url>`; default: the join_once example).
# RDZV_BENCH_URL / RDZV_BENCH_BACKENDS are passed to the benches (see benches/common/mod.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
results="$root/benches/results"
export RDZV_BENCH_OUT="$results"
mkdir -p "$results"
rm -f "$results"/*.jsonl "$results"/machine.json

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
    # then this size's own, and no earlier size's leftovers load the server.
    for backend in $(echo "${RDZV_BENCH_BACKENDS:-mem,etcd,redis}" | tr ',' ' '); do
        for n in 16 64 128 512 1024; do
            "${exe[cost]}" --bench --backends "$backend" --sizes "$n" || echo "cost: $backend N=$n failed"
        done
    done
fi

echo "== multi-process runs"
worker="${RDZV_JOIN_BIN:-$CARGO_TARGET_DIR/release/examples/join_once}"
# Each worker leaves its session lease to expire; a fresh run id per run keeps them apart.
python3 scripts/multiproc.py --worker "${worker%% *}" --worker-args "$(echo "$worker" | cut -s -d' ' -f2-)" \
    --sizes "${MP_SIZES:-16,64,128}" --runs "${MP_RUNS:-5}" --out "$results/multiproc.jsonl"

# The same with the CLI, when it is built (`cargo build --release -p rdzv-cli`): no start
# gate there, so the time includes spawning; it leaves the run after printing.
cli="${RDZV_CLI_BIN:-$CARGO_TARGET_DIR/release/rdzv}"
if [ -x "$cli" ]; then
    python3 scripts/multiproc.py --worker "$cli" --worker-args "join --hold 0s --format json" --no-gate \
        --sizes "${MP_SIZES:-16,64,128}" --runs 3 --out "$results/multiproc_cli.jsonl"
fi

load_after=$(load)
python3 - "$results/machine.json" "$load_before" "$load_after" <<'PY'
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
    "git": run("git", "rev-parse", "--short", "HEAD"),
}
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY

echo "== BENCHMARKS.md"
python3 scripts/plot.py "$results" BENCHMARKS.md "$results"
echo "done: BENCHMARKS.md, $results/latency.svg, $results/cost.svg"
