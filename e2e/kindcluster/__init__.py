"""The kind-backed cluster: `e2e.cluster.ClusterLike` for machines with Docker.

Selected with RTJ_CLUSTER=kind. One control plane + N workers (default 3, RTJ_KIND_WORKERS),
every node mounting the same host directory for each shared path (an RWX volume for checkpoints),
controller-manager flags through a kubeadm patch, project images built and `kind load`ed, and a node
"killed" with `docker pause` (its kubelet and pods freeze; the control plane sees a silent machine).

Differences from the local substrate, by construction: nodes exist from the start (`add_node` claims
a spare worker and labels it), their CPU/memory are the host's, and GPUs are advertised by patching
the node's status capacity with `nvidia.com/gpu` (as the device-plugin docs show for extended resources).
This path cannot run on the development machine (no Docker engine); CI runs it in .github/workflows/e2e-kind.yml.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.cluster import ClusterTools

KIND_VERSION = "v0.30.0"
NODE_IMAGE = os.environ.get("RTJ_KIND_NODE_IMAGE", "kindest/node:v1.34.0")
SHARED_PATHS = ("/rtj-checkpoints", "/rtj-shared")
REPO_ROOT = Path(__file__).resolve().parents[2]
# Image tag -> Dockerfile context, built and loaded into every node.
IMAGES = {
    "resilient-training-operator:e2e": ("operator/Dockerfile", "."),
    "resilient-training-trainer:e2e": ("trainer_image/Dockerfile", "."),
}

Runner = Callable[..., subprocess.CompletedProcess[str]]


def default_runner(argv: Sequence[str], *, input: str | None = None, timeout: float = 600,
                   check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (docker, kind, kubectl, helm) with a timeout."""
    res = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout,
                         check=False, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr[-3000:]}")
    return res


def kind_config(workers: int, shared_root: Path, node_monitor_grace_period: str = "8s",
                node_monitor_period: str = "1s", shared_paths: Sequence[str] = SHARED_PATHS) -> dict[str, Any]:
    """The kind Cluster config: one control plane, `workers` workers, shared mounts on every node."""
    mounts = [{"hostPath": str(shared_root / p.lstrip("/")), "containerPath": p} for p in shared_paths]
    # kind renders kubeadm v1beta3 for Kubernetes < 1.36, where extraArgs is a map.
    patch = (
        "kind: ClusterConfiguration\n"
        "controllerManager:\n"
        "  extraArgs:\n"
        f'    node-monitor-grace-period: "{node_monitor_grace_period}"\n'
        f'    node-monitor-period: "{node_monitor_period}"\n'
    )
    nodes = [{"role": "control-plane", "image": NODE_IMAGE, "extraMounts": mounts}]
    nodes += [{"role": "worker", "image": NODE_IMAGE, "extraMounts": mounts} for _ in range(workers)]
    return {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "nodes": nodes,
            "kubeadmConfigPatches": [patch]}


def worker_container_names(cluster: str, workers: int) -> list[str]:
    """kind names workers <cluster>-worker, <cluster>-worker2, ..."""
    return [f"{cluster}-worker{'' if i == 1 else i}" for i in range(1, workers + 1)]


