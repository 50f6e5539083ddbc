#!/usr/bin/env bash
# Build the tiny images real nodes need, with buildah, FROM scratch, into docker
# archives every node's containerd imports (no registry, nothing pulled):
#   pause.tar    localhost/rtj/pause:<hash>    the pod sandbox (pause.c, built by build.sh)
#   busybox.tar  localhost/rtj/busybox:<hash>  Debian's busybox-static, for the substrate tests
# Cached by the hash of their inputs; prints the image dir last. Needs root.
#
#   hack/realnodes/images.sh              build if not cached
#   hack/realnodes/images.sh --print-dir  print the image dir only
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
BIN="$(bash "$HERE/build.sh" --print-dir)"
BUSYBOX="${RTJ_BUSYBOX:-/bin/busybox}"

hash_of() { sha256sum "$@" | sha256sum | cut -c1-12; }
mode="${1:-build}"
if [[ "$mode" != "--print-dir" ]]; then
  bash "$HERE/build.sh" >/dev/null
  [[ -x "$BUSYBOX" ]] || { echo "missing $BUSYBOX: apt-get install busybox-static" >&2; exit 1; }
  if ldd "$BUSYBOX" >/dev/null 2>&1; then
    echo "$BUSYBOX is dynamically linked (Debian's busybox); a FROM scratch image needs busybox-static" >&2; exit 1
  fi
fi
KEY="$(hash_of "$HERE/images.sh" "$BIN/pause" "$BUSYBOX" 2>/dev/null || echo none)"
OUT="${CACHE}/images/realnodes-${KEY}"
if [[ "$mode" == "--print-dir" ]]; then echo "$OUT"; exit 0; fi
if [[ -f "$OUT/.stamp" ]]; then rtj_done; fi
# One builder at a time (two test lanes may ask at once); the loser reuses the winner's build.
rtj_lock "${CACHE}/images/.realnodes-${KEY}.lock"
if [[ -f "$OUT/.stamp" ]]; then rtj_done; fi

# A storage of our own (vfs: no overlay mounts left on the host), never the machine's shared one.
STORE="${CACHE}/build/realnodes-images"
buildah() { command buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs "$@"; }
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp"
t0=$SECONDS
# image NAME TAR CONFIG... : a scratch image filled by the function `fill_<NAME>` through buildah mount.
image() {
  local name="$1" ref="localhost/rtj/$1:${KEY}" ctr mnt
  ctr="$(buildah from --pull=never scratch)"
  mnt="$(buildah mount "$ctr")"
  "fill_$name" "$mnt"
  buildah umount "$ctr" >/dev/null
  shift
  buildah config "$@" "$ctr"
  buildah commit --quiet --rm "$ctr" "$ref" >/dev/null
  rm -f "$OUT.tmp/$name.tar"
  buildah push --quiet "$ref" "docker-archive:$OUT.tmp/$name.tar:$ref"
  buildah rmi "$ref" >/dev/null
  echo "$ref" > "$OUT.tmp/$name.ref"
}
fill_pause() { install -m 0755 "$BIN/pause" "$1/pause"; }
fill_busybox() {
  mkdir -p "$1/bin" "$1/tmp" "$1/etc"
  install -m 0755 "$BUSYBOX" "$1/bin/busybox"
  for a in $("$BUSYBOX" --list); do [[ "$a" == busybox ]] || ln -sf busybox "$1/bin/$a"; done
  echo "root:x:0:0:root:/root:/bin/sh" > "$1/etc/passwd"
  chmod 1777 "$1/tmp"
}
image pause --entrypoint '["/pause"]' --user 65535:65535
image busybox --entrypoint '["/bin/sh"]' --env PATH=/bin
echo "$KEY" > "$OUT.tmp/.stamp"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo ">> images in $((SECONDS - t0)) s: $OUT" >&2
echo "$OUT"
