#!/bin/sh
# A real node's "machine", built in a mount namespace of its own (unshare --mount --propagation private)
# whose root becomes the node's (pivot_root), then exec'd into containerd; the kubelet joins it with nsenter.
#
#   node_init.sh NODE_DIR HOSTPATH_ROOT SHARED_PATH... -- COMMAND...
#
# Its root is a tmpfs holding a bind of each of the host's top-level directories, except:
#   /var/lib, /var/log   the node's own directories (its disk: kept across a reboot)
#   /run                 a fresh tmpfs (shim sockets, runc state, netns pins: gone with the node)
#   SHARED_PATH          HOSTPATH_ROOT/SHARED_PATH: hostPath volumes every node shares (an RWX volume)
#   any other new top-level path a hostPath names lands in the node's root tmpfs, never on the host's /
#   /proc/sys/...        the global sysctls the kubelet would set, as files with the values it wants
# Nothing of this reaches the host's mount table: when the node's last process dies, it all goes away.
set -eu
N="$1"; H="$2"; shift 2
shared=""
while [ "$1" != "--" ]; do shared="$shared $1"; shift; done
shift
mount -t tmpfs -o mode=0755,size=16m rtj-node-host-run /run   # this namespace's view only
R=/run/root
mkdir "$R"
mount -t tmpfs -o mode=0755,size=256m rtj-node-root "$R"
for e in /*; do
  name="${e#/}"
  case "$name" in run|var) continue ;; esac
  if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$R/$name"
  elif [ -d "$e" ]; then mkdir "$R/$name"; mount --rbind "$e" "$R/$name"
  fi
done
mkdir -p "$R/var" "$R/run/netns" "$R/run/containerd"
mount -t tmpfs -o mode=0755,size=64m rtj-node-run "$R/run"
mkdir -p "$R/run/netns" "$R/run/containerd"
mount --rbind /var "$R/var"
mount --bind "$N/machine/var-lib" "$R/var/lib"
mount --bind "$N/machine/var-log" "$R/var/log"
for p in $shared; do
  mkdir -p "$H$p" "$R$p"
  mount --bind "$H$p" "$R$p"
done
for f in $(cd "$N/machine/sysctl" && find . -type f); do
  mount --bind "$N/machine/sysctl/$f" "$R/proc/sys/$f"
done
# pivot_root, not chroot: runc's own pivot_root for a container started from inside a chroot would
# leave the container on the host's real root (it happened: a pod read the host's /etc/resolv.conf).
mkdir "$R/.host"
cd "$R"
pivot_root . .host
umount -l /.host
rmdir /.host
cd "$N"
exec "$@"
