"""When the operator last saw each node's Lease renewed, by its own clock (node clocks are not trusted).

A node writes `renewTime` with its own clock, which may run minutes behind or ahead. Like
kube-controller-manager's node lifecycle controller (its per-node probe timestamps), we record the
operator's time at which a *change* of `renewTime` was observed, and judge staleness from that alone.
Any change counts, not only a later value: a node whose clock steps back is still alive. The first
observation of a node counts as a renewal, so after an operator start every node has a full timeout
of grace, and so after any time the operator could not watch Leases (an API-server outage): what it
could not see is no evidence against a node. A re-list that returns an unchanged `renewTime` is not a
renewal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class LeaseProbes:
    """Per node: the last `renewTime` seen and the operator time it was first seen."""

    _seen: dict[str, tuple[str | None, datetime]] = field(default_factory=dict)

    def observe(self, node: str, renew_time: str | None, now: datetime) -> bool:
        """Record one sighting of the node's Lease; True when it counts as a renewal."""
        last = self._seen.get(node)
        if last is not None and last[0] == renew_time:
            return False
        self._seen[node] = (renew_time, now)
        return True

    def regrace(self, now: datetime) -> None:
        """The operator was blind (its Lease watch broke) and sees again: every node starts a full timeout."""
        self._seen = {node: (renew_time, now) for node, (renew_time, _) in self._seen.items()}

    def forget(self, node: str) -> None:
        """The Lease is gone: the next one the node creates starts afresh."""
        self._seen.pop(node, None)

    def renewed(self, node: str) -> datetime | None:
        """Operator time of the last observed renewal, or None if no Lease was ever seen."""
        seen = self._seen.get(node)
        return seen[1] if seen else None
