#!/usr/bin/env bash
# `make test`: the setup, overlapped, then two lanes side by side.
# The setup: the Go builds (`make binaries`, CPU-bound) run beside the venv's install (network-bound) and lint;
# the images from our Dockerfiles (`python -m e2e.images build`: debootstrap and pip, network and disk) start
# as soon as the venv exists and may run on into the lanes (the tests that use them wait on each image's lock);
# kind's node image and `docker build`s (`python -m e2e.kindcluster prepare`) run in the side lane
# beside the unit tests. On a warm machine each finds its cache at once; on a cold one this takes the image
# builds off the side lane's path (they had run one after another after the unit tests).
# The lanes:
#   the cluster lane: every test on the session cluster (marked `cluster`, not `own_cluster`), in order;
#   the side lane, at a lower CPU priority: first the tests without a cluster (the decision core, contracts,
#     trainer, chart), then the cluster tests that bring their own cluster (`own_cluster`: real nodes, kind, KWOK,
#     the image builds), each in its own network namespace.
# The cluster lane spends most of its time waiting on Kubernetes' own clocks (node-loss timeouts, grace
# periods), so the side lane fills the idle CPU. `nice` alone does not keep it out of the cluster lane's way:
# with the kernel's autogroup scheduling (on by default) every session is weighted equally whatever its
# niceness, and every cluster process and pod here starts a session of its own. So each lane runs in a CPU
# cgroup of its own where the machine lets us make one (cgroup v1 `cpu` or v2 `cpu.weight`; CI runs as
# root): the cluster lane weighted 3x the side lane and kind's engine 2x (kind's nodes run a whole cluster
# for the side lane's kind tests), the side lane niced inside its own. The cgroups are removed at the end, and the
# CPU time each lane used is printed. The cluster lane prints as it goes; the side lane's output follows when both are done,
# and is also kept in .test-logs/. Exit status: non-zero if either lane failed.
set -uo pipefail
py=$1
shift
logs=.test-logs
mkdir -p "$logs"
make=${MAKE:-make}

echo ">> the Go builds (make binaries) beside the venv and lint (log: $logs/binaries.log)"
"$make" --no-print-directory binaries >"$logs/binaries.log" 2>&1 &
binaries_pid=$!
if ! "$make" --no-print-directory venv; then kill "$binaries_pid" 2>/dev/null; exit 1; fi
images_pid=
if (($# == 0)) && [[ $(id -u) == 0 ]]; then  # the whole suite, as root (the own-cluster tests need both)
  echo ">> the images from our Dockerfiles (buildah) beside them (log: $logs/images.log)"
  nice -n 10 "$py" -m e2e.images build operator trainer-cpu >"$logs/images.log" 2>&1 &
  images_pid=$!
fi
if ! "$make" --no-print-directory lint; then kill "$binaries_pid" $images_pid 2>/dev/null; exit 1; fi
if ! wait "$binaries_pid"; then
  echo "make binaries failed; the end of $logs/binaries.log:"; tail -40 "$logs/binaries.log"
  kill $images_pid 2>/dev/null; exit 1
fi
tmp=$(mktemp -d /tmp/rtj-side-lane.XXXXXX)

# CPU cgroups (v1 `cpu` + `cpuacct`, or v2), weights on v2's scale (v1 cpu.shares = weight * 1024 / 100). Kind's
# engine puts its containers under /rtj-docker (hack/kind/docker.sh), outside both lanes: it gets a weight too,
# or the kind lane's nodes would starve while the cluster lane is busy. Where no cgroup can be made (no cpu
# controller, not root) the lanes run as before, niced only.
CLUSTER_WEIGHT=${RTJ_CLUSTER_LANE_WEIGHT:-300}
SIDE_WEIGHT=${RTJ_SIDE_LANE_WEIGHT:-100}
ENGINE_WEIGHT=${RTJ_KIND_ENGINE_WEIGHT:-200}
cg=/sys/fs/cgroup
if [[ -f $cg/cpu/cpu.shares && -w $cg/cpu/cgroup.procs ]]; then cg_mode=v1
elif [[ -w $cg/cgroup.procs ]] && grep -qw cpu "$cg/cgroup.subtree_control" 2>/dev/null; then cg_mode=v2
else cg_mode=none; fi
cluster_cg=rtj-lane-cluster-$$
side_cg=rtj-lane-side-$$
weigh() {  # weigh CGROUP WEIGHT: make it (in each hierarchy we use) and set its CPU weight
  case $cg_mode in
    v1) mkdir -p "$cg/cpu/$1" "$cg/cpuacct/$1" && echo $(($2 * 1024 / 100)) >"$cg/cpu/$1/cpu.shares" ;;
    v2) mkdir -p "$cg/$1" && echo "$2" >"$cg/$1/cpu.weight" ;;
  esac
}
join() {  # join CGROUP: this (sub)shell and all it starts
  case $cg_mode in
    v1) echo "$BASHPID" >"$cg/cpu/$1/cgroup.procs" && echo "$BASHPID" >"$cg/cpuacct/$1/cgroup.procs" ;;
    v2) echo "$BASHPID" >"$cg/$1/cgroup.procs" ;;
  esac
}
usage_file() {  # the file e2e/cputime.py reads a lane's CPU time from (each test's cost, printed at the end)
  case $cg_mode in
    v1) echo "$cg/cpuacct/$1/cpuacct.usage" ;;
    v2) echo "$cg/$1/cpu.stat" ;;
  esac
}
cpu_seconds() {  # the CPU time a lane's processes used (not those that moved to cgroups of their own)
  case $cg_mode in
    v1) echo $(($(cat "$cg/cpuacct/$1/cpuacct.usage") / 1000000000)) ;;
    v2) awk '$1 == "usage_usec" {print int($2 / 1000000)}' "$cg/$1/cpu.stat" ;;
  esac
}
cleanup_cgroups() {  # back to the root, then remove the lanes' cgroups and give the engine's its default weight
  local name dir pid
  [[ $cg_mode != none ]] || return 0
  for name in "$cluster_cg" "$side_cg"; do
    for dir in "$cg/cpu/$name" "$cg/cpuacct/$name" "$cg/$name"; do
      [[ -f $dir/cgroup.procs ]] || continue
      while read -r pid; do echo "$pid" >"$(dirname "$dir")/cgroup.procs" 2>/dev/null; done <"$dir/cgroup.procs"
      rmdir "$dir" 2>/dev/null || echo "note: could not remove $dir (a process is still in it)" >&2
    done
  done
  weigh rtj-docker 100 2>/dev/null || true
}
if [[ $cg_mode != none ]] && weigh "$cluster_cg" "$CLUSTER_WEIGHT" && weigh "$side_cg" "$SIDE_WEIGHT" \
    && weigh rtj-docker "$ENGINE_WEIGHT"; then
  echo ">> CPU weights ($cg_mode cgroups): the cluster lane $CLUSTER_WEIGHT, the side lane $SIDE_WEIGHT, kind's engine $ENGINE_WEIGHT"
