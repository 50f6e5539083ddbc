"""Builders for table tests: jobs defaulted by the CRD's own schema, pods and nodes as the API returns them."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from resilient_contract.storage import Listing, Verdict
from resilient_operator import constants as c
from resilient_operator import views
from resilient_operator.core import Job, NodeView, PodView
from resilient_operator.core.health import Health
from resilient_operator.core.health import assess as assess_health
from resilient_operator.core.inplace import template_hash
from resilient_operator.core.model import Placement
from resilient_operator.core.timeutil import fmt

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "resilienttrainingjobs.yaml"
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
CKPT_ROOT = "/ckpt/demo"


def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(obj: Any, node: dict[str, Any]) -> Any:
    """Structural-schema defaulting as the API server does it (enough for our schema)."""
    if isinstance(obj, dict) and node.get("type") == "object":
        for key, sub in (node.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = apply_defaults(obj[key], sub)
    return obj


def job_object(name: str = "demo", status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "replicas": 4,
        "elasticPolicy": {"minReplicas": 2},
        "template": {"spec": {"containers": [{"name": "trainer", "image": "trainer:1",
                                              "resources": {"limits": {c.GPU_RESOURCE: "8"}}}]}},
        "checkpoint": {"root": CKPT_ROOT},
        "nodeLossTimeoutSeconds": 20,
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    obj = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name, "namespace": "ml", "uid": "uid-1", "generation": 1},
        "spec": body,
        "status": status or {},
    }
    return apply_defaults(obj, schema())


def job(status: dict[str, Any] | None = None, **spec: Any) -> Job:
    return views.job_view(job_object(status=status, **spec))


def node(
    name: str,
    ready: str = "True",
    since: timedelta = timedelta(minutes=10),
    lease_age: float | None = 1.0,
    gpus: int = 8,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> NodeView:
    obj = {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", c.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": fmt(NOW - since)}],
        },
    }
    return views.node_view(obj, None if lease_age is None else NOW - timedelta(seconds=lease_age))


DEFAULT_TEMPLATE_HASH = template_hash(job_object()["spec"]["template"])


def nodes(*views: NodeView) -> dict[str, NodeView]:
    return {v.name: v for v in views}


def healthy(count: int) -> dict[str, NodeView]:
    return nodes(*(node(f"n{i}") for i in range(count)))


def pod(
    attempt: int,
    rank: int,
    node_name: str | None = None,
    phase: str = "Running",
    deleting: bool = False,
    exit_code: int | None = None,
    finished_ago: float | None = None,
    message: str = "",
    reason: str = "",
    disruption: str | None = None,
    waiting: str | None = None,
    replicas: int = 4,
    resume: tuple[str, int] | None = None,
    owner_uid: str | None = "uid-1",
    labels: dict[str, str] | None = None,
    name: str | None = None,
    template: str | None = "default",
) -> PodView:
    """A pod as the API returns it; `name` defaults to the attempt's own name, `template` is the hash annotation
    ("default": the default job's template, None: absent)."""
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if reason:
        status["reason"] = reason
    if disruption:
        status["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": "trainer", "state": {"terminated": {"exitCode": exit_code, "message": message}}}
        ]
        if finished_ago is not None:
            finished = fmt(NOW - timedelta(seconds=finished_ago))
            status["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = finished
    elif waiting:
        status["containerStatuses"] = [{"name": "trainer", "state": {"waiting": {"reason": waiting}}}]
    annotations = {c.ANNOTATION_REPLICAS: str(replicas)}
    if template is not None:
        annotations[c.ANNOTATION_TEMPLATE_HASH] = DEFAULT_TEMPLATE_HASH if template == "default" else template
    if resume:
        annotations[c.ANNOTATION_RESUME_FROM], annotations[c.ANNOTATION_RESUME_STEP] = resume[0], str(resume[1])
    name = name or f"demo-a{attempt}-{rank}"
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{name}",
        "labels": labels or {c.LABEL_JOB: "demo", c.LABEL_ATTEMPT: str(attempt), c.LABEL_RANK: str(rank)},
        "annotations": annotations,
    }
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "demo", "uid": owner_uid,
                                    "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = fmt(NOW)
    if phase == "Running":
        status["podIP"] = f"10.1.{attempt}.{rank}"
    return views.pod_view({"metadata": meta, "spec": {"nodeName": node_name}, "status": status})


def gang(attempt: int, replicas: int, phase: str = "Running", **overrides: Any) -> list[PodView]:
    """One pod per rank on nodes n0.. ; `overrides` maps rank -> dict of pod() keyword changes."""
    out = []
    for rank in range(replicas):
        kwargs: dict[str, Any] = {"node_name": f"n{rank}", "phase": phase, "replicas": replicas}
        kwargs.update(overrides.get(f"r{rank}", {}))
        out.append(pod(attempt, rank, **kwargs))
    return out


def listing(*steps: int, skipped: tuple[tuple[int, str], ...] = (), error: str | None = None,
            missing: bool = False) -> Listing:
    latest = Verdict(max(steps), f"{CKPT_ROOT}/step-{max(steps):010d}", True) if steps else None
    skips = tuple(Verdict(s, f"{CKPT_ROOT}/step-{s:010d}", False, why) for s, why in skipped)
    return Listing(CKPT_ROOT, latest, skips, error, missing)


def running_status(attempt: int = 1, replicas: int = 4, **extra: Any) -> dict[str, Any]:
    status = {
        "phase": c.RUNNING,
        "attempt": attempt,
        "replicas": replicas,
        "restarts": {"infrastructure": 0, "application": 0, "planned": 0},
        "history": [{"attempt": attempt, "replicas": replicas, "startTime": fmt(NOW - timedelta(minutes=5))}],
    }
    status.update(extra)
    return status


TIMEOUT = 20.0  # spec.nodeLossTimeoutSeconds for the policy tables


def assess(*views_: NodeView) -> Health:
    """The nodes as one reconcile judges them, at NOW."""
    return assess_health(nodes(*views_), NOW, TIMEOUT)


def placement(requests: dict[str, Any] | None = None, **spec: Any) -> Placement:
    """A template's placement, parsed the way the shell parses it."""
    container: dict[str, Any] = {"name": "t"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    return views.placement({"spec": {"containers": [container], **spec}})
