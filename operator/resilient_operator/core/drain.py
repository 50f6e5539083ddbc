"""Drains and preemption notices: move the gang off a node before it goes, at the step it is at.

A node that hosts workers and is cordoned (`kubectl cordon`/`drain`, which also makes the node-lifecycle
controller add `node.kubernetes.io/unschedulable`), or carries one of the configured notice taints (any
effect), is about to go with warning. The operator then restarts on purpose: it deletes the attempt's pods
gracefully, the trainer's SIGTERM path saves a checkpoint at the current step (RTJ_PREEMPTED), and the
next attempt starts from it without the draining nodes (smaller if need be). Counted in
`restarts.planned`, never against the infrastructure or application budgets: nothing failed.

`kubectl drain` evicts pod by pod, which for a gang means one restart per rank. Each attempt therefore has
a PodDisruptionBudget (maxUnavailable 0) the operator owns: evictions of its pods are refused (drain
retries), the operator stops the whole gang itself with deletes (which a PDB does not block), drain then
finds the node empty and completes, and the PDB is released when the next attempt starts or the job ends.

In place (restartStrategy InPlace), only the pods on draining nodes are deleted. Their SIGTERM stops the
whole gang all the same (the preemption flag rides every step's all-reduce, so every rank saves and stops),
and the kept pods' agents wait for their plans. The launch cannot wait for the kept pods to go, as the
recreate path does, so `save_wait` makes it wait for that checkpoint instead, within the pod's grace period.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from resilient_operator import constants as c
from resilient_operator.core.model import NodeView, PodView

DEFAULT_TAINTS = c.DEFAULT_DRAIN_TAINTS


@dataclass(frozen=True)
class Notice:
    node: str
    why: str  # "cordoned" or "tainted <key>"


def notice(node: NodeView, taints: Collection[str]) -> Notice | None:
    """Why this node is about to go with warning, or None."""
    if node.unschedulable:
        return Notice(node.name, "cordoned")
    for taint in node.taints:
        if taint.key in taints:
            return Notice(node.name, f"tainted {taint.key}")
    return None


def draining(nodes: Mapping[str, NodeView], taints: Collection[str]) -> dict[str, Notice]:
    """Every node that is about to go with warning (the relaunch avoids them all)."""
    return {name: n for name, view in sorted(nodes.items()) if (n := notice(view, taints))}


def affected(pods: Sequence[PodView], notices: Mapping[str, Notice], lost: Collection[str]) -> list[Notice]:
    """The notices on nodes that host a live pod of the attempt (a lost node is a failure, not a drain)."""
    hosts = {p.node_name for p in pods if p.node_name and p.phase in ("Pending", "Running") and not p.deleting}
    return [notices[n] for n in sorted(hosts) if n in notices and n not in lost]


def save_wait(reached: int | None, latest: int | None, since: datetime | None, now: datetime,
              grace_seconds: float) -> float:
    """Seconds the in-place launch after a drain still waits for the gang's SIGTERM checkpoint (0: go now).

    `reached`: the step the gang had reached when the drain stopped it; `latest`: the newest complete
    checkpoint's step. The checkpoint is there once `latest >= reached`. The wait ends anyway after the pods'
    grace period (a save that takes longer is cut by the kubelet's SIGKILL in the drained pod too): the
    launch then resumes from the newest checkpoint there is, losing steps, never correctness."""
    if reached is None or since is None or (latest is not None and latest >= reached):
        return 0.0
    return max(0.0, grace_seconds - (now - since).total_seconds())


def pdb_name(job: str, attempt: int) -> str:
    return f"{job}-a{attempt}"
