"""One reconcile: observed state in, a plan out. Pure; the status is edited in memory and written once.

The state machine (status.phase):

    Pending ─► Starting ─► Running ─► Succeeded
                  ▲            │ failure / grow back / suspend
                  │            ▼
                  └── Restarting | BackingOff | WaitingForCapacity | Suspended ─► Failed (budget)

A Kueue-managed job (a queue-name label) also waits in `Queued` until its Workload is admitted, and goes
back there when Kueue evicts it or when growing back needs a new admission (core/queueing.py).

This module is only the order of the steps (core/steps/); each step writes its own status fields,
conditions and events, and each policy it asks (health, failures, budgets, capacity, growback, drain,
goodput, queueing, fencing, history) returns its decision with its own words. Everything needed to
continue lives in the cluster: the attempt number and launch parameters are in status and on the pods
(labels, annotations), so an operator restarted at any point picks up here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from resilient_contract.storage.listing import Listing
from resilient_operator import constants as c
from resilient_operator.core import badnodes, handover
from resilient_operator.core.model import Job, NodeView, OperatorConfig, PodView, Progress, WorkloadView
from resilient_operator.core.plan import Plan
from resilient_operator.core.rootstate import DISCOVERY_BUSY_RETRY_SECONDS, STORAGE_RETRY_SECONDS
from resilient_operator.core.steps import kueue, launch, observe, stop, summary, watch
from resilient_operator.core.steps.draft import ACTIVE, DEFAULT_CONFIG, Draft, Inputs

__all__ = ["DISCOVERY_BUSY_RETRY_SECONDS", "STORAGE_RETRY_SECONDS", "needs_discovery", "reconcile"]


def reconcile(
    job: Job, pods: Sequence[PodView], node_map: Mapping[str, NodeView], listing: Listing, now: datetime,
    progress: Sequence[Progress] = (), config: OperatorConfig = DEFAULT_CONFIG,
    workload: WorkloadView | None = None, kueue_ready: bool = True, undeliverable: Mapping[str, str] | None = None,
) -> Plan:
    """Decide what to do about one job. Pods are the job's pods (any attempt), nodes all nodes, progress
    the launchers' reports (untrusted; only ever used for accounting and hang attribution); `workload` the
    job's Kueue Workload (read only when the job has a queue name; `kueue_ready` False: Kueue's API is not
    served, so such a job waits); `undeliverable` pod uid -> why this attempt's in-place plan cannot reach
    that pod's agent (the shell's delivery answers that will not change)."""
    inp = Inputs.observe(job, pods, node_map, listing, now, progress=progress, config=config,
                         workload=workload, kueue_ready=kueue_ready, undeliverable=undeliverable or {})
    d = Draft(inp)
    # Kueue's Workload writes are guarded by the resourceVersion this pass saw.
    kueue.workload_ref(inp, d.plan)
    # What this pass is about: the generation seen, the size asked for, the budgets (first pass: none spent).
    d.status["observedGeneration"], d.status["desiredReplicas"] = job.generation, job.spec.replicas
    d.status.setdefault("restarts", {"infrastructure": 0, "application": 0, "planned": 0})
    # A spec the operator cannot use starts nothing, and nothing else is decided until it is fixed.
    if observe.refuse_unusable_spec(inp, d):
        summary.write(inp, d)
        return d.plan
    # A lost status write: pods of a newer attempt than status says are the truth.
    observe.adopt_newer_attempt(inp, d)
    # The checkpoint root: readable or not (and why), the newest complete checkpoint, late fenced writers.
    observe.checkpoints(inp, d)
    # Bad nodes whose time is up are usable again.
    badnodes.prune(d.status, now)
    # Goodput: the launchers' reports and the steps a stopped attempt reached.
    observe.account(inp, d)
    if d.phase in c.TERMINAL_PHASES:
        # A finished job keeps its completed pods for logs; a failed one stops the rest.
        if d.phase == c.FAILED:
            d.fence([p for p in inp.pods if p.phase not in ("Succeeded", "Failed")])
    else:
        # Pods of older attempts never run beside the current one.
        # (Except kept pods whose agents are taking the new attempt's plan: core/handover.py.)
        waiting = handover.waiting(d.status, d.attempt, inp.pods)
        d.fence([p for p in inp.pods if p.attempt < d.attempt and p.name not in waiting])
        held = False
        if job.spec.suspend:
            # Suspended: stop the gang and wait.
            stop.suspend(inp, d)
        else:
            if job.queue_name:
                # Kueue decides whether the job runs (and narrows where, to the admitted flavor).
                inp = kueue.admit(inp, d)
                held = inp.admitted is None
            if not held and d.phase in ACTIVE:
                # A live attempt: watch it, and stop it for what the watch found.
                stop.interrupt(inp, d, watch.attempt(inp, d))
        if d.phase not in ACTIVE and d.phase not in c.TERMINAL_PHASES and not job.spec.suspend and not held:
            # Between attempts: launch the next once nothing is in the way.
            launch.relaunch(inp, d)
    if job.queue_name:
        # Tell Kueue what the job does with its admission.
        kueue.report(inp, d)
    # The fields a user reads at a glance, and goodput.
    summary.write(inp, d)
    return d.plan


def needs_discovery(job: Job, pods: Sequence[PodView], node_map: Mapping[str, NodeView], now: datetime,
                    config: OperatorConfig = DEFAULT_CONFIG) -> bool:
    """Whether this pass needs the checkpoint root read. Not for a finished job, nor for one between attempts
    whose pods are gone and that could not launch even with a checkpoint: below its minimum on the healthy
    nodes (waiting for capacity). Such jobs are looked at on every node event, and reading a root costs a
    sandboxed worker: a few jobs that can never fit must not keep every worker busy. A pass without the
    listing never launches (see rootstate.launchable): skipping can only delay, never change, a decision."""
    if job.problem or job.root_in_use_by:
        return False
    phase = job.status.get("phase") or c.PENDING
    if phase in c.TERMINAL_PHASES:
        return False
    if phase in ACTIVE or job.spec.suspend or job.queue_name or any(p.owner_uid == job.uid for p in pods):
        return True
    inp = Inputs.observe(job, [], node_map, Listing("", None), now, config=config)
    return Draft(inp).target_replicas(inp)[0] is not None
