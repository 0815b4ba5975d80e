#!/usr/bin/env bash
# Builds the release artifacts of the Python package `rdzv` (crates/rdzv-py) into dist/:
#
#   rdzv-<version>-cp39-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
#       one wheel for every CPython >= 3.9 on Linux x86_64 with glibc >= 2.17: the native
#       module, the torchrun backend, and the `rdzv` command line (installed on PATH);
#   rdzv-<version>.tar.gz
#       the sdist: the Python module built from source (needs Rust and protoc), no binary.
#
# The version is the workspace's (Cargo.toml). Both wheels maturin builds here (the binary's,
# whose `rdzv` this script moves into the package's, and the package's) pass maturin's own
# auditwheel check for manylinux_2_17: zig links them against glibc 2.17's symbols, the
# oldest glibc Rust's std supports (a build for 2.12 fails to link: std needs getauxval).
# A native build on this Debian 12 would need glibc 2.34 or newer (manylinux_2_34).
#
# Usage: scripts/wheel.sh [--out DIR]     (default dist/; takes 5–9 minutes on 2 cores
# from a cold build). Needs cargo and protoc (scripts/setup.sh); installs its pinned tools
# (crates/rdzv-py/requirements-wheel.txt) once, into a venv of the machine's venv cache
# (scripts/venv.sh).
set -euo pipefail

log() { echo "wheel: $*" >&2; }
die() { log "$*"; exit 1; }

out=""
while (($# > 0)); do
    case $1 in
        # Relative to where the script is called from.
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$(realpath -m "$2"); shift 2 ;;
        -h | --help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument \`$1\` (usage: scripts/wheel.sh [--out DIR])" ;;
    esac
done
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
out=${out:-$PWD/dist}

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
for bin in cargo protoc python3; do
    command -v "$bin" >/dev/null 2>&1 || die "\`$bin\` is not installed; run scripts/setup.sh"
done

requirements=crates/rdzv-py/requirements-wheel.txt
venv=$(venv_for "$requirements")
# maturin's data folder of the module `rdzv._rdzv`: what is in its scripts/ goes into the
# wheel's `.data/scripts/`, which pip installs on PATH. Never committed, never left behind
# (a build of `./crates/rdzv-py` would otherwise pick up a stale binary).
staged=crates/rdzv-py/rdzv._rdzv.data
# manylinux2014 is manylinux_2_17 (glibc 2.17); maturin tags the wheel with both names.
compatibility=manylinux2014
expected_platforms="manylinux2014_x86_64 manylinux_2_17_x86_64"

if [[ ! -x $venv/bin/python ]]; then
    log "creating $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
fi
# Nothing to fetch when the pins are installed; otherwise from the index.
if ! "$venv/bin/python" -m pip install --quiet --no-index -r "$requirements" >/dev/null 2>&1; then
    log "installing $requirements into $venv"
    "$venv/bin/python" -m pip install --quiet -r "$requirements"
fi
export PATH="$venv/bin:$PATH"

version=$(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "rdzv-py"))')

work=$(mktemp -d)
cleanup() { rm -rf "$work" "$staged"; }
trap cleanup EXIT
rm -rf "$staged"
mkdir -p "$out"
rm -f "$out/rdzv-$version-"*.whl "$out/rdzv-$version.tar.gz"
start=$SECONDS

# The sdist first, while no binary is staged (it would be packed into the sdist too).
log "sdist of rdzv $version"
maturin sdist -m crates/rdzv-py/Cargo.toml --out "$out" >&2

common=(--release --locked --zig --compatibility "$compatibility")
log "the rdzv binary (crates/rdzv-cli), for $compatibility"
maturin build "${common[@]}" -b bin -m crates/rdzv-cli/Cargo.toml --out "$work/cli" >&2
python3 -m zipfile -e "$work"/cli/rdzv_cli-*.whl "$work/cli/unpacked"
cli=$(echo "$work"/cli/unpacked/rdzv_cli-*.data/scripts/rdzv)
[[ -f $cli ]] || die "the binary's wheel has no scripts/rdzv: $(ls -R "$work/cli/unpacked")"
mkdir -p "$staged/scripts"
install -m 755 "$cli" "$staged/scripts/rdzv"

log "the wheel of rdzv $version (crates/rdzv-py, with the binary), for $compatibility"
maturin build "${common[@]}" -m crates/rdzv-py/Cargo.toml --out "$out" >&2

# What maturin wrote must be what was asked for: the tags, the version, the very binary.
python3 - "$out" "$version" "$cli" "$expected_platforms" <<'PY'
import hashlib
import sys
import zipfile
from pathlib import Path

out, version, cli, platforms = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4].split()
wheels = sorted(out.glob(f"rdzv-{version}-*.whl"))
sdists = sorted(out.glob(f"rdzv-{version}.tar.gz"))
assert len(wheels) == 1 and len(sdists) == 1, f"expected one wheel and one sdist in {out}: {wheels + sdists}"
wheel = wheels[0]
with zipfile.ZipFile(wheel) as z:
    tags = sorted(
        line.split(":", 1)[1].strip()
        for line in z.read(f"rdzv-{version}.dist-info/WHEEL").decode().splitlines()
        if line.startswith("Tag:")
    )
    expected = sorted(f"cp39-abi3-{p}" for p in platforms)
    assert tags == expected, f"{wheel.name} is tagged {tags}, expected {expected}"
    script = z.getinfo(f"rdzv-{version}.data/scripts/rdzv")
    assert script.external_attr >> 16 & 0o111, f"{script.filename} is not executable in {wheel.name}"
    shipped = hashlib.sha256(z.read(script)).hexdigest()
assert shipped == hashlib.sha256(cli.read_bytes()).hexdigest(), "the wheel's rdzv is not the binary built here"
for f in (wheel, sdists[0]):
    print(f"wheel: {f} ({f.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
print(f"wheel: tags {' '.join(tags)}", file=sys.stderr)
PY
log "done in $((SECONDS - start)) s"
