"""Command line: `python -m e2e.localcluster up|down|status|build` (see e2e/controlplane/cli.py)."""

from __future__ import annotations

from e2e.controlplane.binaries import ensure_binaries
from e2e.controlplane.cli import Backend, main

from .cluster import Cluster, down

BACKEND = Backend("python -m e2e.localcluster", Cluster.start, down, lambda: [ensure_binaries()], name="rtj",
                  nodes=3, gpus=1)

if __name__ == "__main__":
    main(BACKEND)
