"""The e2e lane on kind: the operator from its image (helm), the trainer image, four training workers.

Shared by e2e/tests/test_kind_lane.py and `make demo DEMO_ARGS=--kind`. The cluster is kind (a control plane
and four workers, each a container with systemd, containerd and a kubelet); here it runs on the netns engine
with the node image built from our binaries (e2e/kindcluster/engine.py), on a laptop on its Docker. The
workers are the pool (pool=train, one fake GPU each); the operator runs on the control-plane node (labelled
role=infra, its taint tolerated), so a killed worker never takes the operator with it. Every namespace
enforces Pod Security "restricted".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2e import scenarios, support
from e2e.cluster import wait_for
from e2e.kindcluster import KindCluster
from resilient_operator import constants as c

TRAIN_NODES = ("w0", "w1", "w2", "w3")
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}
WORKER_LIMITS = {"cpu": "1", "memory": "2Gi", c.GPU_RESOURCE: "1"}  # the example's, plus one fake GPU
# What the stock path (a laptop's Docker: `docker build` + `kind load docker-image`) tags the images.
STOCK_IMAGES = {"operator": "resilient-training-operator:e2e", "trainer-cpu": "resilient-training-trainer:e2e"}


@dataclass
class Lane:
    """A kind cluster with the pool labelled and the operator installed; `timings` holds what setup cost."""

    cluster: KindCluster
    train_nodes: tuple[str, ...]
    timings: dict[str, float] = field(default_factory=dict)

    def image(self, name: str) -> str:
        return self.cluster.images.get(name) or STOCK_IMAGES[name]

    def stop(self) -> None:
        self.cluster.stop()


def start(name: str = "lane", train_nodes: Sequence[str] = TRAIN_NODES, grace: str = "8s",
          log_level: str = "DEBUG", kill_mode: str = "kill") -> Lane:
    """Engine, node image and images (built or cached), the cluster, the pool, the operator."""
    timings: dict[str, float] = {}
    t = time.monotonic()
    cluster = KindCluster.start(name, node_monitor_grace_period=grace, workers=len(train_nodes))
    cluster.kill_mode = kill_mode
    timings["engine + node image + docker build + kind create + kind load"] = round(time.monotonic() - t, 1)
    if cluster.engine is not None:
        timings.update({f"docker build {n}": s for n, s in cluster.engine.build_seconds.items()})
    lane = Lane(cluster, tuple(train_nodes), timings)
    try:
        t = time.monotonic()
        for node in train_nodes:
            cluster.add_node(node, gpus=1, labels={"pool": "train"})
        cluster.kubectl("label", "node", f"{cluster.name}-control-plane", "role=infra")
        install_operator(lane, log_level)
        timings["helm install -> operator pod Ready"] = round(time.monotonic() - t, 1)
    except BaseException:
        cluster.stop()
        raise
    return lane


def create_namespace(cluster: KindCluster, name: str) -> None:
    """A namespace with Pod Security "restricted" enforced (and warned), ready for pods."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": RESTRICTED}})
    cluster.wait_for_default_sa(name)


def install_operator(lane: Lane, log_level: str = "DEBUG") -> None:
    """helm install the chart running the operator image (pullPolicy Never: loaded, not pulled)."""
    cl = lane.cluster
    support.shared_dir(cl)
    create_namespace(cl, support.OPERATOR_NS)
    scenarios.shared_claim(cl, support.OPERATOR_NS)
    repository, _, tag = lane.image("operator").rpartition(":")
    support.helm_install(cl, {
        "image.repository": repository, "image.tag": tag, "image.pullPolicy": "Never",
        "checkpointStorage.existingClaim": scenarios.CLAIM, "checkpointStorage.mountPath": support.MOUNT,
        "nodeSelector.role": "infra", "tolerations[0].operator": "Exists", "logLevel": log_level,
        "replicaCount": "1"}, wait="240s", timeout=300)


def lane_job(lane: Lane, name: str, namespace: str, cpu: str = "1", **kw: Any) -> dict[str, Any]:
    """scenarios.example_job with the example's limits kept and the trainer image the lane loaded. Its
    node-loss timeout is 8 s, as on real nodes: kind's kubelets beside both test lanes on two cores once
    missed 4 s of Lease renewals (a second, spurious NodeLost left the job below its minimum). The cause, as the
    logs of a later 8 s miss show: the kind API server starved of CPU (every worker's lease PUT timed out
    together), which the control plane's container's CPU shares now address (KindCluster._start_local)."""
    kw.setdefault("node_loss_timeout", 8)
    job = scenarios.example_job(name, namespace, **kw)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {**WORKER_LIMITS, "cpu": cpu}}
    container["image"] = lane.image("trainer-cpu")
    container["imagePullPolicy"] = "Never"
    return job


@contextlib.contextmanager
def job_namespace(lane: Lane, name: str) -> Iterator[str]:
    """A restricted namespace for one test; afterwards killed nodes are back and the job's pods gone."""
    cl = lane.cluster
    create_namespace(cl, name)
    try:
        yield name
    finally:
        cl.kubectl("delete", "namespace", name, "--wait=false", check=False)
        for node in list(cl.paused):
            cl.restore_node(node, timeout=180)
        wait_for(lambda: not [p for p in support.core(cl).list_pod_for_all_namespaces(
            label_selector=c.LABEL_JOB).items if p.metadata.namespace == name], 180, f"pods of {name} gone")
