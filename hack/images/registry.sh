#!/usr/bin/env bash
# Build the CNCF Distribution registry (github.com/distribution/distribution/v3, Apache-2.0: the registry that
# Docker Hub and most private registries run) from the Go module proxy into the binary cache. The real nodes
# pull the test images from one such registry on an address inside the cluster's network namespace.
#
#   hack/images/registry.sh            build if not cached; print the binary's path last
#   hack/images/registry.sh --print    print the binary's path only (no build)
set -euo pipefail
VERSION="${RTJ_REGISTRY_VERSION:-v3.1.2}"
CACHE="${RTJ_CACHE:-$HOME/.cache/resilient-training}"
KEY="distribution-registry-${VERSION}"
BIN="${CACHE}/bin/${KEY}"
if [[ "${1:-}" == "--print" ]]; then echo "$BIN/registry"; exit 0; fi
STAMP="$( (go env GOVERSION; echo "$KEY"; cat "${BASH_SOURCE[0]}") | sha256sum | cut -d' ' -f1)"
fresh() { [[ -x "$BIN/registry" && "$(cat "$BIN/.stamp" 2>/dev/null)" == "$STAMP" ]]; }
if fresh; then echo "$BIN/registry"; exit 0; fi
mkdir -p "${CACHE}/bin"
exec 9>"${CACHE}/bin/.${KEY}.lock"
flock 9  # one builder at a time; the loser reuses the winner's build
if fresh; then echo "$BIN/registry"; exit 0; fi
echo ">> go install github.com/distribution/distribution/v3/cmd/registry@${VERSION}" >&2
rm -rf "$BIN.tmp"; mkdir -p "$BIN.tmp"
GOBIN="$BIN.tmp" CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--trimpath}" \
  go install -ldflags "-s -w" "github.com/distribution/distribution/v3/cmd/registry@${VERSION}" >&2
echo "$STAMP" > "$BIN.tmp/.stamp"
rm -rf "$BIN"; mv "$BIN.tmp" "$BIN"
echo "$BIN/registry"
