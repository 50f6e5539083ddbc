#!/usr/bin/env bash
# The newcomer's first command, timed cold: `make demo` in a fresh clone of this repository with no binary
# cache, no Go module or build cache and no pip cache (each pointed at an empty directory, removed after).
# Prints each output line with the seconds since the start, then the total and the machine's load average
# (a figure from a busy machine is not one from a quiet one).
#
#   bash bench/cold_demo.sh [WORKDIR]     (default: a new temporary directory)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d /tmp/rtj-cold-demo.XXXXXX)}"
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
cd "$work/clone"
export RTJ_CACHE="$work/cache" GOCACHE="$work/go/cache" GOMODCACHE="$work/go/mod" PIP_NO_CACHE_DIR=1
start=$(date +%s)
echo "start $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg), $(git log --oneline -1)"
set +e
make demo 2>&1 | while IFS= read -r line; do printf '%6ds %s\n' $(( $(date +%s) - start )) "$line"; done
rc=${PIPESTATUS[0]}
set -e
echo "make demo: exit $rc in $(( $(date +%s) - start )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
chmod -R u+w "$work/go" 2>/dev/null || true  # Go's module cache is read-only
exit "$rc"
