#!/usr/bin/env bash
# Build SeaweedFS's `weed` (github.com/seaweedfs/seaweedfs, Apache-2.0: master, volume, filer and an
# S3 gateway in one binary) from the Go module proxy at a pinned pseudo-version, into the cache beside
# the control-plane binaries. The tests run it as the real S3 server that checkpoints go to.
#
#   hack/seaweedfs/build.sh            build if not cached; print the binary's path last
#   hack/seaweedfs/build.sh --print    print the binary's path only (no build)
#   hack/seaweedfs/build.sh --force    rebuild even if cached
#
# Why a wrapper module: seaweedfs' go.mod has a replace directive (go-bip39), so `go install
# module@version` refuses it. The wrapper requires the pinned version and repeats that one replace;
# go.sum is checked against the checksum database as for any module.
set -euo pipefail

# SeaweedFS publishes no module tags the proxy lists; this pseudo-version is its master of 2026-11-09.
SEAWEED_VERSION="${RTJ_SEAWEED_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
rtj_begin "seaweedfs-${SEAWEED_VERSION}" /weed --print "${1:-build}" "$HERE/build.sh"

rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK"
go mod init rtj.local/seaweedfs >/dev/null 2>&1
# The replace seaweedfs' own go.mod carries (a replace in a dependency is ignored, so repeat it).
SMOD="$(rtj_module_field "github.com/seaweedfs/seaweedfs@${SEAWEED_VERSION}" GoMod)"
go mod edit -json "$SMOD" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    new = r["New"]
    if "Version" in new:  # a local-path replace (none today) cannot be repeated here
        print("-replace=%s=%s@%s" % (r["Old"]["Path"], new["Path"], new["Version"]))
' > edits.txt
if [[ -s edits.txt ]]; then xargs go mod edit < edits.txt; fi
echo ">> go get github.com/seaweedfs/seaweedfs/weed@${SEAWEED_VERSION}" >&2
go get "github.com/seaweedfs/seaweedfs/weed@${SEAWEED_VERSION}" >&2
echo ">> go build weed (a large binary: several minutes on a cold cache)" >&2
rm -rf "$BIN.tmp"; mkdir -p "$BIN.tmp"
go build -ldflags "-s -w" -o "$BIN.tmp/weed" github.com/seaweedfs/seaweedfs/weed
"$BIN.tmp/weed" version >&2 || true
rtj_publish
