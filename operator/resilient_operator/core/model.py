"""Typed, read-only views of what the shell observed: the job, its pods, the nodes.

Parsing from the API's dicts happens here, once, so the policies below read plain attributes.
Defaults come from the CRD (the API server applies them); the parsers require defaulted fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from resilient_operator import constants as c
from resilient_operator.core import timeutil


@dataclass(frozen=True)
class ElasticPolicy:
    min_replicas: int
    max_replicas: int
    multiple_of: int
    grow_back: bool


@dataclass(frozen=True)
class FailurePolicy:
    max_infrastructure_restarts: int
    max_application_restarts: int
    backoff_seconds: int
    max_backoff_seconds: int


@dataclass(frozen=True)
class JobSpec:
    replicas: int
    nproc_per_node: int
    elastic: ElasticPolicy
    template: Mapping[str, Any]
    checkpoint_root: str
    keep: int
    failure: FailurePolicy
    node_loss_timeout: float
    master_port: int
    suspend: bool

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> JobSpec:
        ep = spec["elasticPolicy"]
        fp = spec["failurePolicy"]
        replicas = int(spec["replicas"])
        return cls(
            replicas=replicas,
            nproc_per_node=int(spec["nprocPerNode"]),
            elastic=ElasticPolicy(
                min_replicas=int(ep["minReplicas"]),
                max_replicas=int(ep.get("maxReplicas", replicas)),
                multiple_of=int(ep["replicasMultipleOf"]),
                grow_back=bool(ep["growBack"]),
            ),
            template=spec["template"],
            checkpoint_root=spec["checkpoint"]["root"],
            keep=int(spec["checkpoint"]["keep"]),
            failure=FailurePolicy(
                max_infrastructure_restarts=int(fp["maxInfrastructureRestarts"]),
                max_application_restarts=int(fp["maxApplicationRestarts"]),
                backoff_seconds=int(fp["applicationBackoffSeconds"]),
                max_backoff_seconds=int(fp["maxApplicationBackoffSeconds"]),
            ),
            node_loss_timeout=float(spec["nodeLossTimeoutSeconds"]),
            master_port=int(spec["masterPort"]),
            suspend=bool(spec["suspend"]),
        )


@dataclass(frozen=True)
class Job:
    """The job object as observed: identity, parsed spec, and the raw status the core will rewrite."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: JobSpec
    status: Mapping[str, Any]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Job:
        meta = obj["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", "default"),
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 1)),
            spec=JobSpec.from_dict(obj["spec"]),
            status=dict(obj.get("status") or {}),
        )


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str
    message: str
    finished_at: datetime | None = None


@dataclass(frozen=True)
class PodView:
    """One pod of the job, reduced to the facts failure detection needs."""

    name: str
    attempt: int
    rank: int
    node_name: str | None
    phase: str
    deleting: bool
    reason: str = ""  # status.reason, e.g. Evicted
    message: str = ""
    disruption: str | None = None  # reason of a True DisruptionTarget condition
    terminations: tuple[Termination, ...] = ()
    waiting_reasons: tuple[str, ...] = ()
    ready: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PodView:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        status = obj.get("status") or {}
        disruption = None
        ready = False
        for cond in status.get("conditions") or []:
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                disruption = cond.get("reason") or c.REASON_DISRUPTED
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready = True
        terms: list[Termination] = []
        waiting: list[str] = []
        for cs in status.get("containerStatuses") or []:
            state = cs.get("state") or {}
            if "terminated" in state:
                t = state["terminated"] or {}
                terms.append(
                    Termination(int(t.get("exitCode", 0)), t.get("reason") or "", t.get("message") or "",
                                timeutil.parse(t.get("finishedAt")))
                )
            elif "waiting" in state:
                waiting.append((state["waiting"] or {}).get("reason") or "")
        return cls(
            name=meta["name"],
            attempt=int(labels.get(c.LABEL_ATTEMPT, "0")),
            rank=int(labels.get(c.LABEL_RANK, "-1")),
            node_name=(obj.get("spec") or {}).get("nodeName"),
            phase=status.get("phase") or "Pending",
            deleting=bool(meta.get("deletionTimestamp")),
            reason=status.get("reason") or "",
            message=status.get("message") or "",
            disruption=disruption,
            terminations=tuple(terms),
            waiting_reasons=tuple(waiting),
            ready=ready,
            annotations=dict(meta.get("annotations") or {}),
        )


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True)
class NodeView:
    """A node and its heartbeat, as the scheduler and node-lifecycle controller would see it."""

    name: str
    ready: str  # "True" | "False" | "Unknown"
    ready_since: datetime | None
    taints: tuple[Taint, ...]
    unschedulable: bool
    lease_renewed: datetime | None
    allocatable: Mapping[str, str]
    labels: Mapping[str, str]

    @classmethod
    def from_objects(cls, node: Mapping[str, Any], lease: Mapping[str, Any] | None) -> NodeView:
        meta = node["metadata"]
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        ready, since = "Unknown", None
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Ready":
                ready = cond.get("status") or "Unknown"
                since = timeutil.parse(cond.get("lastTransitionTime"))
        renewed = None
        if lease:
            renewed = timeutil.parse((lease.get("spec") or {}).get("renewTime"))
        return cls(
            name=meta["name"],
            ready=ready,
            ready_since=since,
            taints=tuple(
                Taint(t["key"], t.get("effect", ""), t.get("value") or "") for t in spec.get("taints") or []
            ),
            unschedulable=bool(spec.get("unschedulable")),
            lease_renewed=renewed,
            allocatable=dict(status.get("allocatable") or {}),
            labels=dict(meta.get("labels") or {}),
        )