else
  cleanup_cgroups 2>/dev/null; cg_mode=none
  echo ">> no CPU cgroups here: the side lane runs niced only"
fi

side() {
  local rc=0 prepare_pid=
  [[ $cg_mode == none ]] || { join "$side_cg"; export RTJ_LANE_CPU_FILE; RTJ_LANE_CPU_FILE=$(usage_file "$side_cg"); }
  if (($# == 0)) && [[ $(id -u) == 0 ]] && command -v dockerd >/dev/null; then  # as test_kind_lane needs
    nice -n 10 "$py" -m e2e.kindcluster prepare >"$logs/kind-prepare.log" 2>&1 &
    prepare_pid=$!
  fi
  nice -n 10 "$py" -m pytest -m "not cluster" -p no:cacheprovider -p e2e.cputime --basetemp="$tmp/unit" -o timeout=600 "$@" \
    >"$logs/unit.log" 2>&1 || rc=1
  # A failed prepare is not a failure here: the kind lane builds again and reports what went wrong.
  [[ -z $prepare_pid ]] || wait "$prepare_pid" || echo "kind prepare failed (the kind lane retries): $logs/kind-prepare.log" >>"$logs/unit.log"
  nice -n 10 "$py" -m pytest -m "cluster and own_cluster" -p no:cacheprovider -p e2e.cputime --basetemp="$tmp/own" "$@" \
    >"$logs/own-cluster.log" 2>&1 || rc=1
  return "$rc"
}
side "$@" &
side_pid=$!
trap 'kill "$side_pid" $images_pid 2>/dev/null; rm -rf "$tmp"; cleanup_cgroups' EXIT
( [[ $cg_mode == none ]] || { join "$cluster_cg"; export RTJ_LANE_CPU_FILE; RTJ_LANE_CPU_FILE=$(usage_file "$cluster_cg"); }
  exec "$py" -m pytest -m "cluster and not own_cluster" -p e2e.cputime "$@" )
cluster_rc=$?
wait "$side_pid"
side_rc=$?
# The images' builder: done long ago unless cold (then the own-cluster tests waited on its locks). A failure
# showed in the tests that use the images (they build again); its log says why.
[[ -z $images_pid ]] || wait "$images_pid" || echo "note: python -m e2e.images build failed; see $logs/images.log"
trap - EXIT
rm -rf "$tmp"
[[ $cg_mode == none ]] || cpu_used="the cluster lane $(cpu_seconds "$cluster_cg") CPU-s, the side lane $(cpu_seconds "$side_cg") CPU-s (real nodes' and kind's own cgroups not counted)"
cleanup_cgroups
echo "================ the side lane, part 1: no cluster (ran beside the cluster lane; .test-logs/unit.log) ================"
cat "$logs/unit.log"
echo "================ the side lane, part 2: own clusters (.test-logs/own-cluster.log) ================"
cat "$logs/own-cluster.log"
echo "cluster lane: exit ${cluster_rc}; side lane: exit ${side_rc}${cpu_used:+; $cpu_used}"
((cluster_rc == 0 && side_rc == 0))
