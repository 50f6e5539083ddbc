"""Command line: `python -m e2e.localcluster up|down|status|build`.

  up [--nodes N] [--gpus G] [--grace 8s]   start a detached cluster, print its kubeconfig path
  down [DIR]                                tear down (default: the newest cluster under the base dir)
  status [DIR]                              print cluster.json
  build                                     build (or reuse) the control-plane binaries
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from e2e.controlplane.binaries import ensure_binaries

from .cluster import Cluster, down, newest_dir


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run one command."""
    ap = argparse.ArgumentParser(prog="python -m e2e.localcluster")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--name", default="rtj")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--gpus", type=int, default=1, help="fake nvidia.com/gpu per node")
    up.add_argument("--grace", default="8s", help="--node-monitor-grace-period")
    for name in ("down", "status"):
        sub.add_parser(name).add_argument("dir", nargs="?")
    sub.add_parser("build")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(ensure_binaries())
    elif args.cmd == "up":
        c = Cluster.start(args.name, node_monitor_grace_period=args.grace, detach=True)
        for i in range(args.nodes):
            c.add_node(f"node-{i + 1}", gpus=args.gpus)
        print(f"export KUBECONFIG={c.kubeconfig}\n# logs: {c.dir}\n# stop: python -m e2e.localcluster down {c.dir}")
    elif args.cmd == "down":
        d = Path(args.dir) if args.dir else newest_dir()
        down(d)
        print(f"stopped {d} (logs kept)")
    else:
        d = Path(args.dir) if args.dir else newest_dir()
        print(json.dumps(json.loads((d / "cluster.json").read_text()), indent=2))


if __name__ == "__main__":
    main()
