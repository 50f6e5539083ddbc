#!/usr/bin/env bash
# Build the real-node binaries from the Go module proxy, at pinned versions,
# into their own cache directory (the control-plane cache of hack/k8s stays valid):
#   knode   kubelet + kube-proxy as one multi-call binary (symlinks kubelet, kube-proxy)
#   coredns CoreDNS with the plugins cluster DNS needs (hack/realnodes/coredns/main.go)
#   pause   a static sandbox process (hack/realnodes/pause.c), see images.sh
#
#   hack/realnodes/build.sh              build if not cached; print the bin dir last
#   hack/realnodes/build.sh --print-dir  print the bin dir only (no build)
#   hack/realnodes/build.sh --force      rebuild even if cached
#
# The wrapper module for knode is generated exactly as hack/k8s/build.sh does
# (gen_gomod.py), so kubelet and kube-proxy share the control plane's module
# graph and most of Go's build cache with it.
set -euo pipefail

K8S_VERSION="${RTJ_K8S_VERSION:-v1.34.4}"
COREDNS_VERSION="${RTJ_COREDNS_VERSION:-v1.14.7}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_HACK="$HERE/../k8s"
source "$HERE/../lib.sh"
STAMP_EXTRA="$(gcc --version | head -1)"
rtj_begin "realnodes-k8s-${K8S_VERSION}-coredns-${COREDNS_VERSION}" "" --print-dir "${1:-build}" \
  "$HERE/build.sh" "$K8S_HACK/gen_gomod.py" "$HERE/knode/main.go" "$HERE/coredns/main.go" "$HERE/pause.c"

rm -rf "$WORK" "$BIN.tmp"; mkdir -p "$WORK/knode" "$WORK/coredns" "$BIN.tmp"
t0=$SECONDS

# --- knode: kubelet + kube-proxy -------------------------------------------------
cp "$HERE/knode/main.go" "$WORK/knode/"
cd "$WORK/knode"
# gen_gomod.py also requires etcd and helm (the control plane's extras); tidy drops them.
rtj_k8s_wrapper_module knode "$K8S_VERSION" v3.6.4 v3.19.5 "$HERE/knode.go.sum.lock"
go list -m k8s.io/api k8s.io/client-go >&2
rtj_k8s_ldflags "$K8S_VERSION"
echo ">> knode: go build (kubelet + kube-proxy)" >&2
go build -ldflags "$KLD" -o "$BIN.tmp/knode" .
for n in kubelet kube-proxy; do ln -sf knode "$BIN.tmp/$n"; done
cp go.sum "$BIN.tmp/knode.go.sum"
echo ">> knode built in $((SECONDS - t0)) s" >&2

# --- coredns ---------------------------------------------------------------------
t1=$SECONDS
cp "$HERE/coredns/main.go" "$WORK/coredns/"
cd "$WORK/coredns"
go mod init rtj.local/coredns >/dev/null 2>&1
go mod edit "-require=github.com/coredns/coredns@${COREDNS_VERSION}"
if [[ -f "$HERE/coredns.go.sum.lock" ]]; then cp "$HERE/coredns.go.sum.lock" go.sum; fi
echo ">> coredns: go mod tidy" >&2
go mod tidy
echo ">> coredns: go build" >&2
go build -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}" -o "$BIN.tmp/coredns" .
cp go.sum "$BIN.tmp/coredns.go.sum"
echo ">> coredns built in $((SECONDS - t1)) s" >&2

# --- pause -----------------------------------------------------------------------
gcc -static -Os -s -o "$BIN.tmp/pause" "$HERE/pause.c"

"$BIN.tmp/kubelet" --version >&2
"$BIN.tmp/coredns" -plugins | tr '\n' ' ' >&2; echo >&2
for f in knode coredns; do
  [[ -f "$HERE/$f.go.sum.lock" ]] || echo "note: copy $BIN/$f.go.sum to $HERE/$f.go.sum.lock to pin hashes" >&2
done
echo ">> real-node binaries in $((SECONDS - t0)) s: $BIN" >&2
rtj_publish
