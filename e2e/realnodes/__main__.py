"""Command line: `python -m e2e.realnodes up|down|build`.

  up [--nodes N] [--gpus G] [--grace 8s]   start a detached real-node cluster, print its kubeconfig path
  down [DIR]                                tear it down (default: the newest cluster under the base dir)
  build                                     build (or reuse) the node binaries and images
"""

from __future__ import annotations

import argparse
from pathlib import Path

from e2e.controlplane import newest_dir

from .binaries import ensure_images, ensure_node_binaries
from .cluster import RealCluster, down


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run one command."""
    ap = argparse.ArgumentParser(prog="python -m e2e.realnodes")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--name", default="rtj-real")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--gpus", type=int, default=0, help="fake nvidia.com/gpu per node (patched Node status)")
    up.add_argument("--grace", default="8s", help="--node-monitor-grace-period")
    sub.add_parser("down").add_argument("dir", nargs="?")
    sub.add_parser("build")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(ensure_node_binaries())
        print(ensure_images())
    elif args.cmd == "up":
        c = RealCluster.start(args.name, node_monitor_grace_period=args.grace, detach=True)
        for i in range(args.nodes):
            c.add_node(f"node-{i + 1}", gpus=args.gpus)
        print(f"export KUBECONFIG={c.kubeconfig}\n# images: {c.images}\n# logs: {c.dir}\n"
              f"# stop: python -m e2e.realnodes down {c.dir}")
    else:
        d = Path(args.dir) if args.dir else newest_dir()
        down(d)
        print(f"stopped {d} (logs kept)")


if __name__ == "__main__":
    main()
