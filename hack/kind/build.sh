#!/usr/bin/env bash
# Build what a kind cluster needs beyond our other binaries, from the Go module proxy, at pinned versions:
#   kind     sigs.k8s.io/kind (the CLI)
#   kubeadm  from the Kubernetes module, in a wrapper module like hack/realnodes' knode
#   crictl   sigs.k8s.io/cri-tools (kind's `load` asks the node's containerd through it)
#   coredns  CoreDNS with the plugins kubeadm's Corefile names (hack/kind/coredns/main.go)
#
#   hack/kind/build.sh              build if not cached; print the bin dir last
#   hack/kind/build.sh --print-dir  print the bin dir only (no build)
#   hack/kind/build.sh --force      rebuild even if cached
set -euo pipefail

K8S_VERSION="${RTJ_K8S_VERSION:-v1.34.4}"
KIND_VERSION="${RTJ_KIND_VERSION:-v0.30.0}"
CRICTL_VERSION="${RTJ_CRICTL_VERSION:-v1.34.0}"
COREDNS_VERSION="${RTJ_COREDNS_VERSION:-v1.14.7}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
rtj_begin "kind-${KIND_VERSION}-k8s-${K8S_VERSION}-crictl-${CRICTL_VERSION}-coredns-${COREDNS_VERSION}" "" --print-dir \
  "${1:-build}" "$HERE/build.sh" "$HERE/../k8s/gen_gomod.py" "$HERE/kubeadm/main.go" "$HERE/kubeadm.go.sum.lock" \
  "$HERE/coredns/main.go" "$HERE/coredns.go.sum.lock"

rm -rf "$WORK" "$BIN.tmp"; mkdir -p "$WORK/kubeadm" "$WORK/coredns" "$BIN.tmp"
t0=$SECONDS
echo ">> kind ${KIND_VERSION}, crictl ${CRICTL_VERSION}: go install" >&2
GOBIN="$BIN.tmp" go install -ldflags "-s -w" "sigs.k8s.io/kind@${KIND_VERSION}"
GOBIN="$BIN.tmp" go install -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRICTL_VERSION}" \
  "sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}"

cp "$HERE/kubeadm/main.go" "$WORK/kubeadm/"
cd "$WORK/kubeadm"
# A committed go.sum pins every module hash (first made by tidy, checked by sum.golang.org).
rtj_k8s_wrapper_module kubeadm "$K8S_VERSION" v3.6.4 v3.19.5 "$HERE/kubeadm.go.sum.lock"
rtj_k8s_ldflags "$K8S_VERSION"
echo ">> kubeadm: go build" >&2
go build -ldflags "$KLD" -o "$BIN.tmp/kubeadm" .
cp go.sum "$BIN.tmp/kubeadm.go.sum"

cp "$HERE/coredns/main.go" "$WORK/coredns/"
cd "$WORK/coredns"
go mod init rtj.local/coredns >/dev/null 2>&1
go mod edit "-require=github.com/coredns/coredns@${COREDNS_VERSION}"
if [[ -f "$HERE/coredns.go.sum.lock" ]]; then cp "$HERE/coredns.go.sum.lock" go.sum; fi
echo ">> coredns: go mod tidy, go build" >&2
go mod tidy
go build -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}" -o "$BIN.tmp/coredns" .
cp go.sum "$BIN.tmp/coredns.go.sum"
"$BIN.tmp/coredns" -plugins | tr '\n' ' ' >&2; echo >&2
"$BIN.tmp/kind" version >&2; "$BIN.tmp/kubeadm" version -o short >&2
echo ">> kind binaries in $((SECONDS - t0)) s: $BIN" >&2
rtj_publish
