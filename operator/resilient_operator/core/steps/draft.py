"""What every step shares: the frozen inputs of one reconcile, and the draft (status and plan) it builds.

`Inputs` is what was observed, judged once (node health, draining nodes) and never changed; only the
Kueue step narrows it, by returning a copy that carries the admission (`dataclasses.replace`). `Draft` is
the only thing a step writes: the status being edited, the plan, and the few edits several steps make
the same way (a condition, an event, a fence, a planned stop).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, partial
from typing import Any, cast

from resilient_contract.storage.listing import Listing
from resilient_operator import constants as c
from resilient_operator.core import (
    badnodes,
    capacity,
    drain,
    failures,
    fencing,
    goodput,
    growback,
    health,
    history,
    inplace,
    queueing,
)
from resilient_operator.core.conditions import set_condition
from resilient_operator.core.model import Job, NodeView, OperatorConfig, Placement, PodView, Progress, WorkloadView
from resilient_operator.core.plan import Event, EventType, Plan, Render
from resilient_operator.core.status import JobStatus, KueueStatus
from resilient_operator.core.timeutil import fmt

ACTIVE = (c.STARTING, c.RUNNING)
DEFAULT_CONFIG = OperatorConfig()
# Fenced pods still terminating: a level-triggered safety net for their deletion events (a watch can miss
# them across an API outage).
FENCE_RECHECK_SECONDS = 5.0

# What stops a running attempt (the watch step finds it, the stop step carries it out): a failure, nodes
# about to go, or capacity to grow back into.
Interruption = failures.Failure | list[drain.Notice] | growback.Grow


@dataclass(frozen=True)
class Inputs:
    """One reconcile's observations: the job, its pods (ours by owner uid), node health, storage, reports."""

    job: Job
    pods: Sequence[PodView]
    health: health.Health
    draining: Mapping[str, drain.Notice]
    listing: Listing
    now: datetime
    progress: Sequence[Progress] = ()
    config: OperatorConfig = DEFAULT_CONFIG
    workload: WorkloadView | None = None
    kueue_ready: bool = True
    gate: queueing.Gate | None = None  # set by the Kueue step for a Kueue-managed job (job.queue_name)
    # pod uid -> why the current attempt's in-place plan cannot reach its agent (the delivery's answer)
    undeliverable: Mapping[str, str] = field(default_factory=dict)
    ts: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ts", fmt(self.now))

    @classmethod
    def observe(cls, job: Job, pods: Sequence[PodView], node_map: Mapping[str, NodeView], listing: Listing,
                now: datetime, progress: Sequence[Progress] = (), config: OperatorConfig = DEFAULT_CONFIG,
                workload: WorkloadView | None = None, kueue_ready: bool = True,
                undeliverable: Mapping[str, str] | None = None) -> Inputs:
        """The inputs with the node health and the draining nodes judged once, for every step to share."""
        return cls(job, [p for p in pods if p.owner_uid == job.uid],  # ours: by uid, not label
                   health.assess(node_map, now, job.spec.node_loss_timeout),
                   drain.draining(node_map, config.drain_taints), listing, now, progress, config, workload,
                   kueue_ready, undeliverable=undeliverable or {})

    @cached_property
    def healthy_capacity(self) -> capacity.Capacity:
        """Workers per healthy node for this placement, counted once per pass (every step asks)."""
        return capacity.capacity(self.health, self.placement)

    @property
    def admitted(self) -> queueing.Gate | None:
        """Kueue's admission when the job is Kueue-managed and admitted; None otherwise."""
        return self.gate if self.gate and self.gate.action == queueing.RUN else None

    @property
    def placement(self) -> Placement:
        """Where workers may run: the template's placement, narrowed to the admitted flavor's nodes."""
        place = self.job.spec.placement
        if (gate := self.admitted) and gate.admission and gate.admission.node_selector:
            return Placement(place.requests, {**place.node_selector, **gate.admission.node_selector},
                             place.tolerations)
        return place

    def placed(self, pod: Render) -> Render:
        """A pod render with the admitted flavor's node labels and tolerations applied (Kueue-managed jobs)."""
        gate = self.admitted
        return partial(queueing.place, pod, gate.admission) if gate and gate.admission else pod

    @property
    def desired(self) -> int:
        """spec.replicas, or for an admitted Kueue-managed job the workers its admission still holds."""
        gate = self.admitted
        return min(self.job.spec.replicas, gate.held) if gate else self.job.spec.replicas


