"""Kueue: when a job labelled with a LocalQueue may run, at what size, and what its Workload must say.

The operator plays the part Kueue's jobframework plays for built-in jobs (pkg/controller/jobframework,
reconciler.go), for a Workload it creates and owns (a controller ownerReference):

    no Workload              -> create it: one pod set "workers", count = spec.replicas,
                                minCount = the elastic minimum (partial admission); hold the job
    not admitted             -> hold: start nothing, stop what runs (phase Queued)
    admitted (count A)       -> run at most A - reclaimable workers, with the flavor's node labels
                                and tolerations; PodsReady follows the gang
    running R < A            -> report reclaimablePods = A - R (Kueue frees that quota; it never grows
                                back while admitted, so the held size only shrinks)
    Evicted=True + quota     -> stop the gang gracefully (SIGTERM: the trainer checkpoints), and once
                                no pod is left clear the admission (QuotaReserved=False, Requeued) so
                                Kueue requeues it; no restart budget is spent
    grow past what is held   -> at a checkpoint, stop and replace the Workload by a new one asking
                                spec.replicas again (a new admission; see README "Queueing with Kueue")
    job Succeeded/Failed     -> Finished=True on the Workload (Kueue releases the quota)

Pure: the shell observes the Workload and the flavors (views.py) and applies what is returned.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from resilient_operator import constants as c
from resilient_operator.core.conditions import set_condition
from resilient_operator.core.model import Admission, Job, WorkloadView

# Kueue's condition types and the reasons its jobframework writes (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED, ADMITTED, EVICTED, FINISHED = "QuotaReserved", "Admitted", "Evicted", "Finished"
REQUEUED, PODS_READY = "Requeued", "PodsReady"
# Evictions after which Kueue's own jobs are requeued at once (Requeued=True); others wait for Kueue.
REQUEUE_AT_ONCE = frozenset({"Preempted", "NodeFailures"})

class Action(StrEnum):
    """What Kueue's state means for the job."""

    HOLD = "hold"  # wait for admission
    STOP = "stop"  # evicted: stop the gang gracefully, then release the quota
    RUN = "run"  # admitted


HOLD, STOP, RUN = Action.HOLD, Action.STOP, Action.RUN


@dataclass(frozen=True)
class Gate:
    """May the job run? `held` workers at most (RUN), with `admission`; otherwise why not."""

    action: Action
    reason: str
    message: str
    held: int = 0
    admission: Admission | None = None


# The operator's Kueue integration is on but Kueue's API is not served: queue-labelled jobs wait.
UNAVAILABLE = Gate(HOLD, c.REASON_KUEUE_UNAVAILABLE, f"the Kueue integration is on but {c.KUEUE_API_VERSION} is not "
                   "served: install Kueue, then restart the operator")


def gate(workload: WorkloadView | None) -> Gate:
    """The admission state of the job's Workload, as a decision."""
    if workload is None or workload.deleting:
        return Gate(HOLD, c.REASON_WAITING_FOR_ADMISSION, "waiting for its Workload to be created")
    evicted = workload.condition(EVICTED)
    if evicted and evicted.get("status") == "True" and workload.is_true(QUOTA_RESERVED):
        reason = str(evicted.get("reason") or EVICTED)
        return Gate(STOP, reason, f"evicted by Kueue ({reason}): {evicted.get('message') or ''}".rstrip(": "))
    if workload.is_true(FINISHED):
        return Gate(HOLD, c.REASON_WAITING_FOR_ADMISSION, f"Workload {workload.name} is finished")
    if not workload.is_true(ADMITTED) or workload.admission is None:
        return Gate(HOLD, c.REASON_WAITING_FOR_ADMISSION, f"Workload {workload.name} waits for admission "
                    f"({_pending_message(workload)})")
    held = max(0, workload.admission.count - workload.reclaimable)
    return Gate(RUN, c.REASON_ADMITTED, f"admitted by ClusterQueue {workload.admission.cluster_queue} for "
                f"{workload.admission.count} workers", held, workload.admission)


def _pending_message(workload: WorkloadView) -> str:
    cond = workload.condition(QUOTA_RESERVED) or workload.condition(ADMITTED)
    return str((cond or {}).get("message") or "no quota reserved yet")


def workload_name(job: Job, generation: int) -> str:
    """Deterministic (a replayed create is AlreadyExists), unique per job uid and per re-admission."""
    suffix = f"-{job.uid[:5]}-{generation}"
    return f"{job.name[: 253 - len(suffix) - 4]}-rtj{suffix}".lower()


