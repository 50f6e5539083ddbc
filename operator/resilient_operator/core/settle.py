"""Wait, bounded, when full capacity is seconds away, instead of (re)starting smaller and growing back later.

A node that comes back is Ready before the node-lifecycle controller removes its `unreachable`/`not-ready`
taint (it runs every node-monitor-period, 5 s by default): a launch in that moment sees one node short,
starts at 3 of 4, and pays a planned restart to grow back at the next checkpoint. So while a node that
turned Ready less than `bound` seconds ago still carries only those taints, and counting it would give a
larger world size, the launch waits for it, up to `bound` seconds from when the wait began.

Pods of a finished job still terminating never shrink a start here: capacity is counted from allocatable,
not from what other pods hold, so the new gang starts at full size and the scheduler keeps its pods
Pending until the old ones are gone (the reconcile table has a row for it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from resilient_operator.core import capacity
from resilient_operator.core.health import Health
from resilient_operator.core.model import ElasticPolicy, NodeView, Placement

# Taints the node-lifecycle controller sets from the Ready condition and removes once it is True again.
LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})


def recovering(node: NodeView, now: datetime, bound: float) -> bool:
    """Ready again for less than `bound` seconds, held back only by a lifecycle taint about to go."""
    if node.ready != "True" or node.unschedulable or node.ready_since is None:
        return False
    if now - node.ready_since >= timedelta(seconds=bound):
        return False  # the taint should have gone long ago: something else keeps it
    keys = {t.key for t in node.taints if t.effect in ("NoSchedule", "NoExecute")}
    return bool(keys) and keys <= LIFECYCLE_TAINTS


@dataclass(frozen=True)
class Wait:
    seconds: float  # look again after this long
    message: str


def decide(health: Health, placement: Placement, desired: int, policy: ElasticPolicy, now: datetime,
           bound: float, waiting_since: datetime | None, cap: capacity.Capacity | None = None) -> Wait | None:
    """A wait when nodes about to be usable would make the world size larger; None to launch now. `cap`: the
    healthy capacity for `placement`, when the caller has counted it already."""
    cap = cap if cap is not None else capacity.capacity(health, placement)
    now_size = capacity.choose_replicas(desired, policy, cap.total) or 0
    if now_size >= min(desired, policy.max_replicas):
        return None
    back = [n for n, v in sorted(health.nodes.items())
            if n not in cap.per_node and n not in health.lost and recovering(v, now, bound)]
    extra = sum(capacity.slots(_untainted(health.nodes[n]), placement) for n in back)
    if not back or (capacity.choose_replicas(desired, policy, cap.total + extra) or 0) <= now_size:
        return None
    started = waiting_since or now
    left = bound - (now - started).total_seconds()
    if left <= 0:
        return None
    full = capacity.choose_replicas(desired, policy, cap.total + extra)
    return Wait(min(left, 1.0), f"node(s) {', '.join(back)} are Ready again and their lifecycle taint is about "
                f"to go; waiting up to {bound:g}s to start {full} workers instead of {now_size}")


def _untainted(node: NodeView) -> NodeView:
    return replace(node, taints=tuple(t for t in node.taints if t.key not in LIFECYCLE_TAINTS))
