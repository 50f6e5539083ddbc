#!/usr/bin/env bash
# Build KWOK (sigs.k8s.io/kwok: fake nodes and pods driven by stages, no processes) from the Go
# module proxy at a pinned version, into the cache beside the control-plane binaries.
#
#   hack/kwok/build.sh              build if not cached; print the binary's path last
#                                   (stages.yaml, KWOK's stock stages, lies beside it)
#   hack/kwok/build.sh --print      print the binary's path only (no build)
#   hack/kwok/build.sh --force      rebuild even if cached
#
# `go install module@version` is enough here: kwok's go.mod has no replace directives, and its
# go.sum (checked against sum.golang.org) pins every dependency.
set -euo pipefail

KWOK_VERSION="${RTJ_KWOK_VERSION:-v0.8.0}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
rtj_begin "kwok-${KWOK_VERSION}" /kwok --print "${1:-build}" "$HERE/build.sh"

rm -rf "$BIN.tmp"; mkdir -p "$BIN.tmp"
echo ">> go install sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" >&2
GOBIN="$BIN.tmp" go install -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}" \
  "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
"$BIN.tmp/kwok" --version >&2 || true
# KWOK's own stages from the same pinned module: nodes become Ready and keep their Lease renewed
# (the heartbeat comes from --node-lease-duration-seconds), pods become Ready, deleted pods go away.
DIR="$(rtj_module_field "sigs.k8s.io/kwok@${KWOK_VERSION}" Dir)"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
         pod/fast/pod-ready.yaml pod/fast/pod-delete.yaml; do
  echo "---"; cat "$DIR/kustomize/stage/$f"
done > "$BIN.tmp/stages.yaml"
rtj_publish
