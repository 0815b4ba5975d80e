#!/usr/bin/env bash
# Runs `rdzv bench` of N in-process workers for ROUNDS rounds back to back, RUNS times, each
# time on a fresh server (etcd on tmpfs on port 23791, or Redis without persistence on port
# 16391), and appends one JSON line per run to OUT: the report (each round's latency, the
# operations per worker per round, the peak memory), the exit code, the wall time, how many
# "session lease" warnings were printed, and the load average before. scripts/bench.sh runs
# it for BENCHMARKS.md's "back to back" rows.
#
#   scripts/bench_rounds.sh N[,N...] ROUNDS RUNS OUT
#
# With several sizes the runs are interleaved (run 1 of each size, then run 2 of each…), so
# that sizes compared with each other (t(8192) / t(1024)) share the machine's conditions:
# measured one size after the other, a drift of the shared machine's load over the minutes
# between them moved the ratio by 10-15 %.
#
# Environment: RDZV (the binary, default target/release/rdzv); BACKEND (etcd or redis,
# default etcd). Needs etcd or redis-server on PATH and `ulimit -n` of a few times N.
set -u
sizes=$1; rounds=$2; runs=$3; out=$4
bin=${RDZV:-target/release/rdzv}
backend=${BACKEND:-etcd}
data=/dev/shm/rdzv-bench-rounds
for i in $(seq 1 "$runs"); do
  for n in ${sizes//,/ }; do
    rm -rf "$data"
    case "$backend" in
        etcd)
            port=23791
            etcd --data-dir "$data" --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
                --listen-peer-urls http://127.0.0.1:23801 > "$data.log" 2>&1 & ;;
        redis)
            port=16391
            redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no > "$data.log" 2>&1 & ;;
        *) echo "bench_rounds: BACKEND must be etcd or redis, not $backend" >&2; exit 2 ;;
    esac
    server_pid=$!
    url="$backend://127.0.0.1:$port/s${n}r${i}"
    # Until the server accepts connections (a run on a server not yet up would be lost as
    # exit 5), at most 30 s; then 2 s more for it to settle.
    up=no
    for _ in $(seq 1 300); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=yes; break; fi
        sleep 0.1
    done
    if [ "$up" = no ]; then
        echo "bench_rounds: $backend did not accept connections on port $port within 30 s; its log:" >&2
        cat "$data.log" >&2
        kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null
        exit 1
    fi
    sleep 2
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    start=$(date +%s.%N)
    timeout 400 "$bin" bench "$url" --workers "$n" --rounds "$rounds" --format json > "$data.out" 2> "$data.err"
    code=$?
    end=$(date +%s.%N)
    lost=$(grep -c "session lease" "$data.err")
    report=$(tail -1 "$data.out" | grep '^{' || echo null)
    # What a failed run said last, kept with its line (the files are removed below).
    said=""
    if [ "$code" -ne 0 ]; then said=$(tail -3 "$data.err"); fi
    python3 -c 'import json, sys
backend, n, rounds, run, code, start, end, lost, load, report, said = sys.argv[1:]
row = {"backend": backend, "workers": int(n), "rounds": int(rounds), "run": int(run), "exit": int(code),
       "wall_s": float(end) - float(start), "sessions_lost_warnings": int(lost), "load_before": load,
       "report": json.loads(report)}
if said:
    row["stderr_tail"] = said
print(json.dumps(row))' "$backend" "$n" "$rounds" "$i" "$code" "$start" "$end" "$lost" "$load" "$report" "$said" >> "$out"
    tail -1 "$out"
    kill "$server_pid"; wait "$server_pid" 2>/dev/null
  done
done
rm -rf "$data" "$data.log" "$data.out" "$data.err"
