#!/usr/bin/env bash
# The Python package as a user gets it. Builds the release wheel once (scripts/wheel.sh, into
# target/wheel-test/), then pip-installs that file, without an index and refusing anything
# but wheels, into virtualenvs used in an environment that has no cargo, rustc, protoc or C
# compiler on PATH (`env -i`; PATH is the venv's bin/ and a folder holding only `etcd`):
#
#  1. a fresh venv without torch: `import rdzv` (no torch), the version, the metadata, the
#     `rdzv` binary on PATH, `rdzv demo`, `python -m rdzv` (scripts/wheel_checks.py);
#  2. a fresh venv of the oldest CPython the wheel claims (3.9), when one is installed;
#  3. the python step's venv of the pinned torch (scripts/venv.sh; torch is several GB and is
#     installed once, so it is reused rather than installed into a venv of its own): its
#     rdzv is replaced by the wheel (`rdzv[torch]` resolved against the pinned torch with no
#     index), then torchrun with `--rdzv-backend=rdzv` (2 agents x 2 workers) and `rdzv run`
#     (2 nodes x 2 workers) on a real etcd: the tests of crates/rdzv-py/tests that need
#     nothing but the wheel. The python step's `pip install ./crates/rdzv-py` puts the
#     checkout's build back the next time it runs.
#
# With `--built DIR`, checks the wheel already built into DIR by `scripts/wheel.sh --out DIR`
# (scripts/test.sh builds it beside the other steps) instead of building it.
#
# Records the wheel's name, tags and size, and fails if the wheel is larger than 11 MiB (see
# max_wheel_bytes). Fails loudly when something is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh

log() { echo "test-wheel: $*" >&2; }
die() { log "$*"; exit 1; }

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
for bin in etcd python3 cargo; do
    command -v "$bin" >/dev/null 2>&1 || die "\`$bin\` is not installed; run scripts/setup.sh"
done

