#!/usr/bin/env bash
# The one test command: sets up the machine, then checks formatting, lints, and runs every
# test with the real servers required. Stops at the first step that fails and names it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# Each step's time is printed after it: CI must stay under 30 minutes on 2 cores, and these
# lines show which step to look at when it grows.
step() {
    local name=$1 started=$SECONDS
    shift
    echo "==> $name: $*" >&2
    if ! "$@"; then
        echo "FAILED at step \"$name\" after $((SECONDS - started)) s: $* (fix this, then run scripts/test.sh again)" >&2
        exit 1
    fi
    echo "==> $name took $((SECONDS - started)) s ($SECONDS s so far)" >&2
}

step setup bash scripts/setup.sh
step format cargo fmt --all -- --check
step clippy cargo clippy --workspace --all-targets -j2 -- -D warnings
step docs env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -j2
step readme-demo bash scripts/readme-demo.sh
# Without this, tests whose server binary is missing would skip instead of failing.
export RDZV_REQUIRE_SERVERS=1
# cargo-nextest runs each test in a process of its own, eight at once (.config/nextest.toml):
# they wait on real servers and timers far more than they compute. It runs no doc tests;
# cargo test does those.
step tests cargo nextest run --workspace --build-jobs 2
step doc-tests cargo test --workspace --doc -j2
step python bash scripts/test-python.sh
step wheel bash scripts/test-wheel.sh
echo "==> all steps passed" >&2
