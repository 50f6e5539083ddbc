# The prologue every hack/*/build.sh shares (sourced, never run): where the cache is, the "cached:" short
# cut, one builder at a time, the pinned Go environment, publishing a build. A script sets KEY (its
# directory under $CACHE/bin, which names the versions it builds) and OUT (what it prints last: the bin
# dir or a binary in it), then:
#
#   rtj_begin KEY SUFFIX PRINT_FLAG MODE FILE...   all of the below: OUT=BIN+SUFFIX; MODE PRINT_FLAG prints
#                                OUT only; else stamp FILE..., then the short cut or the lock
#   rtj_key KEY                  BIN=$CACHE/bin/KEY, WORK=$CACHE/build/KEY
#   rtj_stamp FILE...            STAMP: the Go version, $STAMP_EXTRA, KEY, this file and FILE... hashed
#                                (everything that changes the output)
#   rtj_cached_or_lock           print OUT and exit if BIN holds STAMP's build (unless MODE is --force);
#                                else wait for the builder lock, look again (the loser of a race reuses the
#                                winner's build), and set the Go environment for building
#   rtj_publish                  BIN.tmp (the build, written there) becomes BIN, stamped; prints OUT
#
# RTJ_CACHE overrides the cache directory (a cold build into a scratch cache: RTJ_CACHE=$(mktemp -d)).
# shellcheck shell=bash

set -euo pipefail

CACHE="${RTJ_CACHE:-$HOME/.cache/resilient-training}"
RTJ_LIB="${BASH_SOURCE[0]}"

rtj_key() {
  KEY="$1"
  BIN="${CACHE}/bin/${KEY}"
  WORK="${CACHE}/build/${KEY}"
}

rtj_stamp() {
  STAMP="$( (go env GOVERSION; [[ -z "${STAMP_EXTRA:-}" ]] || echo "$STAMP_EXTRA"; echo "$KEY"; cat "$RTJ_LIB" "$@") \
    | sha256sum | cut -d' ' -f1)"
}

rtj_fresh() { [[ -e "$OUT" && -f "$BIN/.stamp" && "$(cat "$BIN/.stamp")" == "$STAMP" ]]; }

# rtj_done: print OUT (last, on stdout; "cached:" on stderr) and leave the script.
rtj_done() { echo "cached: $OUT" >&2; echo "$OUT"; exit 0; }

# rtj_lock FILE: hold an exclusive lock on FILE (fd 9) until the script exits.
rtj_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1"
  flock 9
}

rtj_cached_or_lock() {
  if [[ "${MODE:-build}" != "--force" ]] && rtj_fresh; then rtj_done; fi
  rtj_lock "${CACHE}/bin/.${KEY}.lock"
  if [[ "${MODE:-build}" != "--force" ]] && rtj_fresh; then rtj_done; fi
  export GOFLAGS="${GOFLAGS:--trimpath}"
  export CGO_ENABLED=0
  export GOGC="${GOGC:-200}"  # fewer compiler GCs; memory is plentiful, CPU is not
  export GOTOOLCHAIN=local
}

rtj_begin() {
  rtj_key "$1"
  OUT="${BIN}$2"
  MODE="${4:-build}"
  if [[ "$MODE" == "$3" ]]; then echo "$OUT"; exit 0; fi
  shift 4
  rtj_stamp "$@"
  rtj_cached_or_lock
}

rtj_publish() {
  echo "$STAMP" > "$BIN.tmp/.stamp"
  rm -rf "$BIN"; mv "$BIN.tmp" "$BIN"
  echo "$OUT"
}

# rtj_module_field MODULE@VERSION FIELD: download the module (proxy, checked against sum.golang.org) and print
# one field of `go mod download -json` (Dir: its source; GoMod: its go.mod).
rtj_module_field() {
  go mod download -json "$1" | python3 -c 'import json,sys;print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# rtj_k8s_ldflags VERSION: the -ldflags a Kubernetes release build stamps its version with (KLD).
rtj_k8s_ldflags() {
  local v="$1" maj min p
  maj="${v#v}"; maj="${maj%%.*}"; min="${v#v*.}"; min="${min%%.*}"
  KLD="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    KLD+=" -X $p.gitVersion=$v -X $p.gitMajor=$maj -X $p.gitMinor=$min -X $p.gitTreeState=clean"
    KLD+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  K8S_MAJOR="$maj"; K8S_MINOR="$min"
}

# rtj_k8s_wrapper_module NAME VERSION ETCD HELM LOCK: in the current directory, a wrapper module NAME that
# requires k8s.io/kubernetes@VERSION with each staging module replaced by its published tag (generated from
# kubernetes' own go.mod by hack/k8s/gen_gomod.py), go.sum from LOCK when present, tidied.
rtj_k8s_wrapper_module() {
  local name="$1" version="$2" etcd="$3" helm="$4" lock="$5" kmod
  kmod="$(rtj_module_field "k8s.io/kubernetes@${version}" GoMod)"
  go mod init "rtj.local/${name}" >/dev/null 2>&1
  go mod edit -json "$kmod" | python3 "$(dirname "$RTJ_LIB")/k8s/gen_gomod.py" "$version" "$etcd" "$helm" > edits.txt
  xargs go mod edit < edits.txt
  # A committed go.sum pins every module hash (checked again against sum.golang.org on first download).
  if [[ -f "$lock" ]]; then cp "$lock" go.sum; fi
  echo ">> ${name}: go mod tidy" >&2
  go mod tidy
}
