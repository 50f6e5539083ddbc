"""The e2e lane on real nodes: the operator from its image (installed by helm), the trainer image, PSA restricted.

Shared by e2e/tests/test_realnodes_lane.py and `make demo DEMO_ARGS=--real-nodes`. A `Lane` is a RealCluster
with training nodes (label pool=train, one fake GPU each, the CPU trainer image imported) and an `infra` node
(the operator image imported) where the chart's Deployment runs the operator as its pod. The operator reads the
checkpoints through a claim (checkpointStorage.existingClaim) rather than a hostPath, so its namespace, like
every job namespace, enforces Pod Security "restricted": admission and the kubelet judge real pods.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import images, scenarios, support
from e2e.cluster import wait_for
from e2e.realnodes.cluster import RealCluster
from resilient_operator import constants as c

TRAIN_NODES = ("w0", "w1", "w2")
INFRA = "infra"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}
# The example's requests/limits (examples/job.yaml) plus the pool's one fake GPU: Guaranteed QoS, so the
# kubelet writes both into the pod's cgroup.
NODE_LOSS_TIMEOUT = 8  # seconds; see lane_job
WORKER_LIMITS = {"cpu": "1", "memory": "2Gi", c.GPU_RESOURCE: "1"}


@dataclass
class Lane:
    """A real-node cluster with the operator installed from its image; `timings` holds what setup cost."""

    cluster: RealCluster
    images: dict[str, images.ImageRef]
    train_nodes: tuple[str, ...]
    timings: dict[str, float] = field(default_factory=dict)

    def stop(self) -> None:
        self.cluster.stop()


def _timed(timings: dict[str, float], key: str, started: float) -> None:
    timings[key] = round(time.monotonic() - started, 1)


# ---- the nodes' disk: the images preloaded, as a machine image would have them ---------------------------
# Importing the 1.9 GB trainer archive into each node's containerd took 100 s per node and 5 GB of disk
# each (content + unpacked layers). Instead one containerd imports the images once into a cached root (the
# seed); every node's containerd root starts as a hard-linked copy of it, its bolt databases copied. The
# committed layers are only ever overlay lowerdirs (never written), content blobs are immutable, so
# sharing their inodes is safe. The seed keeps no layer blobs: the CRI creates containers from the
# unpacked snapshots and unpacks only when one is missing (containerd's discard_unpacked_layers relies on it).
KEEP_SEEDS = 2  # a seed is ~3.4 GB (the CPU trainer unpacked, the operator)
_SEED_DBS = ("io.containerd.metadata.v1.bolt/meta.db", "io.containerd.snapshotter.v1.overlayfs/metadata.db")


def node_seed(refs: Sequence[images.ImageRef]) -> Path:
    """A containerd root holding `refs` imported and unpacked (overlayfs), cached by digests and version."""
    version = subprocess.run(["containerd", "--version"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    key = hashlib.sha256(json.dumps([version, sorted((r.ref, r.digest) for r in refs)]).encode()).hexdigest()[:16]
    seed = images.CACHE / f"lane-seed-{key}"
    images.CACHE.mkdir(parents=True, exist_ok=True)
    with open(images.CACHE / ".lane-seed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several worktrees share the cache; the loser reuses the seed
        if (seed / "root").is_dir():
            os.utime(seed)  # most recently used: the last to be pruned
            return seed / "root"
        tmp = seed.with_name(seed.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        node = images.ScratchContainerd(tmp)
        layers: list[str] = []
        try:
            for ref in refs:
                node.ctr("images", "import", "--snapshotter=overlayfs", str(ref.archive), timeout=1800)
                manifest = json.loads(node.ctr("content", "get", ref.digest).stdout)
                layers += [layer["digest"] for layer in manifest["layers"]]
                node.ctr("content", "rm", *layers[-len(manifest["layers"]):])
        finally:
            node.stop()
        for digest in layers:  # unreferenced now; containerd's GC would only delete them later
            (tmp / "root" / "io.containerd.content.v1.content" / "blobs" / "sha256" / digest.split(":")[1]).unlink(
                missing_ok=True)
        # Worktrees with other images share the cache: keep the KEEP_SEEDS most recently used, not only ours.
        others = sorted((d for d in images.CACHE.glob("lane-seed-*") if d.is_dir() and d not in (tmp, seed)
                         and not d.name.endswith(".tmp")), key=lambda d: d.stat().st_mtime, reverse=True)
        for stale in others[KEEP_SEEDS - 1:]:
            shutil.rmtree(stale, ignore_errors=True)
        keep = tmp / "root"
        for other in tmp.iterdir():  # the scratch containerd's state, socket and log: not the disk
            if other.is_dir() and not other.is_symlink() and other != keep:
                shutil.rmtree(other)
            elif other != keep:
                other.unlink()
        tmp.rename(seed)
        return seed / "root"


def seed_node_disk(cluster: RealCluster, node: str, seed: Path) -> None:
    """Before `node` boots: its containerd root is a hard-linked copy of the seed (databases copied)."""
    root = cluster.dir / "nodes" / node / "containerd" / "root"
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(seed), str(root)], check=True, timeout=300)
    for db in _SEED_DBS:
        (root / db).unlink()
        shutil.copy2(seed / db, root / db)


def has_image(cluster: RealCluster, node: str, image: images.ImageRef) -> bool:
    return image.ref in cluster.ctr(node, "images", "list", "-q").stdout.split()


def start(name: str = "lane", train_nodes: Sequence[str] = TRAIN_NODES, grace: str = "8s",
          log_level: str = "DEBUG", detach: bool = False) -> Lane:
    """Build (or reuse) the images, start the cluster and its nodes, import the images, install the chart."""
    timings: dict[str, float] = {}
    t = time.monotonic()
    refs = images.ensure_images(["operator", "trainer-cpu"])
    _timed(timings, "images (build or cache)", t)
    t = time.monotonic()
    cluster = RealCluster.start(name, node_monitor_grace_period=grace, detach=detach)
    try:
        _timed(timings, "control plane + CoreDNS + kube-proxy", t)
        t = time.monotonic()
        seed = node_seed([refs["operator"], refs["trainer-cpu"]])
        _timed(timings, "node disk seed (import once, or cache)", t)
        t = time.monotonic()
        for node in (*train_nodes, INFRA):
            seed_node_disk(cluster, node, seed)
        for node in train_nodes:
            cluster.add_node(node, gpus=1, labels={"pool": "train"}, wait=False)
        cluster.add_node(INFRA, labels={"role": "infra"}, wait=False)
        for node in (*train_nodes, INFRA):
            cluster.wait_node_ready(node)
            assert all(has_image(cluster, node, r) for r in refs.values()), f"images missing on {node}"
        _timed(timings, f"{len(train_nodes) + 1} nodes Ready with the images", t)
        t = time.monotonic()
        install_operator(cluster, refs["operator"], log_level=log_level)
        _timed(timings, "helm install -> operator pod Ready", t)
    except BaseException:
        cluster.stop()
        raise
    return Lane(cluster, refs, tuple(train_nodes), timings)


def create_namespace(cluster: RealCluster, name: str, labels: dict[str, str] | None = None) -> None:
    """A namespace with Pod Security "restricted" enforced (and warned), ready for pods."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "labels": {**RESTRICTED, **(labels or {})}}})
    cluster.wait_for_default_sa(name)


