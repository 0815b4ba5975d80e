#!/usr/bin/env bash
# The Python package (crates/rdzv-py) and the torchrun backend, tested with real torch, etcd
# and Redis. Creates or reuses the virtualenv .venv-py/ (git-ignored), installs the pinned
# tools and torch into it only when they are missing (pip's normal cache keeps the wheels,
# so a fresh clone reinstalls without downloading again), installs the package into it as a
# contributor does (`pip install ./crates/rdzv-py`, below), and runs pytest. Fails loudly
# when something is missing; never skips.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=.venv-py
requirements=crates/rdzv-py/requirements-test.txt

for bin in etcd redis-server python3; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "test-python: \`$bin\` is not installed; run scripts/setup.sh" >&2
        exit 1
    fi
done

if [[ ! -x $venv/bin/python ]]; then
    echo "test-python: creating $venv" >&2
    python3 -m venv "$venv"
fi
py=$venv/bin/python

# Install only when a pinned requirement is not satisfied (a quick check, no network).
if ! "$py" - "$requirements" <<'PY'
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
    "$py" -m pip install --quiet -r "$requirements"
fi

export VIRTUAL_ENV=$PWD/$venv
export PATH=$PWD/$venv/bin:$PATH
# Two cores: keep the Rust build inside pip's build at two jobs.
export CARGO_BUILD_JOBS=2
# The package, installed the way a contributor does from a checkout: `pip install
# ./crates/rdzv-py` (a regular, non-editable install; pip builds it in place with maturin's
# PEP 517 backend, which it installs into an isolated build environment from the index,
# pinned to requirements-test.txt's maturin by PIP_CONSTRAINT). Built in the dev profile
# (maturin's PEP 517 backend reads MATURIN_PEP517_ARGS; its default is a release build, a
# second full build of every dependency) into the workspace's target directory, so it
# reuses what the Rust tests built.
PIP_CONSTRAINT=$PWD/$requirements MATURIN_PEP517_ARGS="--profile dev" \
    "$py" -m pip install --quiet --disable-pip-version-check ./crates/rdzv-py
# The `rdzv` binary, for the test of `rdzv run` driving torch, and `rdzv-netfault`, the
# partition harness (conftest.py's `Link`); both already built by the Rust tests.
cargo build --quiet -p rdzv-cli -p rdzv-netfault

# pytest exits 5 when it collected no test: that is a failure here too.
set +e
"$py" -m pytest -q -p no:cacheprovider -W ignore::UserWarning crates/rdzv-py/tests "$@"
code=$?
set -e
if [[ $code -eq 5 ]]; then
    echo "test-python: pytest collected no test" >&2
    exit 1
fi
exit $code