out=target/wheel-test
built_by=""
case ${1:-} in
    "") ;;
    --built) [[ $# -eq 2 ]] || die "--built needs a directory"; out=$2; built_by=$2 ;;
    *) die "unknown argument \`$1\` (usage: scripts/test-wheel.sh [--built DIR])" ;;
esac
requirements=crates/rdzv-py/requirements-test.txt
venv=$(venv_for "$requirements")
start=$SECONDS

if [[ -z $built_by ]]; then
    rm -rf "$out"
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} bash scripts/wheel.sh --out "$out"
fi
built=$SECONDS
wheels=("$out"/rdzv-*.whl)
[[ ${#wheels[@]} -eq 1 && -f ${wheels[0]} ]] || die "expected one wheel in $out: ${wheels[*]}"
wheel=$PWD/${wheels[0]}

# The size bound: 11 MiB, 1.5 times the 7,571,154 bytes docs/TESTING.md records ("The
# wheel"), rounded up. The headroom takes the growth of ordinary work (new features, updated
# dependencies); what crosses it is a mistake to look at, not to wave through by raising the
# bound: debug info or symbols left in a release binary, a second copy of a binary, a
# dependency pulled in by accident. Checked before the slow steps, so it fails early.
max_wheel_bytes=$((11 * 1024 * 1024))
wheel_bytes=$(stat -c %s "$wheel")
((wheel_bytes <= max_wheel_bytes)) ||
    die "$(basename "$wheel") is $wheel_bytes bytes, over the bound of $max_wheel_bytes (11 MiB); see the comment above max_wheel_bytes"

# What the installed package must say, from the workspace (read here, where cargo is).
IFS=$'\t' read -r version license repository < <(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
p = next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "rdzv-py")
print(p["version"], p["license"], p["repository"], sep="\t")')
pin() { grep -E "^$1==" "$requirements" || die "$requirements pins no $1"; }
torch_pin=$(pin torch)
pytest_pin=$(pin pytest)

sandbox=$(mktemp -d)
trap 'rm -rf "$sandbox"' EXIT
mkdir "$sandbox/tools"
ln -s "$(command -v etcd)" "$sandbox/tools/etcd"
# `in_venv VENV CMD...`: CMD with nothing of this environment but HOME, and the PATH of a user
# of VENV (plus etcd for the tests that start one).
in_venv() {
    local v=$1
    shift
    env -i HOME="$HOME" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" VIRTUAL_ENV="$v" PATH="$v/bin:$sandbox/tools" "$@"
}
# `install VENV SPEC`: pip from the wheel file only; prints pip's output, which must show no build.
install() {
    local v=$1 spec=$2 log_file=$sandbox/pip.log
    in_venv "$v" "$v/bin/python" -m pip install --no-index --only-binary=:all: --no-build-isolation \
        --disable-pip-version-check "$spec" >"$log_file" 2>&1 || { cat "$log_file" >&2; die "pip could not install $spec into $v"; }
    # (The lines of torch's own requirements, already satisfied, are left out.)
    grep -vE "^Requirement already satisfied: [^ ]+ .*->" "$log_file" | sed 's/^/    pip: /' >&2
    grep -q "Successfully installed.* rdzv-$version" "$log_file" || die "pip did not install rdzv $version"
    if grep -qiE "building wheel|preparing metadata|running setup.py|getting requirements to build" "$log_file"; then
        die "pip built something instead of installing the wheel"
    fi
}

log "1. a fresh venv without torch ($(python3 --version))"
python3 -m venv "$sandbox/user"
install "$sandbox/user" "$wheel"
in_venv "$sandbox/user" "$sandbox/user/bin/python" scripts/wheel_checks.py user "$version" "$license" "$repository"

oldest=""
if command -v pyenv >/dev/null 2>&1; then
    oldest=$(ls -d "$(pyenv root)"/versions/3.9.*/bin/python3.9 2>/dev/null | sort -V | tail -n 1 || true)
fi
[[ -n $oldest ]] || oldest=$(command -v python3.9 || true)
if [[ -n $oldest ]]; then
    log "2. a fresh venv of $("$oldest" --version), the oldest the wheel claims"
    "$oldest" -m venv "$sandbox/oldest"
    install "$sandbox/oldest" "$wheel"
    in_venv "$sandbox/oldest" "$sandbox/oldest/bin/python" scripts/wheel_checks.py basic "$version"
else
    log "2. NOT CHECKED: no CPython 3.9 here (pyenv or python3.9), so requires-python's floor is untested"
fi

log "3. $venv, with $torch_pin"
if [[ ! -x $venv/bin/python ]]; then
    log "creating $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -m pip install --quiet --no-index "$torch_pin" "$pytest_pin" >/dev/null 2>&1; then
    log "installing $torch_pin $pytest_pin into $venv (several GB the first time)"
    "$venv/bin/python" -m pip install --quiet "$torch_pin" "$pytest_pin"
fi
in_venv "$venv" "$venv/bin/python" -m pip uninstall --yes --quiet rdzv 2>/dev/null || true
# `[torch]` with no index: pip must find the extra satisfied by the pinned torch already there.
install "$venv" "$wheel[torch]"
in_venv "$venv" "$venv/bin/python" -m pip check >&2 || die "pip check found broken requirements in $venv"
in_venv "$venv" "$venv/bin/python" scripts/wheel_checks.py basic "$version"
tests=crates/rdzv-py/tests
set +e
in_venv "$venv" RDZV_BIN="$venv/bin/rdzv" "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
    "$tests/test_torchrun.py::test_entry_point_registers_the_backend_and_its_store_serves_the_agent" \
    "$tests/test_torchrun.py::test_two_agents_two_workers_each_form_a_world_of_4[etcd]" \
    "$tests/test_rdzv_run.py::test_rdzv_run_two_nodes_two_workers_all_reduce"
code=$?
set -e
((code != 5)) || die "pytest collected no test"
((code == 0)) || die "the torch tests failed with the installed wheel (pytest exited $code)"

log "$(basename "$wheel"): $wheel_bytes bytes ($((wheel_bytes / 1024)) KiB, bound $((max_wheel_bytes / 1024)) KiB); ${built_by:+built beforehand, }built in $((built - start)) s, checked in $((SECONDS - built)) s"
