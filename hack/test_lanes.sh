#!/usr/bin/env bash
# `make test`: the cluster lane (every test marked `cluster`, in order, on the session cluster) and the unit
# lane (no cluster: the decision core, contracts, trainer, chart) run side by side. The cluster lane spends
# most of its time waiting on Kubernetes' own clocks (node-loss timeouts, grace periods), so the unit lane
# fills the idle CPU; it runs at a lower priority so the cluster lane's timing stays close to what it is
# alone. The cluster lane prints as it goes; the unit lane's output follows when both are done, and is
# also kept in .test-logs/unit.log. Exit status: non-zero if either lane failed.
set -uo pipefail
py=$1
shift
logs=.test-logs
mkdir -p "$logs"
tmp=$(mktemp -d /tmp/rtj-unit-lane.XXXXXX)
nice -n 10 "$py" -m pytest -m "not cluster" -p no:cacheprovider --basetemp="$tmp/t" -o timeout=600 "$@" \
  >"$logs/unit.log" 2>&1 &
unit=$!
trap 'kill "$unit" 2>/dev/null; rm -rf "$tmp"' EXIT
"$py" -m pytest -m cluster "$@"
cluster_rc=$?
wait "$unit"
unit_rc=$?
trap - EXIT
rm -rf "$tmp"
echo "================ the unit lane (ran beside the cluster lane; .test-logs/unit.log) ================"
cat "$logs/unit.log"
echo "cluster lane: exit ${cluster_rc}; unit lane: exit ${unit_rc}"
((cluster_rc == 0 && unit_rc == 0))
