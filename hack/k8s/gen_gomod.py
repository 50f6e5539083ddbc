"""Emit `go mod edit` flags for the wrapper module, generated from kubernetes' own go.mod.

Reads `go mod edit -json <kubernetes go.mod>` on stdin. Every
`k8s.io/X => ./staging/src/k8s.io/X` becomes `k8s.io/X => k8s.io/X v0.Y.Z`, so the
staging list always matches the pinned Kubernetes release instead of a hand-typed copy.
"""

import json
import sys


def main() -> None:
    """Print one `go mod edit` flag per line."""
    kver, etcd, helm = sys.argv[1:4]
    staging_ver = "v0." + kver.removeprefix("v1.")
    mod = json.load(sys.stdin)
    flags = [
        f"-require=k8s.io/kubernetes@{kver}",
        f"-require=go.etcd.io/etcd/server/v3@{etcd}",
        f"-require=helm.sh/helm/v3@{helm}",
    ]
    for rep in mod.get("Replace") or []:
        old, new = rep["Old"]["Path"], rep["New"]["Path"]
        if not new.startswith("./staging/"):
            raise SystemExit(f"unexpected non-staging replace in kubernetes go.mod: {rep}")
        flags.append(f"-replace={old}={old}@{staging_ver}")
    print("\n".join(flags))


if __name__ == "__main__":
    main()
