#!/usr/bin/env bash
# Runs the README's main command exactly as the README writes it (the part after
# `./scripts/setup.sh &&`, which the test command has already run) and checks that the demo
# shows two completed rounds. Keeps the README's first command from rotting.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The first command of the first ```sh block, as a newcomer would copy it.
line=$(awk '/^```(sh|bash|shell)$/ { inblock = 1; next } /^```/ { if (inblock) exit } inblock' README.md \
    | grep -v '^[[:space:]]*#' | head -n 1)
[[ -n $line ]] || { echo "readme-demo: README.md has no \`\`\`sh block" >&2; exit 1; }
command=${line#*./scripts/setup.sh && }
[[ $command != "$line" ]] || { echo "readme-demo: the README's first command does not start with './scripts/setup.sh && ': $line" >&2; exit 1; }

echo "readme-demo: $command" >&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! bash -c "$command" >"$out" 2>&1; then
    tail -n 30 "$out" >&2
    echo "readme-demo: the README's main command failed: $command" >&2
    exit 1
fi
rounds=$(grep -cE '^round [0-9]+:' "$out" || true)
if ((rounds < 2)); then
    tail -n 30 "$out" >&2
    echo "readme-demo: the demo showed $rounds completed round(s), expected 2" >&2
    exit 1
fi
echo "readme-demo: $rounds completed rounds" >&2
