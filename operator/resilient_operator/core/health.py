"""One view of node health per reconcile: which nodes are lost and why, and which have gone quiet.

A node is lost when it is deleted, when its Lease has not been renewed for the job's node-loss
timeout, or when it has been NotReady/Unknown for that long (the unreachable/not-ready taints follow
from that condition, so the condition's transition time is the clock). A node that flaps back within
the timeout is not lost. Lease staleness is noticed by time passing, not by an event, so
`next_loss_check` tells the shell when to look again.

`assess` runs once at the start of a reconcile; every policy reads the `Health` it returns instead of
threading `(now, timeout)` through its own calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from resilient_operator import constants as c
from resilient_operator.core.model import NodeView

# When more than this share of all nodes looks lost at once, the likelier story is a control-plane or
# network outage (leases could not be renewed), not dead machines: kube-controller-manager's
# --unhealthy-zone-threshold makes the same call and stops evicting. We stop restarting.
DISRUPTION_FRACTION = 0.55


@dataclass(frozen=True)
class NodeLoss:
    node: str
    reason: str
    message: str


def node_loss(name: str, node: NodeView | None, now: datetime, timeout: float) -> NodeLoss | None:
    """Why a node counts as lost, or None while it is healthy enough."""
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


@dataclass(frozen=True)
class Health:
    """The nodes as one reconcile judges them, at one instant, against one job's timeout."""

    nodes: Mapping[str, NodeView]
    now: datetime
    timeout: float
    lost: Mapping[str, NodeLoss]  # every existing node that counts as lost, whether or not Kubernetes noticed

    def loss(self, name: str) -> NodeLoss | None:
        """Why the node a worker runs on is lost (a node that no longer exists is), or None."""
        if name not in self.nodes:
            return NodeLoss(name, c.REASON_NODE_DELETED, f"node {name} was deleted")
        return self.lost.get(name)

    def losses(self, names: Iterable[str]) -> dict[str, NodeLoss]:
        out = {}
        for name in sorted(set(names)):
            if loss := self.loss(name):
                out[name] = loss
        return out

    @property
    def lost_names(self) -> list[str]:
        return sorted(self.lost)

    @property
    def disrupted(self) -> bool:
        """Most nodes look lost at once: an outage of the control plane or the network, not of machines."""
        return bool(self.nodes) and len(self.lost) / len(self.nodes) > DISRUPTION_FRACTION

    @property
    def disruption_message(self) -> str:
        return (f"{len(self.lost)} of {len(self.nodes)} nodes look lost at once, as after a control-plane or "
                "network outage; not restarting until node heartbeats resume")

    def healthy(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and not node.unschedulable and node.ready == "True" and name not in self.lost

    def quiet_for(self, name: str) -> float | None:
        """Seconds until a healthy node that has not renewed its Lease for half the timeout comes due.

        Nodes that die together (a rack switch, a power feed) stop renewing at once, but each was last
        renewed at its own moment, so their losses come due up to one renew interval apart (10 s for a
        kubelet). When the first is due, the others have been quiet for at least timeout - renew interval,
        which is half the timeout or more whenever the timeout allows two renewals (the default 20 s does)."""
        node = self.nodes.get(name)
        if node is None or node.lease_renewed is None or not self.healthy(name):
            return None
        limit = timedelta(seconds=self.timeout)
        if self.now - node.lease_renewed < limit / 2:
            return None
        return (node.lease_renewed + limit - self.now).total_seconds()

    def next_loss_check(self, name: str) -> float | None:
        """Seconds until this healthy node would count as lost if nothing changes (its lease or Ready)."""
        node = self.nodes.get(name)
        if node is None:
            return None
        limit = timedelta(seconds=self.timeout)
        deadlines = []
        if node.lease_renewed is not None:
            deadlines.append(node.lease_renewed + limit)
        if node.ready != "True" and node.ready_since is not None:
            deadlines.append(node.ready_since + limit)
        future = [(d - self.now).total_seconds() for d in deadlines if d > self.now]
        return min(future) if future else None


def assess(nodes: Mapping[str, NodeView], now: datetime, timeout: float) -> Health:
    lost = {n: loss for n, view in nodes.items() if (loss := node_loss(n, view, now, timeout))}
    return Health(nodes, now, timeout, lost)
