#!/usr/bin/env bash
# Build kind's node image for Kubernetes v1.34.4 from our own binaries, with no registry: what kind's
# images/base Dockerfile and `kind build node-image` do, reproduced step by step (neither can run here: the
# base Dockerfile clones and builds from GitHub, and build node-image pulls etcd, CoreDNS, pause, kindnetd
# and local-path-provisioner from registries).
#
#   1. base: Debian bookworm (debootstrap from the host's mirror) with the base Dockerfile's packages, but
#      Debian's containerd/runc/CNI plugins instead of Go-built ones; kind's own images/base/files from the
#      kind module source; its systemd clean-up and units; cri-base.json as the Dockerfile makes it.
#   2. node, as build node-image does: kubeadm/kubelet/kubectl in /usr/bin, /kind/version, the manifests,
#      and the images `kubeadm config images list` names (+ the sandbox image) imported into the node's
#      containerd in a build container, then `docker commit` with kind's entrypoint.
#      The control-plane images hold our binaries (hack/k8s kube, hack/realnodes knode/pause, hack/kind coredns).
#
#   hack/kind/node-image.sh              build if not in the engine (DOCKER_HOST: hack/kind/docker.sh); print the tag
#   hack/kind/node-image.sh --print-tag  print the tag only
# The tag names the inputs' hash: localhost/rtj/kind-node:v1.34.4-<hash>.
set -euo pipefail

K8S_VERSION="${RTJ_K8S_VERSION:-v1.34.4}"
KIND_VERSION="${RTJ_KIND_VERSION:-v0.30.0}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
PACKAGES=systemd,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash
PACKAGES+=,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins
mode="${1:-build}"

if [[ "$mode" != "--print-tag" ]]; then
  bash "$HERE/build.sh" >/dev/null; bash "$HERE/../k8s/build.sh" >/dev/null; bash "$HERE/../realnodes/build.sh" >/dev/null
fi
KINDBIN="$(bash "$HERE/build.sh" --print-dir)"
K8SBIN="$(bash "$HERE/../k8s/build.sh" --print-dir)"
RNBIN="$(bash "$HERE/../realnodes/build.sh" --print-dir)"
KIND_SRC="$(cd /tmp && GOFLAGS=-mod=mod rtj_module_field "sigs.k8s.io/kind@${KIND_VERSION}" Dir)"
BASE_FILES="$KIND_SRC/images/base/files"
ROOTFS_KEY="$( (echo "$PACKAGES"; sed -n '/^# --- rootfs/,/^# --- end rootfs/p' "$0") | sha256sum | cut -c1-16)"
KEY="$( (echo "$K8S_VERSION $KIND_VERSION $ROOTFS_KEY"; cat "$0" "$HERE"/node/*; cd "$BASE_FILES" && find . -type f | sort \
  | xargs sha256sum; cat "$K8SBIN/.stamp" "$RNBIN/.stamp" "$KINDBIN/.stamp") | sha256sum | cut -c1-16)"
