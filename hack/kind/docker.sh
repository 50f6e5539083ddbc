#!/usr/bin/env bash
# A Docker engine (Debian's docker.io) that lives in a network namespace of its own, for kind:
# its bridges, iptables rules and ip_forward are the namespace's, never the host's; its data root, exec
# root and socket sit under the cache; its mounts stay in a private mount namespace; its containers'
# cgroups sit under /rtj-docker. Its runtime is runc through runc-bounded (see there: privileged containers
# under a bounding set that lacks a capability). Clients on the host reach it through the socket (a path, not an address);
# anything that must reach a container's address (kubectl against kind's API server) runs in the netns.
#
#   hack/kind/docker.sh start    start the engine (idempotent); prints `export DOCKER_HOST=...`
#   hack/kind/docker.sh stop     stop it, its containers with it, and delete the netns
#   hack/kind/docker.sh env      print the exports (DOCKER_HOST, RTJ_DOCKER_NETNS)
#   hack/kind/docker.sh exec CMD run CMD inside the netns with DOCKER_HOST set
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${RTJ_CACHE:-$HOME/.cache/resilient-training}"
NETNS="${RTJ_DOCKER_NETNS:-rtj-docker}"
ROOT="${RTJ_DOCKER_ROOT:-$CACHE/docker}"
RUN="$ROOT/run-$NETNS"
SOCK="$RUN/docker.sock"
PIDFILE="$RUN/dockerd.pid"
export DOCKER_HOST="unix://$SOCK"

env_lines() { echo "export DOCKER_HOST=$DOCKER_HOST"; echo "export RTJ_DOCKER_NETNS=$NETNS"; }
running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

start() {
  command -v dockerd >/dev/null || { echo "no dockerd: apt-get install docker.io" >&2; exit 1; }
  if running && docker version >/dev/null 2>&1; then env_lines; return; fi
  mkdir -p "$ROOT/data" "$RUN"
  ip netns list | grep -qx "$NETNS\( .*\)\?" || ip netns add "$NETNS"
  ip -n "$NETNS" link set lo up
  # A private mount namespace (propagation slave: host mounts still show, ours never leak out), then the netns.
  setsid unshare --mount --propagation slave nsenter --net="/run/netns/$NETNS" \
    dockerd --data-root "$ROOT/data" --exec-root "$RUN/exec" --pidfile "$PIDFILE" -H "unix://$SOCK" \
      --cgroup-parent /rtj-docker --storage-driver overlay2 --log-level warn --userland-proxy=false \
      --add-runtime "rtj-runc=$HERE/runc-bounded" --default-runtime rtj-runc \
      >"$RUN/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    if docker version >/dev/null 2>&1; then env_lines; return; fi
    sleep 0.5
  done
  echo "dockerd did not answer in 60 s; its log:" >&2; tail -30 "$RUN/dockerd.log" >&2; stop; exit 1
}

stop() {
  if running; then
    local ids; ids="$(docker ps -aq 2>/dev/null || true)"
    [[ -z "$ids" ]] || docker rm -f -v $ids >/dev/null 2>&1 || true
    local pid; pid="$(cat "$PIDFILE")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE" "$SOCK"
  ! ip netns list | grep -qx "$NETNS\( .*\)\?" || ip netns delete "$NETNS"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) env_lines ;;
  exec) shift; exec nsenter --net="/run/netns/$NETNS" "$@" ;;
  *) echo "usage: $0 start|stop|env|exec CMD..." >&2; exit 2 ;;
esac
