# Sourced by the test scripts: where the virtualenv of a requirements file lives. Several GB
# each (torch and its CUDA libraries), so they live outside any checkout, in one cache that
# every checkout and CI run of this machine shares: $RDZV_VENVS, else
# ${XDG_CACHE_HOME:-~/.cache}/rdzv/venvs. A venv is named after its requirements file and a
# hash of its content, so a changed pin makes a new one (and `venv_prune` removes the others).

# venv_for REQUIREMENTS: prints the venv's path for REQUIREMENTS (a file under the checkout).
venv_for() {
    local requirements=$1 root name hash
    root=${RDZV_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/rdzv/venvs}
    name=$(basename "$requirements" .txt)
    hash=$(sha256sum "$requirements" | cut -c1-12)
    echo "$root/$name-$hash"
}

# venv_prune REQUIREMENTS: removes the venvs of REQUIREMENTS' earlier contents — only those
# named after this very file and a 12-digit hash (requirements-test's pruning must not take
# requirements-test-oldest's venv).
venv_prune() {
    local keep old
    keep=$(venv_for "$1")
    for old in "${keep%-*}"-*; do
        if [[ -d $old && $old != "$keep" && ${old##*/} =~ ^$(basename "$1" .txt)-[0-9a-f]{12}$ ]]; then
            echo "venv: removing $old (made for an earlier $(basename "$1"))" >&2
            rm -rf "$old"
        fi
    done
}