def worker_template(job: Job, node_selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The pod template Kueue sizes the pod set by: every container's requests made explicit
    (an extended resource such as nvidia.com/gpu may be given as a limit only)."""
    template = copy.deepcopy(dict(job.spec.template))
    spec = template.setdefault("spec", {})
    for container in spec.get("containers") or []:
        resources = container.setdefault("resources", {})
        resources["requests"] = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    if node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **node_selector}
    return {"metadata": {k: v for k, v in (template.get("metadata") or {}).items() if k in ("labels", "annotations")},
            "spec": spec}


def workload_manifest(job: Job, name: str) -> dict[str, Any]:
    """The Workload representing the job to Kueue, owned by it (garbage-collected with it)."""
    spec = job.spec
    pod_set: dict[str, Any] = {"name": c.WORKER_POD_SET, "count": spec.replicas, "template": worker_template(job)}
    if spec.elastic.min_replicas < spec.replicas:
        pod_set["minCount"] = spec.elastic.min_replicas  # partial admission: Kueue may grant fewer
    body: dict[str, Any] = {"queueName": job.queue_name, "podSets": [pod_set]}
    if job.priority:
        body["priorityClassRef"] = {"group": c.KUEUE_GROUP, "kind": "WorkloadPriorityClass",
                                    "name": job.priority.name}
        body["priority"] = job.priority.value
    return {
        "apiVersion": c.KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": {c.LABEL_JOB: job.name, c.LABEL_QUEUE_NAME: job.queue_name or ""},
            "ownerReferences": [{"apiVersion": c.API_VERSION, "kind": c.KIND, "name": job.name, "uid": job.uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": body,
    }


def matches(workload: WorkloadView, job: Job) -> bool:
    """Does the Workload still describe the job? Pod sets are immutable once quota is reserved, so a
    changed size or minimum is only applied by replacing a Workload that holds no quota (as jobframework)."""
    want_min = job.spec.elastic.min_replicas if job.spec.elastic.min_replicas < job.spec.replicas else None
    return workload.count == job.spec.replicas and workload.min_count == want_min


def _status(workload: WorkloadView) -> dict[str, Any]:
    return {"conditions": [dict(cond) for cond in workload.conditions]}


def release(workload: WorkloadView, evicted_reason: str, message: str, now: str, generation: int) -> dict[str, Any]:
    """The gang is gone after an eviction: give the quota back as jobframework does (Requeued, the
    reservation unset, Admitted False), so Kueue requeues the Workload."""
    st = _status(workload)
    set_condition(st, REQUEUED, evicted_reason in REQUEUE_AT_ONCE, evicted_reason, message, now, generation)
    set_condition(st, QUOTA_RESERVED, False, "Pending", message, now, generation)
    set_condition(st, ADMITTED, False, "NoReservation", "The workload has no reservation", now, generation)
    st["admission"] = None
    st["reclaimablePods"] = None  # the next admission is for the whole pod set again
    return st


def finish(workload: WorkloadView, succeeded: bool, message: str, now: str, generation: int) -> dict[str, Any] | None:
    """Finished=True once the job is terminal (Kueue then frees the quota); None if already so."""
    if workload.is_true(FINISHED):
        return None
    st = _status(workload)
    set_condition(st, FINISHED, True, "Succeeded" if succeeded else "Failed", message, now, generation)
    return st


def running_status(workload: WorkloadView, running: int | None, all_running: bool, now: str,
                   generation: int) -> dict[str, Any] | None:
    """While admitted: reclaimablePods for workers given up (never decreasing while admitted: Kueue's
    webhook refuses that), PodsReady for the gang. None if nothing changes."""
    assert workload.admission is not None
    st = _status(workload)
    changed = False
    if running is not None:
        reclaim = max(workload.reclaimable, workload.admission.count - running)
        if reclaim > workload.reclaimable:
            st["reclaimablePods"] = [{"name": c.WORKER_POD_SET, "count": reclaim}]
            changed = True
    ready = workload.condition(PODS_READY)
    if ready is None or (ready.get("status") == "True") != all_running:
        reason = "PodsReady" if all_running else ("WaitForRecovery" if ready else "WaitForStart")
        message = "All pods reached readiness" if all_running else "Not all pods are ready or succeeded"
        set_condition(st, PODS_READY, all_running, reason, message, now, generation)
        changed = True
    return st if changed else None


def place(render: Callable[[], dict[str, Any]], admission: Admission) -> dict[str, Any]:
    """Render a worker pod and apply the assigned flavor: its node labels as a node selector and its
    tolerations, as Kueue's jobframework does when it starts an admitted job."""
    pod = render()
    spec = pod["spec"]
    if admission.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **admission.node_selector}
    if admission.tolerations:
        spec["tolerations"] = [*(spec.get("tolerations") or []), *(dict(t) for t in admission.tolerations)]
    return pod