TAG="localhost/rtj/kind-node:${K8S_VERSION}-${KEY}"
if [[ "$mode" == "--print-tag" ]]; then echo "$TAG"; exit 0; fi
docker version >/dev/null 2>&1 || { echo "no Docker engine at ${DOCKER_HOST:-the default socket}" >&2; exit 1; }
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "cached: $TAG" >&2; echo "$TAG"; exit 0; fi
rtj_lock "${CACHE}/images/.kind-node.lock"
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "cached: $TAG" >&2; echo "$TAG"; exit 0; fi
t0=$SECONDS
WORK="${CACHE}/build/kind-node"
rm -rf "$WORK"; mkdir -p "$WORK"
cleanup() { [[ -z "${ctr:-}" ]] || docker rm -f -v "$ctr" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT

# --- rootfs: debootstrap, cached as a tarball keyed by the package list and this section -----------------
ROOTFS_TAR="${CACHE}/images/kind-rootfs-${ROOTFS_KEY}.tar"
if [[ ! -f "$ROOTFS_TAR" ]]; then
  mirror=$(sed -n 's/^URIs:[[:space:]]*\(\S*\/debian\)\/*$/\1/p; s/^deb[[:space:]]\+\(http\S*\/debian\)\/*[[:space:]].*/\1/p' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n1 || true)
  echo ">> debootstrap bookworm (${PACKAGES}) from ${mirror:-deb.debian.org}" >&2
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$WORK/rootfs" "${mirror:-http://deb.debian.org/debian}" >&2
  rm -rf "$WORK"/rootfs/var/lib/apt/lists/* "$WORK"/rootfs/var/cache/apt/*.bin "$WORK"/rootfs/var/cache/apt/archives/*.deb \
    "$WORK"/rootfs/usr/share/doc/* "$WORK"/rootfs/usr/share/man/* "$WORK"/rootfs/usr/share/locale/* "$WORK"/rootfs/var/log/*
  tar -C "$WORK/rootfs" -cf "$ROOTFS_TAR.tmp" . && mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  rm -rf "$WORK/rootfs"
fi
# --- end rootfs
echo ">> rootfs ready after $((SECONDS - t0)) s" >&2

# --- 1. base: kind's images/base, on the rootfs -------------------------------------------------------------
R="$WORK/rootfs"; mkdir -p "$R"; tar -C "$R" -xf "$ROOTFS_TAR"
install -m 0755 "$BASE_FILES"/usr/local/bin/* "$R/usr/local/bin/"
mkdir -p "$R/kind" "$R/LICENSES"; cp -r "$BASE_FILES/kind/." "$R/kind/"; chmod 755 "$R/kind/bin" "$R"/kind/bin/*
for d in etc etc/containerd etc/default etc/sysctl.d etc/systemd/system etc/systemd/system/kubelet.service.d; do
  mkdir -p "$R/$d"; find "$BASE_FILES/$d" -maxdepth 1 -type f -exec install -m 0644 {} "$R/$d/" \;
done
# No fuse-overlayfs here (rootless only): drop its proxy plugin and unit. The sandbox image kubeadm lists.
# restrict_oom_score_adj, as kind sets it for rootless: lowering a process's oom_score_adj (the pod sandbox
# asks -998) needs CAP_SYS_RESOURCE, which a bounding set without it (this sandbox) cannot give; runc's
# init then dies ("can't get final child's PID from pipe"). Containerd clamps to its own score instead
# (harmless where the capability is there: pods get no lower a score than containerd's).
rm -f "$R/etc/systemd/system/containerd-fuse-overlayfs.service"
python3 - "$R/etc/containerd/config.toml" <<'PY'
import re, sys
p = sys.argv[1]; t = open(p).read()
t = re.sub(r'\[proxy_plugins\]\n(#.*\n)*\[proxy_plugins\."fuse-overlayfs"\]\n(  .*\n)+', '', t)
t = t.replace('sandbox_image = "registry.k8s.io/pause:3.10"', 'sandbox_image = "registry.k8s.io/pause:3.10.1"')
t = t.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
open(p, "w").write(t)
PY
find "$R/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> "$R/etc/systemd/journald.conf"
ln -sf /lib/systemd/systemd "$R/sbin/init"
# Debian's containerd is in /usr/bin, kind's units want /usr/local/bin; Debian's CNI plugins in /usr/lib/cni.
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$R/usr/local/bin/$b"; done
mkdir -p "$R/opt/cni/bin"; for p in host-local loopback ptp portmap bridge; do ln -sf "/usr/lib/cni/$p" "$R/opt/cni/bin/$p"; done
install -m 0755 "$KINDBIN/crictl" "$R/usr/local/bin/crictl"
ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > "$R/etc/containerd/cri-base.json"
install -m 0755 "$HERE/node/rtj-cni.sh" "$R/kind/bin/rtj-cni.sh"
install -m 0644 "$HERE/node/rtj-cni.service" "$R/etc/systemd/system/rtj-cni.service"
for u in kubelet containerd undo-mount-hacks rtj-cni; do systemctl --root="$R" enable "$u.service" >/dev/null 2>&1; done
systemctl --root="$R" mask systemd-binfmt.service >/dev/null 2>&1
mkdir -p "$R/etc/kubernetes/manifests"
# --- 2. node: what build node-image adds ------------------------------------------------------------------
install -m 0755 "$KINDBIN/kubeadm" "$R/usr/bin/kubeadm"
install -m 0755 "$RNBIN/knode" "$R/usr/bin/kubelet"      # knode answers as kubelet by its name
install -m 0755 "$K8SBIN/kube" "$R/usr/bin/kubectl"      # kube answers as kubectl by its name
echo -n "$K8S_VERSION" > "$R/kind/version"
mkdir -p "$R/kind/manifests" "$R/kind/images"
install -m 0644 "$HERE/node/default-cni.yaml" "$HERE/node/default-storage.yaml" "$R/kind/manifests/"

# The images, FROM scratch with docker build (offline): one control-plane image (kube answers as each
# component by its name), kube-proxy (knode + iptables/conntrack and their libraries), CoreDNS, pause.
img() { # img NAME DIR TAG...: docker build DIR (a Dockerfile in it), save it with every TAG into NAME.tar
  local name="$1" dir="$2"; shift 2
  docker build -q -t "rtj-kind-build/$name" "$dir" >/dev/null 2>&1
  for t in "$@"; do docker tag "rtj-kind-build/$name" "$t"; done
  docker save -o "$R/kind/images/$name.tar" "$@"
  docker rmi "$@" "rtj-kind-build/$name" >/dev/null
}
C="$WORK/ctx"
mkdir -p "$C/kube/usr/local/bin" "$C/proxy/usr/local/bin" "$C/coredns" "$C/pause"
cp "$K8SBIN/kube" "$C/kube/usr/local/bin/kube"
for n in etcd kube-apiserver kube-controller-manager kube-scheduler; do ln -s kube "$C/kube/usr/local/bin/$n"; done
printf 'FROM scratch\nCOPY usr /usr\nENV PATH=/usr/local/bin:/usr/bin:/bin\n' > "$C/kube/Dockerfile"
cp "$RNBIN/knode" "$C/proxy/usr/local/bin/kube-proxy"
for b in /usr/sbin/xtables-nft-multi /usr/sbin/conntrack; do
  mkdir -p "$C/proxy$(dirname "$b")"; cp "$b" "$C/proxy$b"
  for lib in $(ldd "$b" | grep -o '/[^ ]*'); do mkdir -p "$C/proxy$(dirname "$lib")"; cp -L "$lib" "$C/proxy$lib"; done
done
mkdir -p "$C/proxy/usr/lib/x86_64-linux-gnu"; cp -r /usr/lib/x86_64-linux-gnu/xtables "$C/proxy/usr/lib/x86_64-linux-gnu/"
# ...and what the match/target plugins link that the binaries do not (libxt_statistic needs libm: without it
# iptables-restore fails as soon as a Service has two endpoints, kube-dns first, and no Service works)
for so in /usr/lib/x86_64-linux-gnu/xtables/*.so; do
  for lib in $(ldd "$so" | grep -o '/[^ ]*'); do mkdir -p "$C/proxy$(dirname "$lib")"; cp -L "$lib" "$C/proxy$lib"; done
done
for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -s xtables-nft-multi "$C/proxy/usr/sbin/$n"
done
mkdir -p "$C/proxy/run" "$C/proxy/tmp" "$C/proxy/var/lib/kube-proxy"
printf 'FROM scratch\nCOPY . /\nENV PATH=/usr/local/bin:/usr/sbin:/usr/bin\n' > "$C/proxy/Dockerfile"
cp "$KINDBIN/coredns" "$C/coredns/coredns"
# Upstream's CoreDNS image runs as 65532 with a file capability to bind :53; docker build's COPY drops
# xattrs, so ours runs as root, with only what kubeadm's Deployment grants (NET_BIND_SERVICE, all else dropped).
printf 'FROM scratch\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n' > "$C/coredns/Dockerfile"
cp "$RNBIN/pause" "$C/pause/pause"
printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' > "$C/pause/Dockerfile"
required="$("$KINDBIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")"
pick() { grep "/$1:" <<<"$required"; }
img kube "$C/kube" "$(pick kube-apiserver)" "$(pick kube-controller-manager)" "$(pick kube-scheduler)" "$(pick etcd)"
img kube-proxy "$C/proxy" "$(pick kube-proxy)"
img coredns "$C/coredns" "$(pick coredns)"
img pause "$C/pause" "$(pick pause)" registry.k8s.io/pause:3.10
echo ">> images saved after $((SECONDS - t0)) s" >&2

# The base image, then build node-image's import: containerd in a build container, ctr import, commit.
tar -C "$R" -c . | docker import --change 'ENV container=docker' --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' - "rtj-kind-build/base:$KEY" >/dev/null
rm -rf "$R"
ctr="$(docker run -d --privileged --entrypoint=sleep "rtj-kind-build/base:$KEY" infinity)"
docker exec "$ctr" bash -c 'containerd >/var/log/containerd-build.log 2>&1 &'
for _ in $(seq 1 60); do docker exec "$ctr" ctr version >/dev/null 2>&1 && break; sleep 0.5; done
for t in kube kube-proxy coredns pause; do
  docker exec "$ctr" ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms \
    --no-unpack --digests "/kind/images/$t.tar" >&2
done
docker exec "$ctr" bash -c 'pkill containerd; for i in $(seq 1 50); do pgrep containerd >/dev/null || break; sleep 0.2; done
  rm -rf /kind/images/* /var/log/containerd-build.log'
docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
  --change 'ENV HTTP_PROXY="" HTTPS_PROXY="" NO_PROXY=""' "$ctr" "rtj-kind-build/node:$KEY" >/dev/null
docker rm -f -v "$ctr" >/dev/null; ctr=""
# The base Dockerfile's STOPSIGNAL (systemd's halt signal), which import and commit cannot set.
printf 'FROM rtj-kind-build/node:%s\nSTOPSIGNAL SIGRTMIN+3\n' "$KEY" | docker build -q -t "$TAG" - >/dev/null
docker rmi "rtj-kind-build/base:$KEY" "rtj-kind-build/node:$KEY" >/dev/null
# Older node images (other inputs) go: each is ~1 GB in the engine's data root.
for old in $(docker images --format '{{.Repository}}:{{.Tag}}' localhost/rtj/kind-node); do
  [[ "$old" == "$TAG" ]] || docker rmi "$old" >/dev/null 2>&1 || true
done
echo ">> node image $TAG in $((SECONDS - t0)) s ($(docker image inspect -f '{{.Size}}' "$TAG" | numfmt --to=iec))" >&2
echo "$TAG"
