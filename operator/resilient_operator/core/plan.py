"""What the core asks the shell to do; the shell applies it in a fixed, crash-safe order.

Order: delete and force-delete pods (fencing), write status once, create objects (idempotently:
AlreadyExists is success), release PodDisruptionBudgets, then emit events (only after the status write
succeeded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from resilient_contract.plan import Plan as AgentPlan

EventType = Literal["Normal", "Warning"]  # Kubernetes' event types

# A manifest rendered when the shell is about to create it, not before: a gang of N pods never sits in
# memory as N deep copies of the template at once.
Render = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class Delivery:
    """Hand a kept pod the next attempt's plan (restartStrategy InPlace). Once its agent acknowledges, the shell
    merge-patches these labels and annotations onto the pod, which makes it a member of that attempt with that
    rank (PodView.attempt and .rank come from the labels); until then the core still sees it in the old one."""

    pod: str  # the pod's name (its namespace is the job's)
    address: str  # its pod IP
    port: int  # the agent's port
    plan: AgentPlan
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass
class Plan:
    status: dict[str, Any]
    create: list[Render] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    force_delete: list[str] = field(default_factory=list)
    release: list[str] = field(default_factory=list)  # PodDisruptionBudgets to delete (404 is fine)
    events: list[Event] = field(default_factory=list)
    deliver: list[Delivery] = field(default_factory=list)  # plans for kept pods' agents (never awaited)
    requeue_after: float | None = None
    # Kueue (core/queueing.py): the Workload to create, its status fields to set (guarded by the
    # resourceVersion observed), or the name of one to delete (replaced by a new admission).
    workload_create: Render | None = None
    workload_status: dict[str, Any] | None = None
    workload_delete: str | None = None
    workload_ref: tuple[str, str] | None = None  # (name, resourceVersion) of the observed Workload

    def manifests(self) -> Iterator[dict[str, Any]]:
        """Render the objects to create, one at a time, in order."""
        for render in self.create:
            yield render()

    def look_again(self, seconds: float | None) -> None:
        """Keep the earliest wake-up any policy asked for."""
        if seconds is None:
            return
        seconds = max(seconds, 0.1)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)
