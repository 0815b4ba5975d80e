#!/usr/bin/env bash
# Installs what building and testing rdzv needs on a Debian machine, when it is missing:
# protoc and protobuf's well-known .proto files (the etcd client's build needs both), etcd
# and redis-server (the tests start their own servers from these binaries), prometheus (the
# metrics test starts one to scrape `rdzv run`), and the Rust components rustfmt and clippy.
# Idempotent, and silent when everything is already there. It starts no server.
set -euo pipefail

log() { echo "setup: $*" >&2; }
die() { log "$*"; exit 1; }

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# protoc alone is not enough: the etcd client's protos import protobuf's well-known types
# (google/protobuf/*.proto), which Debian ships in libprotobuf-dev, not in protobuf-compiler.
protoc_has_includes() {
    local dir
    dir=$(mktemp -d) || return 1
    printf 'syntax = "proto3";\nimport "google/protobuf/descriptor.proto";\n' >"$dir/probe.proto"
    protoc --proto_path="$dir" --descriptor_set_out=/dev/null "$dir/probe.proto" >/dev/null 2>&1
    local rc=$?
    rm -rf "$dir"
    return $rc
}
command -v protoc >/dev/null 2>&1 && protoc_has_includes || missing+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)

if ((${#missing[@]} > 0)); then
    command -v apt-get >/dev/null 2>&1 \
        || die "no apt-get here (not Debian?): install ${missing[*]} by hand, then run this again"
    if [[ $(id -u) -eq 0 ]]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        die "installing ${missing[*]} needs root: run this as root or install sudo"
    fi
    log "installing ${missing[*]}"
    # Keep the packages' install scripts from starting system services (the tests start
    # their own servers): a policy-rc.d that refuses, unless one is already in place.
    policy=/usr/sbin/policy-rc.d
    if [[ ! -e $policy ]]; then
        "${as_root[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
        trap '"${as_root[@]}" rm -f "$policy"' EXIT
    fi
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
        || die "apt-get update failed"
    # Quiet unless it fails (debconf chatters on stderr even with -qq).
    if ! out=$("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" 2>&1); then
        printf '%s\n' "$out" >&2
        die "apt-get install ${missing[*]} failed"
    fi
    for tool in protoc etcd redis-server prometheus; do
        command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is still missing after installing ${missing[*]}"
    done
    protoc_has_includes \
        || die "protoc cannot find google/protobuf/descriptor.proto after installing ${missing[*]} (the etcd client's build needs protobuf's well-known .proto files)"
fi

components=()
cargo fmt --version >/dev/null 2>&1 || components+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || components+=(clippy)
if ((${#components[@]} > 0)); then
    command -v rustup >/dev/null 2>&1 \
        || die "cargo lacks ${components[*]} and there is no rustup to add them"
    log "adding the Rust components ${components[*]}"
    rustup component add --quiet "${components[@]}" >/dev/null || die "rustup could not add ${components[*]}"
fi
