"""The Kueue step (Kueue-managed jobs only): Kueue decides whether the job runs, and is told what the job does.

`admit` holds the job in `Queued` (stopping what runs) until its Workload is admitted, creating or
replacing the Workload as needed, and returns the inputs narrowed to the admission; `report` tells Kueue,
at the end of the pass, that the job finished, gave workers back, or has its pods ready.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from resilient_operator import constants as c
from resilient_operator.core import goodput, queueing
from resilient_operator.core.plan import Plan
from resilient_operator.core.steps.draft import ACTIVE, FENCE_RECHECK_SECONDS, Draft, Inputs


def _workload(inp: Inputs, d: Draft) -> queueing.Gate:
    """Create the Workload, or mark it for replacement when the spec changed while queued; then the gate."""
    wl, kq = inp.workload, d.kueue(inp)
    if not inp.kueue_ready:
        pass  # no Workload API to create one in: the gate below holds the job
    elif wl is None:
        kq.pop("replace", None)
        kq["workload"] = queueing.workload_name(inp.job, kq["generation"])
        d.plan.workload_create = partial(queueing.workload_manifest, inp.job, kq["workload"])
    elif not wl.deleting and not kq.get("replace") and not queueing.matches(wl, inp.job) \
            and not wl.is_true(queueing.QUOTA_RESERVED):
        kq["replace"], kq["generation"] = True, kq["generation"] + 1  # the spec changed while queued
    if wl is not None:
        kq["workload"] = wl.name
    gate = queueing.gate(wl) if inp.kueue_ready else queueing.UNAVAILABLE
    if kq.get("replace") and inp.kueue_ready:
        spec = inp.job.spec
        gate = queueing.Gate(queueing.HOLD, c.REASON_REQUEUED_TO_GROW, "asking Kueue for a new admission at "
                             f"{spec.replicas} workers (minimum {spec.elastic.min_replicas})")
        if wl is not None and not wl.deleting and not inp.pods:
            d.plan.workload_delete = wl.name  # only once the gang is gone: its quota is still in use
    return gate


def admit(inp: Inputs, d: Draft) -> Inputs:
    """The inputs with Kueue's gate; an admitted job goes on, any other is held (what runs is stopped)."""
    gate = _workload(inp, d)
    inp, kq = replace(inp, gate=gate), d.kueue(inp)
    if gate.action == queueing.RUN:
        assert gate.admission is not None
        kq["admittedReplicas"], kq["clusterQueue"] = gate.admission.count, gate.admission.cluster_queue
        kq["flavors"] = dict(gate.admission.flavors)
        if d.phase in (c.QUEUED, c.PENDING):
            d.condition(c.COND_QUEUED, False, c.REASON_ADMITTED, gate.message)
            if d.phase == c.QUEUED:
                d.event("Normal", c.REASON_ADMITTED, f"{gate.message}; starting up to {gate.held} workers")
                if d.attempt:  # resumed after an eviction or a re-admission: planned, no budget spent
                    d.count_planned()
                d.set_phase(c.RESTARTING if d.attempt else c.PENDING)
        return inp
    kq.pop("admittedReplicas", None)
    kq.pop("clusterQueue", None)
    kq.pop("flavors", None)
    if d.phase != c.QUEUED:
        if d.phase in ACTIVE:  # a stopped gang trains nothing: timed like an interruption (goodput)
            goodput.open_recovery(d.raw, c.QUEUED, inp.now, inp.now, d.reached(inp))
            d.close_history(gate.reason)
            d.condition(c.COND_RUNNING, False, gate.reason, gate.message)
        if gate.action == queueing.STOP:
            d.event("Warning", c.REASON_EVICTED_BY_KUEUE, f"{gate.message}; stopping attempt {d.attempt} "
                    "gracefully (the trainer checkpoints on SIGTERM) and waiting in the queue")
        d.set_phase(c.QUEUED)
    d.fence(inp.pods)  # graceful: SIGTERM, the preemption checkpoint, then the grace period
    d.condition(c.COND_QUEUED, True, gate.reason, gate.message)
    if gate.action == queueing.STOP and inp.workload is not None and not inp.pods:
        wl = inp.workload
        d.plan.workload_status = queueing.release(wl, gate.reason, gate.message, inp.ts, inp.job.generation)
        d.event("Normal", c.REASON_QUOTA_RELEASED, f"all workers stopped; Workload {wl.name} released its quota "
                "and is queued again")
    elif inp.pods:
        d.plan.look_again(FENCE_RECHECK_SECONDS)
    return inp


def report(inp: Inputs, d: Draft) -> None:
    """Tell Kueue what the job does with its admission: finished, workers given up, pods ready."""
    wl, plan = inp.workload, d.plan
    if wl is None or wl.deleting or plan.workload_status is not None:
        return
    phase, generation = d.phase, inp.job.generation
    if phase in c.TERMINAL_PHASES:
        message = "the job succeeded" if phase == c.SUCCEEDED else "the job failed"
        plan.workload_status = queueing.finish(wl, phase == c.SUCCEEDED, message, inp.ts, generation)
        return
    if inp.admitted is None or wl.admission is None:
        return
    running = int(d.status.get("replicas") or 0) if phase in ACTIVE else None
    plan.workload_status = queueing.running_status(wl, running, phase == c.RUNNING, inp.ts, generation)


def workload_ref(inp: Inputs, plan: Plan) -> None:
    """Guard the Workload writes by the resourceVersion observed."""
    if inp.workload is not None:
        plan.workload_ref = (inp.workload.name, inp.workload.resource_version)
