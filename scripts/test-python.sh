#!/usr/bin/env bash
# The Python package (crates/rdzv-py) and the torchrun backend, tested with real torch, etcd
# and Redis. Creates or reuses two virtualenvs in the machine's venv cache (scripts/venv.sh:
# outside the checkout, shared by every checkout and CI run): one with the pinned torch
# (requirements-test.txt), where every test runs, three at a time (pytest-xdist), and one with
# the oldest torch release the backend supports (requirements-test-oldest.txt), where the
# tests of how a job ends (test_lifecycle.py) run again through torchrun, since torch's calls
# of the backend differ between releases. Installs the pinned tools and torch into each only
# when they are missing (pip's normal cache keeps the wheels, so a new venv installs without
# downloading again), installs the package into each as a contributor does (`pip install
# ./crates/rdzv-py`, built once: install_package below), and runs pytest. Fails loudly when something is missing; never
# skips. Arguments go to the first pytest run.
#
# scripts/test.sh runs the parts one at a time, so that they overlap with its other steps:
# `--prepare` only prepares the two venvs, `--install` also installs the package into them,
# and `--tests [ARGS]` runs the tests on what `--install` installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh

for bin in etcd redis-server python3; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "test-python: \`$bin\` is not installed; run scripts/setup.sh" >&2
        exit 1
    fi
done

# Two cores: keep the Rust build inside pip's build at two jobs.
export CARGO_BUILD_JOBS=2

# prepare REQUIREMENTS: the virtualenv of REQUIREMENTS, with its pins.
prepare() {
    local requirements=$1 venv
    venv=$(venv_for "$requirements")
    venv_prune "$requirements"
    if [[ ! -x $venv/bin/python ]]; then
        echo "test-python: creating $venv" >&2
        mkdir -p "$(dirname "$venv")"
        python3 -m venv "$venv"
    fi
    # Install only when a pinned requirement is not satisfied (a quick check, no network).
    if ! "$venv/bin/python" - "$requirements" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, pinned = line.partition("==")
    try:
        if version(name) != pinned:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
    then
        echo "test-python: installing $requirements into $venv (torch is several GB the first time)" >&2
        "$venv/bin/python" -m pip install --quiet -r "$requirements"
    fi
}

# install_package: the package, built the way a contributor's `pip install ./crates/rdzv-py`
# builds it — pip's PEP 517 build with maturin's backend, which pip installs into an
# isolated build environment from the index, pinned to the requirements' maturin by
# PIP_CONSTRAINT — once (`pip wheel`), then installed into both venvs. Built in the dev
# profile (maturin's PEP 517 backend reads MATURIN_PEP517_ARGS; its default is a release
# build, a second full build of every dependency) into the workspace's target directory,
# so it reuses what the Rust tests built.
install_package() {
    local built venv
    built=$(mktemp -d)
    PIP_CONSTRAINT=$PWD/$pinned MATURIN_PEP517_ARGS="--profile dev" \
        "$(venv_for "$pinned")/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
        --wheel-dir "$built" ./crates/rdzv-py
    for venv in "$(venv_for "$pinned")" "$(venv_for "$oldest")"; do
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
            "$built"/rdzv-*.whl
    done
    rm -rf "$built"
}

# run_pytest REQUIREMENTS ARGS...: pytest in the venv of REQUIREMENTS (exit 5, no test
# collected, is a failure too).
run_pytest() {
    local venv code
    venv=$(venv_for "$1")
    shift
    set +e
    VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::UserWarning "$@"
    code=$?
    set -e
    if [[ $code -eq 5 ]]; then
        echo "test-python: pytest collected no test ($*)" >&2
        return 1
    fi
    return $code
}

pinned=crates/rdzv-py/requirements-test.txt
oldest=crates/rdzv-py/requirements-test-oldest.txt
part=all
case ${1:-} in
    --prepare | --install | --tests) part=${1#--}; shift ;;
esac
if [[ $part != tests ]]; then
    prepare "$pinned"
    prepare "$oldest"
fi
[[ $part != prepare ]] || exit 0
[[ $part == tests ]] || install_package
[[ $part != install ]] || exit 0
# The `rdzv` binary, for the tests of `rdzv run` driving torch, and `rdzv-netfault`, the
# partition harness (conftest.py's `Link`); both already built by the Rust tests, wherever
# the target directory is.
cargo build --quiet -p rdzv-cli -p rdzv-netfault
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug
export RDZV_BIN=${RDZV_BIN:-$bin/rdzv} RDZV_NETFAULT_BIN=${RDZV_NETFAULT_BIN:-$bin/rdzv-netfault}

# Three at a time: the tests wait on agents, servers and TTLs more than they compute, and
# their timing bounds (a fenced node's workers stopped within the TTL and a few seconds, …)
# hold with three on two cores; with six, torch's start-up under load broke them.
run_pytest "$pinned" -n 3 --dist worksteal crates/rdzv-py/tests "$@"
version=$("$(venv_for "$oldest")/bin/python" -W ignore -c 'import torch; print(torch.__version__)')
echo "test-python: how a job ends through torchrun, on torch $version" >&2
run_pytest "$oldest" crates/rdzv-py/tests/test_lifecycle.py -k torchrun
