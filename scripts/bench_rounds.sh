#!/usr/bin/env bash
# Runs `rdzv bench` of N in-process workers for ROUNDS rounds, RUNS times, each time on a
# fresh etcd on tmpfs (port 23791), and appends one JSON line per run to OUT: the report,
# the exit code, the wall time, how many "session lease" warnings were printed, and the load
# average before. The figures of BENCHMARKS.md's "Sessions at scale" came from it.
#
#   scripts/bench_rounds.sh N ROUNDS RUNS OUT
#
# Environment: RDZV (the binary, default target/release/rdzv). Needs etcd on PATH and
# `ulimit -n` of a few times N.
set -u
n=$1; rounds=$2; runs=$3; out=$4
bin=${RDZV:-target/release/rdzv}
data=/dev/shm/rdzv-bench-rounds
for i in $(seq 1 "$runs"); do
    rm -rf "$data"
    etcd --data-dir "$data" --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 \
        --listen-peer-urls http://127.0.0.1:23801 > "$data.log" 2>&1 &
    etcd_pid=$!
    sleep 2
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    start=$(date +%s.%N)
    timeout 400 "$bin" bench "etcd://127.0.0.1:23791/s${n}r${i}" --workers "$n" --rounds "$rounds" --format json \
        > "$data.out" 2> "$data.err"
    code=$?
    end=$(date +%s.%N)
    lost=$(grep -c "session lease" "$data.err")
    report=$(tail -1 "$data.out" | grep '^{' || echo null)
    python3 -c 'import json, sys
n, rounds, run, code, wall, lost, load, report = sys.argv[1:]
print(json.dumps({"workers": int(n), "rounds": int(rounds), "run": int(run), "exit": int(code),
                  "wall_s": float(wall), "sessions_lost_warnings": int(lost), "load_before": load,
                  "report": json.loads(report)}))' "$n" "$rounds" "$i" "$code" "$(echo "$end - $start" | bc)" "$lost" "$load" "$report" >> "$out"
    tail -1 "$out"
    kill "$etcd_pid"; wait "$etcd_pid" 2>/dev/null
done
rm -rf "$data" "$data.log" "$data.out" "$data.err"
