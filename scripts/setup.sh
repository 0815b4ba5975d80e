#!/usr/bin/env bash
# Installs what building and testing rdzv needs on a Debian machine, when it is missing:
# protoc and protobuf's well-known .proto files (the etcd client's build needs both), etcd
# and redis-server (the tests start their own servers from these binaries), prometheus (the
# metrics test starts one to scrape `rdzv run`), Slurm's slurmctld, slurmd, slurm-client and
# munge (the Python tests start a cluster of their own on this host from these:
# crates/rdzv-py/tests/slurm_cluster.py), cargo-nextest (which runs the tests), and the Rust
# components rustfmt and clippy.
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
# etcd 3.5 or later: 3.4 (bookworm's) is past its end of life, and it copies its uncommitted
# writes for every answer, which dominates the cost of thousands of sessions.
etcd_version() { etcd --version 2>/dev/null | awk '/^etcd Version:/ { print $3 }'; }
etcd_is_current() {
    local version
    version=$(etcd_version)
    [[ -n $version ]] && printf '3.5\n%s\n' "$version" | sort --version-sort --check=quiet
}
want_etcd=false
etcd_is_current || want_etcd=true
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
# Slurm's daemons and munged live in /usr/sbin, which a user's PATH may lack.
has_sbin() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null 2>&1; }
has_sbin slurmctld || missing+=(slurmctld)
has_sbin slurmd || missing+=(slurmd)
command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
has_sbin munged || missing+=(munge)

# apt-helper download-file URL FILE [SHA256:hash], quiet unless it fails.
download() {
    local out
    # apt-helper checks the hash; it warns that root downloads into a folder its own user
    # cannot write, so its words are shown only when it fails.
    out=$(/usr/lib/apt/apt-helper download-file "$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}

# etcd-server from Debian 13 (trixie), for a Debian whose own etcd is older than 3.5. Trust
# follows the archive's: the suite's InRelease must carry a good signature from the keys apt
# trusts, the package index must match the hash it lists, and the package the hash the index
# lists. Downloads into the folder $1 and prints the package's path.
etcd_from_trixie() {
    local dir=$1 mirror=http://deb.debian.org/debian suite=trixie arch index_hash deb deb_hash
    arch=$(dpkg --print-architecture)
    download "$mirror/dists/$suite/InRelease" "$dir/InRelease" \
        || die "could not download $mirror/dists/$suite/InRelease"
    gpgv --keyring /usr/share/keyrings/debian-archive-keyring.gpg --output "$dir/Release" "$dir/InRelease" 2>/dev/null \
        || die "$suite's InRelease has no good signature from the Debian archive keys"
    # The SHA256 section lists the index after the MD5 one: its hash is the last match.
    index_hash=$(awk -v f="main/binary-$arch/Packages.gz" '$3 == f { h = $1 } END { print h }' "$dir/Release")
    [[ ${#index_hash} -eq 64 ]] || die "$suite's Release lists no main/binary-$arch/Packages.gz"
    download "$mirror/dists/$suite/main/binary-$arch/Packages.gz" "$dir/Packages.gz" "SHA256:$index_hash" \
        || die "could not download $suite's package index (or its hash is not the one its Release lists)"
    read -r deb deb_hash < <(gzip -dc "$dir/Packages.gz" | awk '
        /^Package: / { p = ($2 == "etcd-server") }
        p && /^Filename: / { f = $2 }
        p && /^SHA256: / { h = $2 }
        /^$/ && p && f != "" { print f, h; exit }')
    [[ -n ${deb:-} && ${#deb_hash} -eq 64 ]] || die "$suite has no etcd-server for $arch"
    download "$mirror/$deb" "$dir/${deb##*/}" "SHA256:$deb_hash" \
        || die "could not download $mirror/$deb (or its hash is not the one $suite's index lists)"
    echo "$dir/${deb##*/}"
}

if ((${#missing[@]} > 0)) || $want_etcd; then
    command -v apt-get >/dev/null 2>&1 \
        || die "no apt-get here (not Debian?): install ${missing[*]} and etcd 3.5 or later by hand, then run this again"
    if [[ $(id -u) -eq 0 ]]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        die "installing ${missing[*]} needs root: run this as root or install sudo"
    fi
    # Keep the packages' install scripts from starting system services (the tests start
    # their own servers): a policy-rc.d that refuses, unless one is already in place.
    # Refused, invoke-rc.d returns success, so the postinsts that start a service (munge,
    # slurmctld, slurmd: `invoke-rc.d ... || exit 1`) do not fail; the Slurm ones also start
    # nothing without /etc/slurm/slurm.conf, which none of these packages installs.
    policy=/usr/sbin/policy-rc.d
    downloads=$(mktemp -d /tmp/rdzv-setup-XXXXXX)
    chmod 755 "$downloads" # apt-get reads a local package as its own unprivileged user
    cleanup() { rm -rf "$downloads"; }
    if [[ ! -e $policy ]]; then
        "${as_root[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
        cleanup() { rm -rf "$downloads"; "${as_root[@]}" rm -f "$policy"; }
    fi
    trap cleanup EXIT
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
        || die "apt-get update failed"
    local_packages=()
    if $want_etcd; then
        candidate=$(apt-cache policy etcd-server 2>/dev/null | awk '/Candidate:/ { print $2 }')
        if [[ -n $candidate && $candidate != "(none)" ]] && dpkg --compare-versions "$candidate" ge 3.5; then
            missing+=(etcd-server)
        else
            log "this Debian's etcd-server (${candidate:-none}) is older than 3.5: taking Debian 13's"
            deb=$(etcd_from_trixie "$downloads") || exit 1
            local_packages+=("$deb")
        fi
    fi
    installing=("${missing[@]}" "${local_packages[@]##*/}")
    log "installing ${installing[*]}"
    # Quiet unless it fails (debconf chatters on stderr even with -qq).
    if ! out=$("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" "${local_packages[@]}" 2>&1); then
        printf '%s\n' "$out" >&2
        die "apt-get install ${installing[*]} failed"
    fi
    etcd_is_current || die "etcd is $(etcd_version) after installing, still older than 3.5"
    for tool in protoc etcd redis-server prometheus sbatch; do
        command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is still missing after installing ${missing[*]}"
    done
    for tool in slurmctld slurmd munged; do
        has_sbin "$tool" || die "\`$tool\` is still missing after installing ${missing[*]}"
    done
    protoc_has_includes \
        || die "protoc cannot find google/protobuf/descriptor.proto after installing ${missing[*]} (the etcd client's build needs protobuf's well-known .proto files)"
fi

# cargo-nextest runs the tests (scripts/test.sh): each test in a process of its own, several
# at once, with a time limit each. Its `priority` setting (.config/nextest.toml) needs 0.9.91
# or later; this machine image ships it, elsewhere it is built from crates.io (minutes).
nextest_is_current() {
    local version
    version=$(cargo nextest --version 2>/dev/null | awk 'NR == 1 { print $2 }')
    [[ -n $version ]] && printf '0.9.91\n%s\n' "$version" | sort --version-sort --check=quiet
}
if ! nextest_is_current; then
    log "installing cargo-nextest (cargo install --locked cargo-nextest)"
    cargo install --locked --quiet cargo-nextest || die "cargo install cargo-nextest failed"
    nextest_is_current || die "cargo-nextest is still missing or older than 0.9.91 after installing it"
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