@dataclass
class KindCluster(ClusterTools):
    """A kind cluster behind the shared interface (apply/get/api_client/create_shared_pvc... come from
    ClusterTools; start/add_node/kill_node/restore_node/stop are kind's own)."""

    name: str
    dir: Path
    kubeconfig: Path
    node_monitor_grace_period: str
    workers: list[str]
    runner: Runner = default_runner
    claimed: dict[str, str] = field(default_factory=dict)  # requested name -> kind node name
    paused: set[str] = field(default_factory=set)  # requested names killed (docker pause) and not restored

    @classmethod
    def create_commands(cls, name: str, config_path: Path, kubeconfig: Path) -> list[list[str]]:
        """The commands `start` runs, in order (images are built and loaded after creation)."""
        cmds = [["kind", "create", "cluster", "--name", name, "--config", str(config_path),
                 "--kubeconfig", str(kubeconfig), "--wait", "120s"]]
        for tag, (dockerfile, context) in IMAGES.items():
            cmds.append(["docker", "build", "-t", tag, "-f", str(REPO_ROOT / dockerfile), str(REPO_ROOT / context)])
            cmds.append(["kind", "load", "docker-image", tag, "--name", name])
        return cmds

    @classmethod
    def start(cls, name: str = "rtj", *, node_monitor_grace_period: str = "8s", workers: int | None = None,
              base_dir: Path | str | None = None, runner: Runner = default_runner,
              build_images: bool = True, **_ignored: Any) -> KindCluster:
        """Create the kind cluster, build and load the project images. Extra local-only options are ignored."""
        workers = workers or int(os.environ.get("RTJ_KIND_WORKERS", "3"))
        kind_name = f"{name}-{secrets.token_hex(2)}"
        base = Path(base_dir or tempfile.gettempdir()) / "rtj-kind"
        cdir = base / kind_name
        for p in SHARED_PATHS:
            (cdir / "hostpath" / p.lstrip("/")).mkdir(parents=True, exist_ok=True)
        config_path = cdir / "kind.json"
        config_path.write_text(json.dumps(kind_config(workers, cdir / "hostpath", node_monitor_grace_period),
                                          indent=2))
        kc = cdir / "kubeconfig"
        cluster = cls(kind_name, cdir, kc, node_monitor_grace_period,
                      worker_container_names(kind_name, workers), runner)
        try:
            for cmd in cls.create_commands(kind_name, config_path, kc):
                if build_images or cmd[:2] == ["kind", "create"]:
                    runner(cmd, timeout=1200)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    # ------------------------------------------------------------ nodes
    def node_name(self, name: str) -> str:
        """The kind node standing for a requested node name."""
        return self.claimed.get(name, name)

    def add_node(self, name: str, *, gpus: int = 0, labels: dict[str, str] | None = None,
                 **_ignored: Any) -> str:
        """Claim a spare worker for `name`: label it (incl. rtj.local/name) and advertise fake GPUs."""
        spare = [w for w in self.workers if w not in self.claimed.values()]
        if not spare:
            raise RuntimeError(f"no spare kind worker for {name}; raise RTJ_KIND_WORKERS")
        node = spare[0]
        self.claimed[name] = node
        pairs = [f"{k}={v}" for k, v in {**(labels or {}), "rtj.local/name": name}.items()]
        self.kubectl("label", "node", node, "--overwrite", *pairs)
        if gpus:
            patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(gpus)}]
            self.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(patch))
        return node

    def kill_command(self, name: str) -> list[str]:
        """Freeze the node's container: kubelet, containerd and pods stop, nothing is cleaned up."""
        return ["docker", "pause", self.node_name(name)]

    def restore_command(self, name: str) -> list[str]:
        """Thaw the node; its kubelet resumes and reconciles with the API."""
        return ["docker", "unpause", self.node_name(name)]

    def kill_node(self, name: str) -> None:
        """See kill_command."""
        self.runner(self.kill_command(name))
        self.paused.add(name)

    def is_killed(self, name: str) -> bool:
        return name in self.paused

    def restore_node(self, name: str, *, wait: bool = True, timeout: float = 120) -> None:
        """See restore_command; waits for Ready."""
        self.runner(self.restore_command(name))
        self.paused.discard(name)
        if wait:
            self.kubectl("wait", "--for=condition=Ready", f"node/{self.node_name(name)}", f"--timeout={int(timeout)}s",
                         timeout=timeout + 10)

    # ------------------------------------------------------------ volumes
    @property
    def hostpath_root(self) -> Path:
        """Host directory whose SHARED_PATHS subdirectories every node mounts."""
        return self.dir / "hostpath"

    def host_path(self, path: str) -> Path:
        """Host location of a pod-visible shared path (must be under one of SHARED_PATHS)."""
        if not any(path == p or path.startswith(p + "/") for p in SHARED_PATHS):
            raise ValueError(f"{path} is not shared across kind nodes; use a path under {SHARED_PATHS}")
        return self.hostpath_root / path.lstrip("/")

    # ------------------------------------------------------------ clients
    def tool_env(self) -> dict[str, str]:
        """kubectl/helm environment for this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """kubectl against this cluster."""
        return self.runner(["kubectl", f"--kubeconfig={self.kubeconfig}", *args], input=input, timeout=timeout,
                           check=check)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """helm against this cluster."""
        return self.runner(["helm", f"--kubeconfig={self.kubeconfig}", *args], timeout=timeout, check=check)

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """kubectl logs (kind has real kubelets)."""
        args = ["logs", "-n", namespace, pod] + (["-c", container] if container else [])
        return self.kubectl(*args, check=False).stdout

    def stop(self, *, remove: bool = False) -> None:
        """Delete the kind cluster; keep the directory unless `remove`."""
        self.runner(["kind", "delete", "cluster", "--name", self.name], check=False, timeout=300)
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
