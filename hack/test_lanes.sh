#!/usr/bin/env bash
# `make test`, in two lanes side by side:
#   the cluster lane: every test on the session cluster (marked `cluster`, not `own_cluster`), in order;
#   the side lane, at a lower CPU priority: first the tests without a cluster (the decision core, contracts,
#     trainer, chart), then the cluster tests that bring their own cluster (`own_cluster`: real nodes, kind, KWOK,
#     the image builds), each in its own network namespace.
# The cluster lane spends most of its time waiting on Kubernetes' own clocks (node-loss timeouts, grace
# periods), so the side lane fills the idle CPU; being niced, it leaves the cluster lane's timing close to
# what it is alone. The cluster lane prints as it goes; the side lane's output follows when both are done,
# and is also kept in .test-logs/. Exit status: non-zero if either lane failed.
set -uo pipefail
py=$1
shift
logs=.test-logs
mkdir -p "$logs"
tmp=$(mktemp -d /tmp/rtj-side-lane.XXXXXX)
side() {
  local rc=0
  nice -n 10 "$py" -m pytest -m "not cluster" -p no:cacheprovider --basetemp="$tmp/unit" -o timeout=600 "$@" \
    >"$logs/unit.log" 2>&1 || rc=1
  nice -n 10 "$py" -m pytest -m "cluster and own_cluster" -p no:cacheprovider --basetemp="$tmp/own" "$@" \
    >"$logs/own-cluster.log" 2>&1 || rc=1
  return "$rc"
}
side "$@" &
side_pid=$!
trap 'kill "$side_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
"$py" -m pytest -m "cluster and not own_cluster" "$@"
cluster_rc=$?
wait "$side_pid"
side_rc=$?
trap - EXIT
rm -rf "$tmp"
echo "================ the side lane, part 1: no cluster (ran beside the cluster lane; .test-logs/unit.log) ================"
cat "$logs/unit.log"
echo "================ the side lane, part 2: own clusters (.test-logs/own-cluster.log) ================"
cat "$logs/own-cluster.log"
echo "cluster lane: exit ${cluster_rc}; side lane: exit ${side_rc}"
((cluster_rc == 0 && side_rc == 0))
