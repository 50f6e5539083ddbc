"""How many workers the healthy nodes hold, and the world size a (re)start uses.

Quantities arrive parsed (the shell uses the kubernetes client's parser at the boundary), so this is
arithmetic on Decimals: exact, for every suffix the API accepts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from resilient_operator.core.health import Health
from resilient_operator.core.model import ElasticPolicy, NodeView, Placement, Toleration

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def _tolerated(taint_key: str, taint_effect: str, tolerations: Iterable[Toleration]) -> bool:
    for tol in tolerations:
        if tol.operator == "Exists" and not tol.key:
            return True
        if tol.key == taint_key and (not tol.effect or tol.effect == taint_effect):
            return True
    return False


def slots(node: NodeView, placement: Placement) -> int:
    """How many workers this node can hold. Without requests a worker is counted one per node."""
    if any(node.labels.get(k) != v for k, v in placement.node_selector.items()):
        return 0
    for taint in node.taints:
        tolerated = _tolerated(taint.key, taint.effect, placement.tolerations)
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerated:
            return 0
    requests = {k: v for k, v in placement.requests.items() if v > 0}
    if not requests:
        return 1
    fits = [math.floor(node.allocatable.get(name, Decimal(0)) / amount) for name, amount in requests.items()]
    return max(0, min(fits))


@dataclass(frozen=True)
class Capacity:
    """Workers per healthy, schedulable node that can hold at least one."""

    per_node: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.per_node.values())


def placeable(node: NodeView | None, placement: Placement) -> bool:
    """The scheduler could put one of these workers on this node (it exists, is not cordoned, matches the
    selector, tolerates its NoSchedule/NoExecute taints and has room), whether or not it is healthy."""
    if node is None or slots(node, placement) == 0:
        return False
    # a cordon is the scheduler's taint node.kubernetes.io/unschedulable:NoSchedule, which a pod may tolerate
    return not node.unschedulable or _tolerated(UNSCHEDULABLE_TAINT, "NoSchedule", placement.tolerations)


def capacity(health: Health, placement: Placement) -> Capacity:
    per_node = {}
    for name, node in sorted(health.nodes.items()):
        if health.healthy(name) and (n := slots(node, placement)):
            per_node[name] = n
    return Capacity(per_node)


def quiet(health: Health, cap: Capacity) -> dict[str, float]:
    """Nodes counted as capacity that went quiet (see `Health.quiet_for`), with seconds until they come due."""
    return {name: due for name in cap.per_node if (due := health.quiet_for(name)) is not None}


def choose_replicas(desired: int, policy: ElasticPolicy, capacity: int) -> int | None:
    """Largest allowed worker count <= min(desired, max, capacity); None if below the minimum."""
    upper = min(desired, policy.max_replicas, capacity)
    rounded = upper - upper % policy.multiple_of
    if rounded < policy.min_replicas or rounded <= 0:
        return None
    return rounded


def below_minimum(policy: ElasticPolicy, capacity: int) -> str:
    """Why a job cannot launch: the healthy nodes hold fewer workers than its minimum."""
    return (f"need at least {policy.min_replicas} workers (a multiple of {policy.multiple_of}) but the healthy "
            f"schedulable nodes hold {capacity}; waiting for nodes to join or recover")
