"""Fencing a broken attempt: which of its pods to delete, and how.

Fencing deletes every pod of the attempt; pods on lost nodes go with grace period 0, since no kubelet
will ever confirm their end. The next attempt waits until no gracefully deleted pod is left; force-deleted
ones are gone once the delete is answered, so the launch can follow in the same plan (steps/launch.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from resilient_operator.core.health import Health
from resilient_operator.core.model import PodView


@dataclass
class Deletions:
    delete: list[str] = field(default_factory=list)
    force: list[str] = field(default_factory=list)


def fence(pods: Sequence[PodView], health: Health, planned: Collection[str] = ()) -> Deletions:
    """Deletions that stop these pods (those already planned, or already deleting off lost nodes, skipped)."""
    lost = health.losses(p.node_name for p in pods if p.node_name)
    out = Deletions()
    for pod in pods:
        if pod.name in planned:
            continue
        if pod.node_name in lost:
            out.force.append(pod.name)
        elif not pod.deleting:
            out.delete.append(pod.name)
    return out
