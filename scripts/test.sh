#!/usr/bin/env bash
# The one test command: sets up the machine, then checks formatting, lints, and runs every
# test with the real servers required. Stops at the first step that fails and names it.
#
# Most tests wait on real servers, timers and TTLs far more than they compute (the Rust tests
# keep about a third of two cores busy, the Python tests two thirds), so jobs run beside the
# steps (docs/TESTING.md, "How long it takes"):
#   - the torch venvs are prepared (pip: disk more than CPU) while clippy builds;
#   - the Python tests run beside the Rust tests and the doc tests;
#   - the release wheel is built beside the tests at the lowest CPU priority (lowest_priority
#     below), on the CPU they leave idle, so it takes almost none from them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# Each step's time is printed after it: CI must stay under 30 minutes on 2 cores, and these
# lines show which step to look at when it grows.
fail() {
    echo "FAILED at step \"$1\" after $2 s: $3 (fix this, then run scripts/test.sh again)" >&2
    exit 1
}
step() {
    local name=$1 started=$SECONDS
    shift
    echo "==> $name: $*" >&2
    "$@" || fail "$name" $((SECONDS - started)) "$*"
    echo "==> $name took $((SECONDS - started)) s ($SECONDS s so far)" >&2
}

# A step begun with `begin` runs in the background, its output kept in $logs/NAME.log and
# shown when `finish NAME` has waited for it. Each runs in a session of its own (setsid), so a
# Ctrl-C reaches it only through `interrupt`, which passes it on. If a step fails while jobs
# still run, the command waits for them and shows their outcome too rather than killing them
# halfway (each is bounded by its own timeouts).
logs=$(mktemp -d)
declare -A job_pid job_started job_command
begin() {
    local name=$1
    shift
    echo "==> $name (beside the next steps): $*" >&2
    job_started[$name]=$SECONDS
    job_command[$name]="$*"
    # The job times itself: it may have ended long before `finish` waits for it.
    setsid bash -c 'started=$SECONDS; "$@"; code=$?; echo "(ran $((SECONDS - started)) s)"; exit $code' \
        "$name" "$@" >"$logs/$name.log" 2>&1 &
    job_pid[$name]=$!
}
# report NAME: waits for NAME and shows its output; its exit status is NAME's.
report() {
    local name=$1 code=0
    wait "${job_pid[$name]}" || code=$?
    unset "job_pid[$name]"
    echo "==> $name's output:" >&2
    cat "$logs/$name.log" >&2
    return $code
}
# finish NAME: as report, and fails as a step does if NAME failed.
finish() {
    local name=$1
    report "$name" || fail "$name" $((SECONDS - job_started[$name])) "${job_command[$name]}"
    echo "==> $name $(tail -n 1 "$logs/$name.log"), begun at ${job_started[$name]} s ($SECONDS s so far)" >&2
}
# On the way out after a failure: the jobs still running are waited for and reported.
finish_the_rest() {
    local name
    for name in "${!job_pid[@]}"; do
        echo "==> waiting for $name, still running, before stopping" >&2
        if report "$name"; then
            echo "==> $name passed" >&2
        else
            echo "==> $name FAILED too: ${job_command[$name]}" >&2
        fi
    done
    rm -rf "$logs"
}
interrupt() {
    local pid
    for pid in "${job_pid[@]}"; do
        kill -INT -- "-$pid" 2>/dev/null || true
    done
    exit 130
}
trap finish_the_rest EXIT
trap interrupt INT TERM
# lowest_priority CMD...: CMD at the lowest CPU priority. `nice` alone is not enough for a
# job: with the kernel's autogroups (sched_autogroup_enabled), each session (setsid) shares
# the CPU with the others by its group's weight, whatever its processes' nice values; the
# group's own nice is set through /proc/self/autogroup.
lowest_priority() {
    echo 19 >/proc/self/autogroup 2>/dev/null || true
    nice -n 19 "$@"
}
export -f lowest_priority

step setup bash scripts/setup.sh
step format cargo fmt --all -- --check
begin venvs bash scripts/test-python.sh --prepare
step clippy cargo clippy --workspace --all-targets -j2 -- -D warnings
step docs env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -j2
step readme-demo bash scripts/readme-demo.sh
# Without this, tests whose server binary is missing would skip instead of failing.
export RDZV_REQUIRE_SERVERS=1
step build-tests cargo nextest run --workspace --build-jobs 2 --no-run
finish venvs
# Before the wheel's build begins: wheel.sh stages the release binary inside crates/rdzv-py
# while it builds, where this build would pick it up.
step python-package bash scripts/test-python.sh --install
begin python bash scripts/test-python.sh --tests
begin wheel-build lowest_priority bash scripts/wheel.sh --out target/wheel-test
# cargo-nextest runs each test in a process of its own, eight at once (.config/nextest.toml):
# they wait on real servers and timers far more than they compute. It runs no doc tests;
# cargo test does those.
step tests cargo nextest run --workspace --build-jobs 2
step doc-tests cargo test --workspace --doc -j2
finish python
finish wheel-build
step wheel bash scripts/test-wheel.sh --built target/wheel-test
echo "==> all steps passed" >&2
