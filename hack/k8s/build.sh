#!/usr/bin/env bash
# Build the control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl as one multi-call binary, plus helm) from the Go module
# proxy, at pinned versions, into a cache directory outside the repo.
#
#   hack/k8s/build.sh              build if not cached; print the bin dir last
#   hack/k8s/build.sh --print-dir  print the bin dir only (no build)
#   hack/k8s/build.sh --force      rebuild even if cached
#
# Why a wrapper module: `go install k8s.io/kubernetes/...` refuses modules with
# replace directives. The wrapper requires k8s.io/kubernetes and replaces each
# k8s.io/<staging> module with its published v0.Y.Z tag; those replace lines are
# generated from the kubernetes module's own go.mod, never typed by hand.
set -euo pipefail

K8S_VERSION="${RTJ_K8S_VERSION:-v1.34.4}"
# etcd: the version Kubernetes itself pins in its go.mod (go.etcd.io/etcd/server/v3),
# so etcd links into the same binary with no dependency skew.
ETCD_VERSION="${RTJ_ETCD_VERSION:-v3.6.4}"
# helm 3.19.x is built against k8s.io v0.34 client libraries.
HELM_VERSION="${RTJ_HELM_VERSION:-v3.19.5}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
rtj_begin "k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}" "" --print-dir "${1:-build}" \
  "$HERE/build.sh" "$HERE/gen_gomod.py" "$HERE/kube/main.go"

rm -rf "$WORK"; mkdir -p "$WORK"
cp "$HERE/kube/main.go" "$HERE/kube/tools.go" "$WORK/"
cd "$WORK"
echo ">> resolving k8s.io/kubernetes@${K8S_VERSION}" >&2
# go.sum.lock is refreshed when missing (see the note at the end)
rtj_k8s_wrapper_module kube "$K8S_VERSION" "$ETCD_VERSION" "$HELM_VERSION" "$HERE/go.sum.lock"
# Kubernetes' own pins must win: fail loudly if MVS (helm, etcd) raised a k8s.io
# staging module or etcd away from what kubernetes declares.
go list -m k8s.io/api k8s.io/client-go go.etcd.io/etcd/server/v3 go.etcd.io/etcd/client/v3 >&2

rtj_k8s_ldflags "$K8S_VERSION"
maj="$K8S_MAJOR"; min="$K8S_MINOR"
HLD="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  HLD+=" -X $p.k8sVersionMajor=$maj -X $p.k8sVersionMinor=$min"
done

mkdir -p "$BIN.tmp"
echo ">> go build kube (multi-call)" >&2
go build -ldflags "$KLD" -o "$BIN.tmp/kube" .
echo ">> go build helm" >&2
go build -ldflags "$HLD" -o "$BIN.tmp/helm" helm.sh/helm/v3/cmd/helm
for n in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sf kube "$BIN.tmp/$n"; done
cp go.mod go.sum "$BIN.tmp/"
"$BIN.tmp/kubectl" version --client >&2
[[ -f "$HERE/go.sum.lock" ]] || echo "note: copy $BIN/go.sum to $HERE/go.sum.lock to pin hashes" >&2
rtj_publish
