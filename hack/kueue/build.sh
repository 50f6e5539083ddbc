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
CACHE="${RTJ_CACHE:-$HOME/.cache/resilient-training}"
KEY="kueue-${KUEUE_VERSION}"
BIN="${CACHE}/bin/${KEY}"

mode="${1:-build}"
if [[ "$mode" == "--print-dir" ]]; then echo "$BIN"; exit 0; fi

stamp_input() {
  go env GOVERSION
  echo "$KEY"
  cat "$HERE/build.sh"
}
STAMP="$(stamp_input | sha256sum | cut -d' ' -f1)"
if [[ "$mode" != "--force" && -f "$BIN/.stamp" && "$(cat "$BIN/.stamp")" == "$STAMP" ]]; then
  echo "cached: $BIN" >&2
  echo "$BIN"
  exit 0
fi

# One builder at a time: a second caller waits for the first and reuses its output.
mkdir -p "${CACHE}/bin"
exec 9>"${CACHE}/bin/.${KEY}.lock"
flock 9
if [[ "$mode" != "--force" && -f "$BIN/.stamp" && "$(cat "$BIN/.stamp")" == "$STAMP" ]]; then
  echo "cached: $BIN" >&2; echo "$BIN"; exit 0
fi

export GOFLAGS="${GOFLAGS:--trimpath}"  # -mod=readonly: the module's own go.mod/go.sum, unchanged
export CGO_ENABLED=0
export GOGC="${GOGC:-200}"
export GOTOOLCHAIN=local

echo ">> downloading sigs.k8s.io/kueue@${KUEUE_VERSION}" >&2
SRC="$(go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')"

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
echo "$STAMP" > "$BIN.tmp/.stamp"
rm -rf "$BIN"; mv "$BIN.tmp" "$BIN"
echo "$BIN"
