"""The command line both process-node backends offer (`python -m e2e.localcluster|e2e.realnodes ...`).

    up [--nodes N] [--gpus G] [--grace 8s]   start a detached cluster, print its kubeconfig path
    down [DIR]                                tear it down (default: the newest cluster under the base dir)
    status [DIR]                              print cluster.json
    build                                     build (or reuse) what the backend needs
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .plane import newest_dir


@dataclass(frozen=True)
class Backend:
    """What differs between the backends' command lines."""

    prog: str
    start: Callable[..., Any]  # ControlPlane.start of the backend
    down: Callable[[Path], None]
    build: Callable[[], list[Path]]
    name: str
    nodes: int
    gpus: int
    gpus_help: str = "fake nvidia.com/gpu per node"
    extra: Callable[[Any], str] = lambda cluster: ""  # more lines for `up` to print


def main(backend: Backend, argv: list[str] | None = None) -> None:
    """Parse arguments and run one command."""
    ap = argparse.ArgumentParser(prog=backend.prog)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--name", default=backend.name)
    up.add_argument("--nodes", type=int, default=backend.nodes)
    up.add_argument("--gpus", type=int, default=backend.gpus, help=backend.gpus_help)
    up.add_argument("--grace", default="8s", help="--node-monitor-grace-period")
    for name in ("down", "status"):
        sub.add_parser(name).add_argument("dir", nargs="?")
    sub.add_parser("build")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        for path in backend.build():
            print(path)
    elif args.cmd == "up":
        c = backend.start(args.name, node_monitor_grace_period=args.grace, detach=True)
        for i in range(args.nodes):
            c.add_node(f"node-{i + 1}", gpus=args.gpus)
        print(f"export KUBECONFIG={c.kubeconfig}\n{backend.extra(c)}# logs: {c.dir}\n"
              f"# stop: {backend.prog} down {c.dir}")
    elif args.cmd == "down":
        d = Path(args.dir) if args.dir else newest_dir()
        backend.down(d)
        print(f"stopped {d} (logs kept)")
    else:
        d = Path(args.dir) if args.dir else newest_dir()
        print(json.dumps(json.loads((d / "cluster.json").read_text()), indent=2))
