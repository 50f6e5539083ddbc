#!/usr/bin/env bash
# `make test`, in two lanes side by side:
#   the cluster lane: every test on the session cluster (marked `cluster`, not `own_cluster`), in order;
#   the side lane, at a lower CPU priority: first the tests without a cluster (the decision core, contracts,
#     trainer, chart), then the cluster tests that bring their own cluster (`own_cluster`: real nodes, kind, KWOK,
#     the image builds), each in its own network namespace.
# The cluster lane spends most of its time waiting on Kubernetes' own clocks (node-loss timeouts, grace
# periods), so the side lane fills the idle CPU. `nice` alone does not keep it out of the cluster lane's way:
# with the kernel's autogroup scheduling (on by default) every session is weighted equally whatever its
# niceness, and every cluster process and pod here starts a session of its own. So each lane runs in a CPU
# cgroup of its own where the machine lets us make one (cgroup v1 `cpu` or v2 `cpu.weight`; CI runs as
# root): the cluster lane weighted 16x the side lane, the side lane niced inside its own. The cgroups are
# removed at the end. The cluster lane prints as it goes; the side lane's output follows when both are done,
# and is also kept in .test-logs/. Exit status: non-zero if either lane failed.
set -uo pipefail
py=$1
shift
logs=.test-logs
mkdir -p "$logs"
tmp=$(mktemp -d /tmp/rtj-side-lane.XXXXXX)

# lane_cgroup NAME WEIGHT(1..10000, v2's scale; v1 shares = WEIGHT*1024/100): the new cgroup's directory, or
# nothing where none can be made (no cpu controller, not root): then the lanes run as before, niced only.
cg_v1=/sys/fs/cgroup/cpu
cg_v2=/sys/fs/cgroup
lane_cgroup() {
  local dir
  if [[ -w $cg_v1/cgroup.procs && -f $cg_v1/cpu.shares ]]; then
    dir=$cg_v1/rtj-lane-$1-$$
    mkdir "$dir" 2>/dev/null && echo $(($2 * 1024 / 100)) >"$dir/cpu.shares" 2>/dev/null && echo "$dir"
  elif [[ -w $cg_v2/cgroup.procs ]] && grep -qw cpu "$cg_v2/cgroup.subtree_control" 2>/dev/null; then
    dir=$cg_v2/rtj-lane-$1-$$
    mkdir "$dir" 2>/dev/null && echo "$2" >"$dir/cpu.weight" 2>/dev/null && echo "$dir"
  fi
}
cluster_cg=$(lane_cgroup cluster 1600)
side_cg=$(lane_cgroup side 100)
join() { [[ -n $1 ]] && echo "${2:-$BASHPID}" >"$1/cgroup.procs"; }
cleanup_cgroups() {  # back to the root, then remove both (a leftover process keeps one: say so, leave it)
  local root dir
  for dir in "$cluster_cg" "$side_cg"; do
    [[ -n $dir ]] || continue
    root=$(dirname "$dir")
    while read -r pid; do echo "$pid" >"$root/cgroup.procs" 2>/dev/null; done <"$dir/cgroup.procs"
    rmdir "$dir" 2>/dev/null || echo "note: could not remove $dir (a process is still in it)" >&2
  done
}
[[ -n $cluster_cg ]] && echo ">> lanes in CPU cgroups: $cluster_cg (the cluster lane, weight 1600), $side_cg (the side lane, 100)"

side() {
  local rc=0
  join "$side_cg"
  nice -n 10 "$py" -m pytest -m "not cluster" -p no:cacheprovider --basetemp="$tmp/unit" -o timeout=600 "$@" \
    >"$logs/unit.log" 2>&1 || rc=1
  nice -n 10 "$py" -m pytest -m "cluster and own_cluster" -p no:cacheprovider --basetemp="$tmp/own" "$@" \
    >"$logs/own-cluster.log" 2>&1 || rc=1
  return "$rc"
}
side "$@" &
side_pid=$!
trap 'kill "$side_pid" 2>/dev/null; rm -rf "$tmp"; cleanup_cgroups' EXIT
( join "$cluster_cg"; exec "$py" -m pytest -m "cluster and not own_cluster" "$@" )
cluster_rc=$?
wait "$side_pid"
side_rc=$?
trap - EXIT
rm -rf "$tmp"
cleanup_cgroups
echo "================ the side lane, part 1: no cluster (ran beside the cluster lane; .test-logs/unit.log) ================"
cat "$logs/unit.log"
echo "================ the side lane, part 2: own clusters (.test-logs/own-cluster.log) ================"
cat "$logs/own-cluster.log"
echo "cluster lane: exit ${cluster_rc}; side lane: exit ${side_rc}"
((cluster_rc == 0 && side_rc == 0))
