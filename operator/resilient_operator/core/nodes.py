"""When a node counts as lost, and how many workers the healthy nodes can hold.

A node is lost when it is deleted, when its Lease has not been renewed for the job's node-loss
timeout, or when it has been NotReady/Unknown for that long (the unreachable/not-ready taints follow
from that condition, so the condition's transition time is the clock). A
node that flaps back within the timeout is not lost. Lease staleness is noticed by time passing,
not by an event, so `next_loss_check` tells the shell when to look again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from resilient_operator import constants as c
from resilient_operator.core.model import NodeView


@dataclass(frozen=True)
class NodeLoss:
    node: str
    reason: str
    message: str


def node_loss(name: str, node: NodeView | None, now: datetime, timeout: float) -> NodeLoss | None:
    """Why the node a worker runs on counts as lost, or None while it is healthy enough."""
    if node is None:
        return NodeLoss(name, c.REASON_NODE_DELETED, f"node {name} was deleted")
    limit = timedelta(seconds=timeout)
    if node.lease_renewed is not None and now - node.lease_renewed >= limit:
        age = (now - node.lease_renewed).total_seconds()
        return NodeLoss(name, c.REASON_NODE_LEASE_STALE, f"node {name} has not renewed its lease for {age:.0f}s")
    if node.ready != "True":
        since = node.ready_since
        if since is None or now - since >= limit:
            reason = c.REASON_NODE_UNREACHABLE if node.ready == "Unknown" else c.REASON_NODE_NOT_READY
            return NodeLoss(name, reason, f"node {name} is Ready={node.ready} since {since}")
    return None


def next_loss_check(node: NodeView, now: datetime, timeout: float) -> float | None:
    """Seconds until this healthy node would count as lost if nothing changes (its lease or Ready)."""
    limit = timedelta(seconds=timeout)
    deadlines = []
    if node.lease_renewed is not None:
        deadlines.append(node.lease_renewed + limit)
    if node.ready != "True" and node.ready_since is not None:
        deadlines.append(node.ready_since + limit)
    future = [(d - now).total_seconds() for d in deadlines if d > now]
    return min(future) if future else None


_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity ("500m", "8Gi", "2") as a number."""
    match = _QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a resource quantity: {value!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def pod_requests(template: Mapping[str, Any]) -> dict[str, float]:
    """Summed container requests (limits stand in for missing requests, as the API server defaults)."""
    total: dict[str, float] = {}
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in merged.items():
            total[name] = total.get(name, 0.0) + quantity(value)
    return total


def _tolerated(taint_key: str, taint_effect: str, tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("operator") == "Exists" and not tol.get("key"):
            return True
        if tol.get("key") == taint_key and (not tol.get("effect") or tol.get("effect") == taint_effect):
            return True
    return False


def slots(node: NodeView, template: Mapping[str, Any]) -> int:
    """How many workers this node can hold. Without requests a worker is counted one per node."""
    spec = template.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return 0
    tolerations = spec.get("tolerations") or []
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not _tolerated(taint.key, taint.effect, tolerations):
            return 0
    requests = {k: v for k, v in pod_requests(template).items() if v > 0}
    if not requests:
        return 1
    fits = []
    for name, amount in requests.items():
        have = quantity(node.allocatable.get(name, "0"))
        fits.append(math.floor(have / amount + 1e-9))
    return max(0, min(fits))


def quiet(
    nodes: Mapping[str, NodeView], template: Mapping[str, Any], now: datetime, timeout: float
) -> dict[str, float]:
    """Nodes that count as capacity but have not renewed their Lease for half the node-loss timeout, with
    the seconds until they would count as lost.

    Nodes that die together (a rack switch, a power feed) stop renewing at once, but each was last renewed
    at its own moment, so their losses come due up to one renew interval apart (10 s for a kubelet). When
    the first is due, the others have been quiet for at least timeout - renew interval, which is half the
    timeout or more whenever the timeout allows two renewals (the default 20 s does). Waiting for the quiet
    ones to either renew or come due lets one restart avoid them all, instead of a relaunch onto a node
    that dies with the others and a second restart; the wait is bounded by half the timeout."""
    limit = timedelta(seconds=timeout)
    out: dict[str, float] = {}
    for name in capacity(nodes, template, now, timeout)[1]:
        renewed = nodes[name].lease_renewed
        if renewed is not None and now - renewed >= limit / 2:
            out[name] = (renewed + limit - now).total_seconds()
    return out


def capacity(
    nodes: Mapping[str, NodeView], template: Mapping[str, Any], now: datetime, timeout: float
) -> tuple[int, list[str]]:
    """Workers the healthy, schedulable nodes can hold, and the names of the nodes counted."""
    total, used = 0, []
    for name, node in sorted(nodes.items()):
        if node.unschedulable or node.ready != "True" or node_loss(name, node, now, timeout):
            continue
        n = slots(node, template)
        if n:
            total += n
            used.append(name)
    return total, used
