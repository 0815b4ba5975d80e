#!/usr/bin/env bash
# The figures that issue 43 asks of a machine with 16 cores or more, as one prepared command
# that fits a borrowed machine's short lease (the device machine: 10 minutes a command,
# 15 minutes of machine time a session, nothing reachable from it, torch installed):
#
#   - c10d against rdzv at 64, 128 and 256 worker processes (scripts/c10d_compare.py, the
#     workers staying after their round as torchrun's agents do), one run each;
#   - one round of 8,192, 32,768 and 98,304 in-process members on one etcd
#     (scripts/etcd_figures.py ceiling), each on a fresh etcd.
#
# Here, in a checkout with scripts/setup.sh done:
#   scripts/device_figures.sh bundle
#       builds the release wheel (scripts/wheel.sh; it holds the `rdzv` binary) and puts it
#       and this machine's etcd, compressed, into .device/ (git-ignored; about 20 MB).
# There, from the repository's root (the device tool: carry .device):
#   scripts/device_figures.sh run .device "$OUT" [inproc|c10d|all]
#       installs the wheel into a folder of its own (no index, no network), puts the wheel's
#       `rdzv` and etcd on PATH, records the machine in OUT/machine.json and writes each
#       bench's JSON lines to OUT/inproc.jsonl and OUT/c10d.jsonl as they come (the load
#       average before each run in `load_before`), so a command cut short still returns
#       what ran; its output goes to OUT/log.txt too. The in-process rounds go first: they
#       need a quiet machine, and c10d's spinning workers leave a load behind them.
#
# Sizes and limits (environment): DEVICE_INPROC_SIZES (8192,32768,98304), DEVICE_C10D_SIZES
# (64,128,256), DEVICE_C10D_RUNS (1), DEVICE_QUIET_LOAD (the 1-minute load under which an
# in-process round starts; a quarter of the cores), DEVICE_PYTHON (python3: the one with
# torch). About 7 minutes on 16 cores by estimate (not yet run on one), most of it c10d at
# 256, which ran into its 120 s join timeout on such a machine before.
#
# Then, here: copy OUT's files into benches/results/device/ and run
# `python3 scripts/plot.py benches/results BENCHMARKS.md benches/results`: BENCHMARKS.md shows
# them in a section of their own, labelled with the machine's core count.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { echo "device_figures: $*" >&2; exit 1; }

bundle() {
    local dir=.device
    command -v etcd >/dev/null || die "no etcd here: run scripts/setup.sh first"
    rm -rf "$dir" && mkdir -p "$dir"
    bash scripts/wheel.sh --out "$dir/wheel"
    mv "$dir"/wheel/rdzv-*-manylinux*.whl "$dir"/ && rm -rf "$dir/wheel"
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], "rb"), lzma.open(sys.argv[2], "wb"))' \
        "$(command -v etcd)" "$dir/etcd.xz"
    git describe --always --dirty > "$dir/build"
    ls -l "$dir"
    du -sh "$dir"
}

machine() {
    local out=$1 python=$2 bundle=$3
    "$python" - "$out/machine.json" "$(cat "$bundle/build" 2>/dev/null || echo unknown)" <<'PY'
import json, os, platform, subprocess, sys, time
def first(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception as e:
        return f"unknown ({e})"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
try:
    import torch
    torch_version = torch.__version__
except Exception as e:
    torch_version = f"not importable ({e})"
json.dump({
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    "cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem / 2**20, 1),
    "kernel": platform.release(), "python": platform.python_version(), "torch": torch_version,
    "rdzv": first(["rdzv", "--version"]), "build": sys.argv[2],
    "etcd": first(["etcd", "--version"]).replace("Version: ", ""),
    "open_files": first(["sh", "-c", "ulimit -n"]),
    "load_before": " ".join(open("/proc/loadavg").read().split()[:3]),
}, open(sys.argv[1], "w"), indent=1)
PY
    cat "$out/machine.json" && echo
}

run() {
    local bundle=$1 out=$2 what=${3:-all}
    [[ -d $bundle ]] || die "no bundle at $bundle: run \`scripts/device_figures.sh bundle\` here first"
    mkdir -p "$out"
    exec > >(tee -a "$out/log.txt") 2>&1
    local python=${DEVICE_PYTHON:-python3} tools
    tools=$(mktemp -d /tmp/rdzv-device.XXXXXX)
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$tools/site" "$bundle"/rdzv-*.whl
    mkdir -p "$tools/bin"
    # Python's lzma rather than xz, which a bare image may lack.
    "$python" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$bundle/etcd.xz" "$tools/bin/etcd"
    chmod +x "$tools/bin/etcd"
    export PYTHONPATH="$tools/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$tools/bin:$tools/site/bin:$PATH"
    export PYTHONUNBUFFERED=1
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    machine "$out" "$python" "$bundle"
    local cores quiet
    cores=$(nproc)
    quiet=${DEVICE_QUIET_LOAD:-$(awk -v c="$cores" 'BEGIN { printf "%.1f", (c / 4 > 0.9 ? c / 4 : 0.9) }')}
    if [[ $what == inproc || $what == all ]]; then
        echo "== one round of in-process members on one etcd ($(date -u +%T))"
        python3 scripts/etcd_figures.py ceiling --rdzv "$(command -v rdzv)" \
            --sizes "${DEVICE_INPROC_SIZES:-8192,32768,98304}" --quiet-load "$quiet" --quiet-wait 90 \
            --out "$out/inproc.jsonl" || echo "device_figures: the in-process rounds failed"
    fi
    if [[ $what == c10d || $what == all ]]; then
        echo "== c10d against rdzv, separate processes ($(date -u +%T))"
        python3 scripts/c10d_compare.py --python "$python" --sizes "${DEVICE_C10D_SIZES:-64,128,256}" \
            --runs "${DEVICE_C10D_RUNS:-1}" --out "$out/c10d.jsonl" || echo "device_figures: the c10d comparison failed"
    fi
    echo "== done ($(date -u +%T))"
    rm -rf "$tools"
}

case ${1:-} in
    bundle) bundle ;;
    run) shift; [[ $# -ge 2 ]] || die "usage: scripts/device_figures.sh run BUNDLE OUT [inproc|c10d|all]"; run "$@" ;;
    *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
