"""What the operator's cluster tests share: an installed operator, job manifests, waits and reads.

The operator is installed once per session with helm, as a platform team would, and runs as its pod
with only its ServiceAccount's rights. Training nodes form a pool (label pool=train, one fake GPU
each) so a job's capacity is exactly the number of live pool nodes.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.localcluster.cluster import Cluster, wait_for
from resilient_operator import constants as c
from resilient_trainer import contract
from resilient_trainer.layout import step_dir_name

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "resilient-training-operator"
RELEASE = "rtj"
OPERATOR_NS = "rtj-system"
MOUNT = "/checkpoints"
NODES = ("w0", "w1", "w2", "w3")
HOST_DIR = "/rtj-checkpoints"  # a hostPath shared by every simulated node: the RWX checkpoint volume


def install_operator(rtj_cluster: Cluster) -> Cluster:
    """The session cluster plus a pool of one-GPU training nodes and a node for the operator."""
    for name in NODES:
        rtj_cluster.add_node(name, cpu="4", memory="8Gi", gpus=1, labels={"pool": "train"})
    rtj_cluster.add_node("infra", cpu="4", memory="8Gi", labels={"role": "infra"})
    shared = rtj_cluster.host_path(HOST_DIR)
    shared.mkdir(parents=True, exist_ok=True)
    shared.chmod(0o1777)  # workers run as their image's non-root user; each job gets its own root inside
    rtj_cluster.kubectl("create", "namespace", OPERATOR_NS)
    rtj_cluster.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--wait", "--timeout", "120s",
                     "--set", f"checkpointStorage.hostPath={HOST_DIR}", "--set", f"checkpointStorage.mountPath={MOUNT}",
                     "--set", "nodeSelector.role=infra", "--set", "logLevel=DEBUG")  # fmt: skip
    return rtj_cluster


def custom(cl: Cluster) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(cl.api_client())


def core(cl: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cl.api_client())


def get_job(cl: Cluster, ns: str, name: str) -> dict[str, Any]:
    return custom(cl).get_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL, name)


def job_pods(cl: Cluster, ns: str, name: str) -> list[Any]:
    return core(cl).list_namespaced_pod(ns, label_selector=f"{c.LABEL_JOB}={name}").items


def worker_script(fail_rank: int | None = None, code: int = 3) -> str:
    """Record the injected environment, then idle (or fail with `code` on one rank)."""
    record = f'env | grep -E "^(PET_|RTJ_|MASTER_)" > {MOUNT}/$RTJ_JOB_NAME-$(hostname).env;'
    if fail_rank is None:
        return record + " exec sleep 3600"
    return record + f' if [ "$PET_NODE_RANK" = "{fail_rank}" ]; then sleep 1; exit {code}; fi; exec sleep 3600'


def job_manifest(name: str, ns: str, replicas: int = 3, min_replicas: int = 2, script: str | None = None,
                 **spec: Any) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {
        "replicas": replicas,
        "elasticPolicy": {"minReplicas": min_replicas},
        "checkpoint": {"root": f"{MOUNT}/{ns}-{name}"},
        "nodeLossTimeoutSeconds": 4,
        "template": {"spec": {
            "terminationGracePeriodSeconds": 2,
            "nodeSelector": {"pool": "train"},
            "containers": [{
                "name": "trainer", "image": "busybox", "command": ["sh", "-c", script or worker_script()],
                "resources": {"limits": {c.GPU_RESOURCE: "1"}},
                "volumeMounts": [{"name": "ckpt", "mountPath": MOUNT}],
            }],
            "volumes": [{"name": "ckpt", "hostPath": {"path": HOST_DIR, "type": "Directory"}}],
        }},
    }  # fmt: skip
    body.update(spec)
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name, "namespace": ns}, "spec": body}


def job_namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    ns = f"t-{request.node.name.replace('_', '-')[:40].strip('-').lower()}"
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for_default_sa(ns)
    yield ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    for node in NODES:  # leave every node alive for the next test
        if cluster.nodes[node].killed:
            cluster.restore_node(node)
    # pods of a deleted namespace go with it; wait so the next test sees all capacity
    wait_for(lambda: not [p for p in core(cluster).list_pod_for_all_namespaces(
        label_selector=c.LABEL_JOB).items if p.metadata.namespace == ns], 60, f"pods of {ns} gone")  # fmt: skip


def apply(cl: Cluster, manifest: dict[str, Any]) -> None:
    cl.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def running_attempt(cl: Cluster, ns: str, name: str, attempt: int, replicas: int, timeout: float = 90) -> list[Any]:
    """Wait until exactly `replicas` pods of `attempt` run, no other pods exist, and status says Running."""

    def check() -> list[Any] | None:
        pods = job_pods(cl, ns, name)
        ours = [p for p in pods if p.metadata.labels[c.LABEL_ATTEMPT] == str(attempt)]
        if len(pods) != replicas or len(ours) != replicas or any(p.status.phase != "Running" for p in ours):
            return None
        status = get_job(cl, ns, name).get("status", {})
        return ours if status.get("phase") == c.RUNNING and status.get("attempt") == attempt else None

    return wait_for(check, timeout, f"attempt {attempt} of {ns}/{name} running {replicas} workers")


def events(cl: Cluster, ns: str, name: str) -> list[str]:
    items = core(cl).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [f"{e.reason}: {e.message}" for e in sorted(items, key=lambda e: e.metadata.creation_timestamp)]


def injected_env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.name in contract.ALL_NAMES}


def node_of(pods: list[Any], rank: str) -> str:
    return next(p.spec.node_name for p in pods if p.metadata.labels[c.LABEL_RANK] == rank)


def make_checkpoint(root: Path, step: int) -> Path:
    """A real, complete DCP checkpoint in the job's root (written by this test process)."""
    import torch
    import torch.distributed.checkpoint as dcp

    path = root / step_dir_name(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.full((8,), float(step))}, checkpoint_id=str(path))
    return path