def install_operator(cluster: RealCluster, image: images.ImageRef, log_level: str = "DEBUG") -> None:
    """helm install the chart running `image` (pullPolicy Never: imported, not pulled) on the infra node."""
    support.shared_dir(cluster)
    create_namespace(cluster, support.OPERATOR_NS)
    scenarios.shared_claim(cluster, support.OPERATOR_NS)  # the operator's (read-only) view of the same storage
    repository, _, tag = image.ref.rpartition(":")
    # replicaCount 1: the lane checks one image's pod; HA is test_ha.py's
    support.helm_install(cluster, {
        "image.repository": repository, "image.tag": tag, "image.pullPolicy": "Never",
        "checkpointStorage.existingClaim": scenarios.CLAIM, "checkpointStorage.mountPath": support.MOUNT,
        "nodeSelector.role": INFRA, "logLevel": log_level, "replicaCount": "1"}, wait="180s", timeout=240)


def operator_exec(cluster: RealCluster, *cmd: str) -> Any:
    """Run a command in the operator's container (kubectl exec); returns the CompletedProcess."""
    pod = support.operator_pod(cluster)
    assert pod is not None, "no live operator pod"
    return cluster.kubectl("exec", "-n", support.OPERATOR_NS, pod.metadata.name, "-c", "operator", "--", *cmd,
                           check=False)


def lane_job(name: str, namespace: str, cpu: str = "1", **kw: Any) -> dict[str, Any]:
    """scenarios.example_job with the example's cpu/memory limits kept (the process substrate drops them).

    The node-loss timeout is NODE_LOSS_TIMEOUT, not the 4 s of the other substrates: these kubelets renew a
    4 s Lease each second on a 2-core host that also runs the cluster lane, and one once missed 4 s of
    renewals while its trainer imported torch (a spurious NodeLost that put a live node on the job's
    bad-node list and left a later kill below minReplicas)."""
    kw.setdefault("node_loss_timeout", NODE_LOSS_TIMEOUT)
    job = scenarios.example_job(name, namespace, **kw)
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {**WORKER_LIMITS, "cpu": cpu}}
    return job


@contextlib.contextmanager
def job_namespace(lane: Lane, name: str) -> Iterator[str]:
    """A restricted namespace for one test; afterwards partitions healed, killed nodes restored, pods gone."""
    cl = lane.cluster
    create_namespace(cl, name)
    try:
        yield name
    finally:
        cl.kubectl("delete", "namespace", name, "--wait=false", check=False)
        for node in cl.partitioned_nodes():
            cl.heal_node(node)
        for node, handle in cl.nodes.items():
            if handle.killed:
                cl.restore_node(node, timeout=90)
        wait_for(lambda: not [p for p in support.core(cl).list_pod_for_all_namespaces(
            label_selector=c.LABEL_JOB).items if p.metadata.namespace == name], 180, f"pods of {name} gone")


def safe_name(text: str) -> str:
    """A namespace name from a test name."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower())[:40].strip("-")
