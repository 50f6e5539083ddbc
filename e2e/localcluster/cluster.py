"""Simulated nodes on the local control plane: each node a `node_agent.py` process that runs its pods as
local processes (no container runtime, no images; see DEFAULT_IMAGE_ENTRYPOINTS).

The control plane is e2e.controlplane's; this backend adds the nodes. Everything runs inside the
cluster's own network namespace; the host reaches the apiserver through the control plane's forwarder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from e2e.cluster import wait_for
from e2e.controlplane.binaries import REPO_ROOT
from e2e.controlplane.plane import Component, ControlPlane, NodeHandle, down, kill_process_tree, newest_dir

__all__ = ["DEFAULT_IMAGE_ENTRYPOINTS", "Cluster", "Component", "NodeHandle", "down", "newest_dir", "wait_for"]

DEFAULT_IMAGE_ENTRYPOINTS: dict[str, Any] = {
    # Images do not exist here. A substring of the image name maps to what the image would supply:
    # ENTRYPOINT (`command`), CMD (`args`), USER (`user`/`group`) and ENV (`env`; not PATH, which is the
    # venv's, nor HOME), from the project's Dockerfiles (tests/e2e_harness/test_image_map.py holds them to it).
    # A plain list is an entrypoint run as root.
    "resilient-training-operator": {"command": ["python", "-m", "resilient_operator"], "user": 65532,
                                    "group": 65532,
                                    "env": {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}},
    "resilient-training-trainer": {"command": ["rtj-launch", "--"],
                                   "args": ["-m", "resilient_trainer.examples.tiny_gpt"], "user": 1000,
                                   "group": 1000,
                                   # OMP_NUM_THREADS=1: without it each worker ran torch's intra-op pool at
                                   # the machine's width beside the others (14% more CPU for the same run)
                                   "env": {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                                           "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                                           "OMP_NUM_THREADS": "1"}},
    "python": ["python"],
    "busybox": ["sh"],
}


@dataclass
class Cluster(ControlPlane):
    """A running local cluster with simulated nodes. Create with `Cluster.start(...)`; stop with `.stop()`."""

    image_entrypoints: dict[str, Any] = field(default_factory=dict)
    python_bin_dir: Path = Path()
    honour_security_context: bool = True

    @classmethod
    def start(cls, name: str = "rtj", *, image_entrypoints: dict[str, Any] | None = None,
              python_bin_dir: Path | str | None = None, honour_security_context: bool = True,
              **control_plane: Any) -> Self:
        """Start the control plane (`control_plane`: ControlPlane.start's options) for simulated nodes.

        `image_entrypoints` maps an image-name substring to what the image would supply (entrypoint,
        cmd, user; images do not exist here); it extends DEFAULT_IMAGE_ENTRYPOINTS and
        `RTJ_IMAGE_ENTRYPOINTS` (JSON). `python_bin_dir` goes first on pods' PATH so `python` is
        the project venv's python (default: the directory of the running interpreter).
        `honour_security_context=False` runs every container as root with a writable root filesystem.
        """
        entry = dict(DEFAULT_IMAGE_ENTRYPOINTS)
        if os.environ.get("RTJ_IMAGE_ENTRYPOINTS"):
            entry.update(json.loads(os.environ["RTJ_IMAGE_ENTRYPOINTS"]))
        entry.update(image_entrypoints or {})
        return super().start(name, image_entrypoints=entry,
                             python_bin_dir=Path(python_bin_dir or Path(sys.executable).parent),
                             honour_security_context=honour_security_context, **control_plane)

    # ---------------------------------------------------------------- nodes
    def add_node(self, name: str, *, cpu: str = "8", memory: str = "32Gi", gpus: int = 0,
                 pods: int = 110, labels: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None, wait: bool = True,
                 timeout: float = 60) -> NodeHandle:
        """Register a simulated node and start its agent; waits until the Node is Ready."""
        if name in self.nodes:
            raise ValueError(f"node {name} exists")
        ndir = self.dir / "nodes" / name
        ndir.mkdir(parents=True)
        index, address, serving_crt, serving_key = self.enroll_node(name, ndir)
        config = {
            "node": name, "index": index, "address": address, "subnet": self.subnet,
            "bridge": self.bridge, "gateway": self.api_host, "cluster_netns": self.netns,
            "kubeconfig": str(ndir / "kubeconfig"), "dns_kubeconfig": str(self.dir / "dns.kubeconfig"),
            "api_host": self.api_host, "api_port": self.api_port,
            "ca_crt": str(self.pki.ca_crt), "dir": str(ndir),
            "hostpath_root": str(self.hostpath_root),
            "capacity": {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "100Gi",
                         **({"nvidia.com/gpu": str(gpus)} if gpus else {})},
            "labels": labels or {}, "taints": taints or [],
            "image_entrypoints": self.image_entrypoints,
            "python_bin_dir": str(self.python_bin_dir),
            "honour_security_context": self.honour_security_context,
            "kubelet_version": self.version(),
            "serving_cert": str(serving_crt), "serving_key": str(serving_key),
        }
        cfg_path = ndir / "config.json"
        cfg_path.write_text(json.dumps(config, indent=2))
        handle = NodeHandle(name=name, index=index, address=address, dir=ndir, config=cfg_path)
        self.nodes[name] = handle
        self._start_agent(handle)
        self._save()
        if wait:
            self.wait_node_ready(name, timeout=timeout)
        return handle

    def _start_agent(self, node: NodeHandle) -> None:
        log = node.dir / "agent.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                          os.environ.get("PYTHONPATH")]))}
        with log.open("ab") as out:
            node.proc = subprocess.Popen(
                [sys.executable, "-m", "e2e.localcluster.node_agent", str(node.config)],
                preexec_fn=self.preexec(),  # noqa: PLW1509 (see controlplane.in_cluster)
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=REPO_ROOT, env=env)
        node.killed = False

    def kill_node(self, name: str) -> None:
        """The machine dies: SIGKILL the agent and every pod process; nothing is cleaned up in the API."""
        node = self.nodes[name]
        if node.proc and node.proc.poll() is None:
            kill_process_tree(node.proc.pid)
            node.proc.wait(timeout=10)
        node.killed, node.partitioned = True, False

    def restore_node(self, name: str, *, wait: bool = True, timeout: float = 60) -> None:
        """The machine reboots: a fresh agent reconciles with the API (Terminating pods get finalized)."""
        node = self.nodes[name]
        if node.proc and node.proc.poll() is None:
            raise RuntimeError(f"node {name} is running")
        self._start_agent(node)
        self._save()
        if wait:
            self.wait_node_ready(name, timeout=timeout)

    def partition_node(self, name: str) -> None:
        """The node is cut off: its agent is frozen (SIGSTOP), so heartbeats stop while its pods run on."""
        proc = self.nodes[name].proc
        assert proc is not None and proc.poll() is None, f"agent of {name} not running"
        os.kill(proc.pid, signal.SIGSTOP)
        self.nodes[name].partitioned = True

    def heal_node(self, name: str) -> None:
        """Undo `partition_node`: the agent resumes and reports again."""
        proc = self.nodes[name].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGCONT)
        self.nodes[name].partitioned = False

    def wait_node_ready(self, name: str, timeout: float = 60) -> None:
        """Block until the node is Ready, failing early if its agent dies."""
        node = self.nodes[name]

        def ready() -> bool:
            if node.proc and node.proc.poll() is not None:
                tail = (node.dir / "agent.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"agent for {name} exited: {tail}")
            return self.node_ready(name)

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"node {name} not Ready after {timeout}s; see {node.dir / 'agent.log'}")

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A pod container's stdout+stderr, read from the node's disk (works on killed nodes too;
        `kubectl logs` works as well while the node is up)."""
        for ndir in (self.dir / "nodes").glob("*"):
            for d in sorted((ndir / "pods").glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime):
                logs = sorted(d.glob(f"{container or '*'}.log"))
                if logs:
                    return logs[0].read_text(errors="replace")
        return ""
