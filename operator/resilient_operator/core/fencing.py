"""Fencing a broken attempt, and the bounded per-attempt history in status.

Fencing deletes every pod of the attempt; pods on lost nodes go with grace period 0, since no kubelet
will ever confirm their end and the next attempt waits until no pod of this one is left.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_operator import constants as c
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


def open_entry(status: MutableMapping[str, Any], attempt: int, replicas: int, resumed_step: int | None,
               ts: str) -> None:
    history: list[dict[str, Any]] = status.setdefault("history", [])
    if history and history[-1].get("attempt") == attempt:
        return
    entry: dict[str, Any] = {"attempt": attempt, "replicas": replicas, "startTime": ts}
    if resumed_step is not None:
        entry["resumedFromStep"] = resumed_step
    history.append(entry)
    del history[: max(0, len(history) - c.HISTORY_LIMIT)]


def close_entry(status: Mapping[str, Any], attempt: int, reason: str, ts: str) -> None:
    history = status.get("history") or []
    if history and history[-1].get("attempt") == attempt and "endTime" not in history[-1]:
        history[-1]["endTime"] = ts
        history[-1]["endReason"] = reason


def record_nodes(status: Mapping[str, Any], attempt: int, pods: Sequence[PodView]) -> None:
    history = status.get("history") or []
    if history and history[-1].get("attempt") == attempt:
        history[-1]["nodes"] = sorted({p.node_name for p in pods if p.node_name})
