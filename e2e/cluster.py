"""The interface every test cluster offers, its optional capabilities, and what backends build on `kubectl` alone.

Three backends implement `ClusterLike`: `e2e.localcluster.Cluster` (the local control plane with
simulated nodes, no Docker), `e2e.realnodes.RealCluster` (the same control plane with real kubelets)
and `e2e.kindcluster.KindCluster` (kind, for machines with Docker). `get_cluster` (in `e2e/__init__.py`)
picks one by `RTJ_CLUSTER`. What only some backends can do is a small protocol of its own
(`Partitionable`, `RestartableControlPlane`, `HasNetns`), checked with `isinstance` where a helper
needs it. This module imports no backend, so every backend can build on it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `predicate` until it returns a truthy value or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # readiness probes fail in many ways while starting
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc})")


@runtime_checkable
class ClusterLike(Protocol):
    """What the tests, the demo and the benches may use, whichever backend runs the cluster.

    What only some backends can do is a small capability protocol below (`Partitionable`,
    `RestartableControlPlane`, `HasNetns`), checked with `isinstance` where a test needs it, as kueue's
    jobframework does with its optional job interfaces.
    """

    name: str
    dir: Path
    kubeconfig: Path
    node_monitor_grace_period: str

    def add_node(self, name: str, *, cpu: str = ..., memory: str = ..., gpus: int = ...,
                 labels: dict[str, str] | None = ...) -> Any: ...
    def kill_node(self, name: str) -> None: ...
    def restore_node(self, name: str, *, wait: bool = ..., timeout: float = ...) -> None: ...
    def node_name(self, name: str) -> str: ...
    def node_ready(self, name: str) -> bool: ...
    def is_killed(self, name: str) -> bool: ...
    def kubectl(self, *args: str, check: bool = ..., input: str | None = ...,
                timeout: float = ...) -> subprocess.CompletedProcess[str]: ...
    def helm(self, *args: str, check: bool = ..., timeout: float = ...) -> subprocess.CompletedProcess[str]: ...
    def tool_env(self) -> dict[str, str]: ...
    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]] | str, namespace: str | None = ...) -> str: ...
    def get(self, kind: str, name: str, namespace: str | None = ...) -> dict[str, Any] | None: ...
    def wait_for_default_sa(self, namespace: str, timeout: float = ...) -> None: ...
    def api_client(self, *, shared: bool = ...) -> Any: ...
    def host_path(self, path: str) -> Path: ...
    def create_shared_pvc(self, name: str, namespace: str = ..., size: str = ...) -> Path: ...
    def pod_log(self, namespace: str, pod: str, container: str | None = ...) -> str: ...
    def stop(self, *, remove: bool = ...) -> None: ...


@runtime_checkable
class Partitionable(Protocol):
    """A node can be cut off without dying: its agent or kubelet is frozen, its pods keep running."""

    def partition_node(self, name: str) -> None: ...
    def heal_node(self, name: str) -> None: ...
    def partitioned_nodes(self) -> list[str]: ...


@runtime_checkable
class RestartableControlPlane(Protocol):
    """The control plane's processes are the harness's own: a test may restart or signal one (chaos)."""

    def restart_component(self, name: str, *, down_seconds: float = ..., grace: float = ...,
                          timeout: float = ...) -> None: ...
    def signal_component(self, name: str, sig: int) -> None: ...


@runtime_checkable
class HasNetns(Protocol):
    """The cluster lives in a network namespace of its own; node and pod addresses are reached inside it."""

    def in_netns(self, fn: Callable[[], T], timeout: float = ...) -> T: ...


class ClusterTools:
    """The methods both backends share, built on the backend's `kubectl`, `kubeconfig` and `host_path`."""

    kubeconfig: Path

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def host_path(self, path: str) -> Path:
        raise NotImplementedError

    def stop(self, *, remove: bool = False) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def node_name(self, name: str) -> str:
        """The Node's name for a requested name (identity unless the backend maps names)."""
        return name

    def node_ready(self, name: str) -> bool:
        """True when the Node's Ready condition is True."""
        out = self.kubectl("get", "node", self.node_name(name), "-o",
                           "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return out.returncode == 0 and out.stdout.strip() == "True"

    def wait_for_default_sa(self, namespace: str, timeout: float = 30) -> None:
        """Pods are rejected until the namespace's default ServiceAccount exists."""
        wait_for(lambda: self.kubectl("get", "serviceaccount", "default", "-n", namespace,
                                      check=False).returncode == 0, timeout, f"default SA in {namespace}")

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]] | str, namespace: str | None = None) -> str:
        """kubectl apply a manifest (dict, list of dicts, or YAML/JSON text)."""
        if not isinstance(manifest, str):
            items = manifest if isinstance(manifest, list) else [manifest]
            manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        ns = ["-n", namespace] if namespace else []
        return self.kubectl("apply", *ns, "-f", "-", input=manifest).stdout

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object as a dict, or None when it does not exist."""
        ns = ["-n", namespace] if namespace else []
        res = self.kubectl("get", kind, name, *ns, "-o", "json", check=False)
        if res.returncode != 0:
            if "NotFound" in res.stderr:
                return None
            raise RuntimeError(res.stderr)
        result: dict[str, Any] = json.loads(res.stdout)
        return result

    def api_client(self, *, shared: bool = True) -> Any:
        """A `kubernetes.client.ApiClient` authenticated as cluster admin. The shared one is made once per cluster
        and kept, so its connections are reused (urllib3 opens a new one when the API server has dropped one,
        e.g. after a restart): a client per call parsed the kubeconfig and paid a TLS handshake, on both sides,
        on every poll of every wait (in one node-loss test the pytest process took 17 CPU-s, more than the API
        server). `shared=False`: a client of one's own, to change (e.g. an impersonation header)."""
        cached = self.__dict__.get("_api_client") if shared else None
        if cached is None:
            from kubernetes import client, config

            cfg = client.Configuration()
            config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
            cached = client.ApiClient(cfg)
            if shared:
                self.__dict__["_api_client"] = cached
        return cached

    def create_shared_pvc(self, name: str, namespace: str = "default", size: str = "10Gi") -> Path:
        """A ReadWriteMany PVC bound to a hostPath PV under /rtj-shared (shared by every node on both
        backends); returns its host directory."""
        pv_name = f"{namespace}-{name}"
        pv_path = f"/rtj-shared/{namespace}/{name}"
        host = self.host_path(pv_path)
        host.mkdir(parents=True, exist_ok=True)
        manifest = {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
             "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"],
                      "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                      "hostPath": {"path": pv_path, "type": "DirectoryOrCreate"},
                      "claimRef": {"namespace": namespace, "name": name}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                      "resources": {"requests": {"storage": size}}}},
        ]}
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        return host
