#!/usr/bin/env bash
# Build Kueue's controller manager from the Go module proxy at a pinned version,
# into the same cache as the control plane (hack/k8s/build.sh), and copy the
# pinned manifests the harness installs (CRDs, webhook configurations) next to it.
#
#   hack/kueue/build.sh              build if not cached; print the bin dir last
#   hack/kueue/build.sh --print-dir  print the bin dir only (no build)
#   hack/kueue/build.sh --force      rebuild even if cached
#
# sigs.k8s.io/kueue has no replace directives, so `go build` of the module at its
# tag works without a wrapper module; the module's go.sum (verified against
# sum.golang.org by the go command) pins every dependency.
set -euo pipefail

KUEUE_VERSION="${RTJ_KUEUE_VERSION:-v0.17.0}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
# (GOFLAGS -trimpath, so -mod=readonly: the module's own go.mod/go.sum, unchanged)
rtj_begin "kueue-${KUEUE_VERSION}" "" --print-dir "${1:-build}" "$HERE/build.sh"

echo ">> downloading sigs.k8s.io/kueue@${KUEUE_VERSION}" >&2
SRC="$(rtj_module_field "sigs.k8s.io/kueue@${KUEUE_VERSION}" Dir)"

rm -rf "$BIN.tmp"; mkdir -p "$BIN.tmp/config"
V=sigs.k8s.io/kueue/pkg/version
LD="-s -w -X '$V.GitVersion=${KUEUE_VERSION}' -X '$V.GitCommit=module-proxy' -X '$V.BuildDate=1970-01-01T00:00:00Z'"
echo ">> go build kueue manager (cold: several minutes)" >&2
start=$(date +%s)
# The module cache is read-only; build from it with its own go.mod/go.sum.
( cd "$SRC" && go build -ldflags "$LD" -o "$BIN.tmp/kueue" ./cmd/kueue )
echo ">> built in $(( $(date +%s) - start ))s" >&2
# The pinned manifests: CRDs and the webhook configurations kustomize would render.
cp -r "$SRC/config/components/crd/bases" "$BIN.tmp/config/crd"
cp "$SRC/config/components/webhook/manifests.yaml" "$BIN.tmp/config/webhooks.yaml"
chmod -R u+w "$BIN.tmp"
"$BIN.tmp/kueue" --help >/dev/null 2>&1 || true
rtj_publish
