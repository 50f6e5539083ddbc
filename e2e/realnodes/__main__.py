"""Command line: `python -m e2e.realnodes up|down|status|build` (see e2e/controlplane/cli.py); `build`
builds (or reuses) the node binaries and images."""

from __future__ import annotations

from e2e.controlplane.cli import Backend, main

from .binaries import ensure_images, ensure_node_binaries
from .cluster import RealCluster, down

BACKEND = Backend("python -m e2e.realnodes", RealCluster.start, down, lambda: [ensure_node_binaries(), ensure_images()],
                  name="rtj-real", nodes=2, gpus=0, gpus_help="fake nvidia.com/gpu per node (patched Node status)",
                  extra=lambda c: f"# images: {c.images}\n")

if __name__ == "__main__":
    main(BACKEND)
