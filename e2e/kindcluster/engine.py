"""The Docker engine and tools for kind on a machine with neither Docker nor a registry (this one, CI here).

`LocalEngine` starts Debian's dockerd inside a network namespace of its own (hack/kind/docker.sh: bridges,
iptables and ip_forward live there, never on the host), builds kind, kubeadm and crictl (hack/kind/build.sh)
and the node image from our own binaries (hack/kind/node-image.sh). kind runs inside the netns; kubectl,
helm and the Python client reach the API server through a `relay.NetnsRelay` on the host's loopback.
On a laptop with Docker and a registry none of this is used: KindCluster runs the stock kindest/node.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HACK = ROOT / "hack" / "kind"


def _sh(*argv: str, timeout: float = 3600) -> str:
    """Run a hack script; its last stdout line is its answer (a path, a tag)."""
    out = subprocess.run(["bash", *argv], capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


@dataclass
class LocalEngine:
    """dockerd in netns `netns`, with the tools kind needs on PATH."""

    netns: str = "rtj-docker"
    docker_host: str = ""
    path: str = ""

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @classmethod
    def start(cls, netns: str | None = None) -> LocalEngine:
        """Build (or reuse) kind/kubeadm/crictl and the control-plane tools, start the engine."""
        netns = netns or os.environ.get("RTJ_DOCKER_NETNS", "rtj-docker")
        env = {**os.environ, "RTJ_DOCKER_NETNS": netns}
        kind_bin = _sh(str(HACK / "build.sh"))
        k8s_bin = _sh(str(ROOT / "hack" / "k8s" / "build.sh"))
        out = subprocess.run(["bash", str(HACK / "docker.sh"), "start"], capture_output=True, text=True, env=env,
                             timeout=120, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"hack/kind/docker.sh start failed: {out.stderr[-3000:]}")
        host = next(line.split("=", 1)[1] for line in out.stdout.splitlines() if "DOCKER_HOST=" in line)
        return cls(netns, host, f"{kind_bin}:{k8s_bin}:{os.environ.get('PATH', '')}")

    def env(self) -> dict[str, str]:
        """The environment docker, kind, kubectl and helm run with."""
        return {**os.environ, "DOCKER_HOST": self.docker_host, "PATH": self.path, "RTJ_DOCKER_NETNS": self.netns}

    def in_netns(self, argv: list[str]) -> list[str]:
        """argv run inside the engine's netns (kind: its checks dial the nodes' and the API's addresses)."""
        return ["nsenter", f"--net={self.netns_path}", *argv]

    def node_image(self) -> str:
        """The locally built kindest/node equivalent (built once per inputs, kept in the engine)."""
        out = subprocess.run(["bash", str(HACK / "node-image.sh")], capture_output=True, text=True, env=self.env(),
                             timeout=3600, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"hack/kind/node-image.sh failed: {out.stderr[-3000:]}")
        return out.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        """Stop the engine (its containers with it) and delete its netns."""
        subprocess.run(["bash", str(HACK / "docker.sh"), "stop"], env=self.env(), capture_output=True, timeout=180,
                       check=False)