class Draft:
    """The status being edited (typed), and the plan that will write it once."""

    def __init__(self, inp: Inputs) -> None:
        self.status = cast(JobStatus, copy.deepcopy(dict(inp.job.status)))
        self.plan = Plan(status=self.raw)
        self._ts, self._generation, self._health = inp.ts, inp.job.generation, inp.health

    @property
    def raw(self) -> dict[str, Any]:
        """The same status, for the policies that edit it as a plain dict."""
        return cast(dict[str, Any], self.status)

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 0)

    @property
    def phase(self) -> str:
        return self.status.get("phase") or c.PENDING

    def set_phase(self, phase: str) -> None:
        self.status["phase"] = phase

    def event(self, etype: EventType, reason: str, message: str) -> None:
        self.plan.events.append(Event(etype, reason, message))

    def condition(self, ctype: str, value: bool, reason: str, message: str) -> bool:
        """Set a condition; True when it flipped (a transition, which is when steps emit their event)."""
        return set_condition(self.raw, ctype, value, reason, message, self._ts, self._generation)

    def fence(self, pods: Sequence[PodView]) -> None:
        out = fencing.fence(pods, self._health, set(self.plan.delete) | set(self.plan.force_delete))
        self.plan.force_delete += out.force
        self.plan.delete += out.delete

    def keep(self, inp: Inputs) -> list[PodView]:
        """The current attempt's pods that may carry on into the next one in place (none when it recreates)."""
        if inplace.recreate_reason(inp.job, inp.config):
            return []
        avoid = set(inp.health.lost_names) | set(inp.draining) | set(self.bad_nodes(inp.now))
        return inplace.keepable(self.current(inp), inp.health, avoid, inplace.job_hash(inp.job))

    def fence_all_but_kept(self, inp: Inputs, pods: Sequence[PodView]) -> None:
        """Fence the pods that cannot carry on in place (all of them when the job recreates)."""
        kept = {p.name for p in self.keep(inp)}
        self.fence([p for p in pods if p.name not in kept])

    def close_history(self, reason: str) -> None:
        history.close_entry(self.status, self.attempt, reason, self._ts)

    def count_planned(self) -> None:
        """One more restart the operator chose (resume, drain, grow back, re-admission): no budget spent."""
        self.status["restarts"]["planned"] = self.status["restarts"].get("planned", 0) + 1

    def current(self, inp: Inputs) -> list[PodView]:
        return [p for p in inp.pods if p.attempt == self.attempt]

    def bad_nodes(self, now: datetime) -> dict[str, datetime]:
        return badnodes.avoided(self.raw, now)

    def reached(self, inp: Inputs) -> int | None:
        """The furthest step the current attempt is known to have completed."""
        steps = [r.step for r in inp.progress if r.attempt == self.attempt]
        latest = (self.status.get("latestCheckpoint") or {}).get("step")
        if isinstance(latest, int):
            steps.append(latest)
        return max(steps) if steps else None

    def stop_planned(self, inp: Inputs, current: Sequence[PodView], reason: str, phase: str, condition: str,
                     message: str, *, in_place: bool = False) -> None:
        """A stop the job did not fail into (a drain, a requeue to grow): the lost time is planned, the attempt
        closes with `reason`, its pods are fenced gracefully (`in_place`: those that cannot carry on), and
        `condition` says what happens next."""
        goodput.open_recovery(self.raw, c.PLANNED, inp.now, inp.now, self.reached(inp))
        self.close_history(reason)
        if in_place:
            self.fence_all_but_kept(inp, current)
        else:
            self.fence(current)
        self.set_phase(phase)
        self.condition(c.COND_RUNNING, False, reason, message)
        self.condition(condition, True, reason, message)
        self.event("Normal", reason, message)

    def kueue(self, inp: Inputs) -> KueueStatus:
        """status.kueue, created on first use."""
        kq = self.status.setdefault("kueue", {})
        kq["queueName"] = inp.job.queue_name or ""
        kq.setdefault("generation", 1)
        return kq

    def target_replicas(self, inp: Inputs, *, within_admission: bool = True) -> tuple[int | None, int]:
        """The size the healthy capacity (and Kueue's admission, if any) allows (None below the minimum), and
        that capacity (draining nodes, even ones the template tolerates, hold nothing: they are about to go)."""
        per_node = inp.healthy_capacity.per_node
        skip = set(inp.draining) | set(self.bad_nodes(inp.now))
        cap = sum(n for name, n in per_node.items() if name not in skip)
        desired = inp.desired if within_admission else inp.job.spec.replicas
        return capacity.choose_replicas(desired, inp.job.spec.elastic, cap), cap

    def avoid(self, inp: Inputs) -> list[str]:
        """Nodes a new pod must not land on that the scheduler could still pick: lost ones (Kubernetes may
        still call them Ready), draining ones, this job's bad ones. A node the scheduler already skips for
        this template (cordoned, or the unreachable taint once the node-lifecycle controller adds it) needs
        no rule: each rule is copied into every pod, and a rack lost for good would otherwise put hundreds
        into every pod the operator creates, in its memory, the API server's and the scheduler's."""
        names = set(inp.health.lost_names) | set(inp.draining) | set(self.bad_nodes(inp.now))
        return sorted(n for n in names if capacity.placeable(inp.health.nodes.get(n), inp.placement))
