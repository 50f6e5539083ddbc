"""One reconcile: observed state in, a plan out. Pure; the status is edited in memory and written once.

The state machine (status.phase):

    Pending ─► Starting ─► Running ─► Succeeded
                  ▲            │ failure / grow back / suspend
                  │            ▼
                  └── Restarting | BackingOff | WaitingForCapacity | Suspended ─► Failed (budget)

A Kueue-managed job (a queue-name label) also waits in `Queued` until its Workload is admitted, and goes
back there when Kueue evicts it or when growing back needs a new admission (core/queueing.py).

This module only sequences the policies (health, failures, budgets, capacity, growback, drain, goodput,
queueing, fencing) and turns their decisions into status, conditions and events. Everything needed to
continue lives in the cluster: the attempt number and launch parameters are in status and on the pods
(labels, annotations), so an operator restarted at any point picks up here.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from resilient_contract import completion, layout
from resilient_contract.layout import Listing, Verdict, step_dir_name
from resilient_operator import constants as c
from resilient_operator.core import (
    badnodes,
    budgets,
    capacity,
    drain,
    failures,
    fencing,
    goodput,
    growback,
    health,
    history,
    queueing,
    render,
    settle,
    stragglers,
)
from resilient_operator.core.conditions import get_condition, set_condition
from resilient_operator.core.model import Job, NodeView, OperatorConfig, Placement, PodView, Progress, WorkloadView
from resilient_operator.core.plan import Event, Plan
from resilient_operator.core.timeutil import fmt, parse

# Storage has no watch: a running job re-reads its checkpoint root this often (for status and grow-back).
CHECKPOINT_POLL_SECONDS = 10.0
# An unreadable checkpoint root is retried this often; a fix to a volume sends no event either.
STORAGE_RETRY_SECONDS = 15.0
# The operator's own discovery workers were busy or still starting: nothing is known of the root, ask again soon.
DISCOVERY_BUSY_RETRY_SECONDS = 1.0
MAX_SKIPPED_EVENTS = 3
# A pod failed while a node may be dying: recheck this often until the nodes prove alive or are lost.
UNSETTLED_RECHECK_SECONDS = 1.0
# Level-triggered safety nets for states that wait on events (a watch can miss them across an API
# outage): fenced pods still terminating, and a job waiting for capacity.
FENCE_RECHECK_SECONDS = 5.0
CAPACITY_RECHECK_SECONDS = 30.0
ACTIVE = (c.STARTING, c.RUNNING)
DEFAULT_CONFIG = OperatorConfig()
# What a user should do about a checkpoint root discovery refused, by the reason it gave.
_STORAGE_ADVICE = {
    layout.REASON_ROOT_OUTSIDE_AREA: "no pods are created; set spec.checkpoint.root inside the namespace's area",
    layout.REASON_INVALID_ROOT: "no pods are created; spec.checkpoint.root must be a plain absolute path",
    layout.REASON_ROOT_SYMLINK: "no pods are created; spec.checkpoint.root must not pass through a symlink",
    layout.REASON_DISCOVERY_TIMED_OUT: "reading the checkpoint root took too long (a hung volume, or a file that "
    "is too costly to check); it is retried, and the job does not restart from scratch meanwhile",
    layout.REASON_DISCOVERY_FAILED: "checking the checkpoint root failed (a file too large or malformed to "
    "check within the operator's limits); it is retried, and the job does not restart from scratch meanwhile",
}


class _Ctx:
    """The inputs of one reconcile, the node health judged once, and the status being edited."""

    def __init__(self, job: Job, pods: Sequence[PodView], node_map: Mapping[str, NodeView],
                 listing: Listing, now: datetime, progress: Sequence[Progress] = (),
                 config: OperatorConfig = DEFAULT_CONFIG, workload: WorkloadView | None = None,
                 kueue_ready: bool = True) -> None:
        self.job = job
        self.kueue_ready = kueue_ready
        self.progress = list(progress)
        self.config = config
        self.workload = workload
        self.gate: queueing.Gate | None = None  # set for a Kueue-managed job (job.queue_name)
        self.spec = job.spec
        self.pods = list(pods)
        self.listing = listing
        self.health = health.assess(node_map, now, job.spec.node_loss_timeout)
        self.draining = drain.draining(node_map, config.drain_taints)
        self.now = now
        self.ts = fmt(now)
        self.status: dict[str, Any] = copy.deepcopy(dict(job.status))
        self.plan = Plan(status=self.status)

    def event(self, etype: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(etype, reason, message))

    def condition(self, ctype: str, value: bool, reason: str, message: str) -> bool:
        return set_condition(self.status, ctype, value, reason, message, self.ts, self.job.generation)

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 0)

    @property
    def phase(self) -> str:
        return self.status.get("phase") or c.PENDING

    def set_phase(self, phase: str) -> None:
        self.status["phase"] = phase

    def current(self) -> list[PodView]:
        return [p for p in self.pods if p.attempt == self.attempt]

    def fence(self, pods: Sequence[PodView]) -> None:
        out = fencing.fence(pods, self.health, set(self.plan.delete) | set(self.plan.force_delete))
        self.plan.force_delete += out.force
        self.plan.delete += out.delete

    def close_history(self, reason: str) -> None:
        history.close_entry(self.status, self.attempt, reason, self.ts)

    def avoid(self) -> list[str]:
        """Nodes a new pod must not land on that the scheduler could still pick: lost ones (Kubernetes may
        still call them Ready), draining ones, this job's bad ones. A node the scheduler already skips for
        this template (cordoned, or the unreachable taint once the node-lifecycle controller adds it) needs
        no rule: each rule is copied into every pod, and a rack lost for good would otherwise put hundreds
        into every pod the operator creates, in its memory, the API server's and the scheduler's."""
        names = set(self.health.lost_names) | set(self.draining) | set(self.bad_nodes())
        return sorted(n for n in names if capacity.placeable(self.health.nodes.get(n), self.placement))

    def bad_nodes(self) -> dict[str, datetime]:
        return badnodes.avoided(self.status, self.now)

    @property
    def admitted(self) -> queueing.Gate | None:
        """Kueue's admission when the job is Kueue-managed and admitted; None otherwise."""
        return self.gate if self.gate and self.gate.action == queueing.RUN else None

    @property
    def placement(self) -> Placement:
        """Where workers may run: the template's placement, narrowed to the admitted flavor's nodes."""
        place = self.spec.placement
        if (gate := self.admitted) and gate.admission and gate.admission.node_selector:
            return Placement(place.requests, {**place.node_selector, **gate.admission.node_selector},
                             place.tolerations)
        return place


def reconcile(
    job: Job, pods: Sequence[PodView], node_map: Mapping[str, NodeView], listing: Listing, now: datetime,
    progress: Sequence[Progress] = (), config: OperatorConfig = DEFAULT_CONFIG,
    workload: WorkloadView | None = None, kueue_ready: bool = True,
) -> Plan:
    """Decide what to do about one job. Pods are the job's pods (any attempt), nodes all nodes, progress
    the launchers' reports (untrusted; only ever used for accounting and hang attribution); `workload` the
    job's Kueue Workload (read only when the job has a queue name; `kueue_ready` False: Kueue's API is not
    served, so such a job waits)."""
    ours = [p for p in pods if p.owner_uid == job.uid]  # ours: by uid, not label
    ctx = _Ctx(job, ours, node_map, listing, now, progress, config, workload, kueue_ready)
    if workload is not None:
        ctx.plan.workload_ref = (workload.name, workload.resource_version)
    st = ctx.status
    st["observedGeneration"] = job.generation
    st["desiredReplicas"] = job.spec.replicas
    st.setdefault("restarts", {"infrastructure": 0, "application": 0, "planned": 0})
    if _refuse_unusable_spec(ctx):
        _summarise(ctx)
        return ctx.plan
    _adopt_newer_attempt(ctx)
    _observe_checkpoints(ctx)
    badnodes.prune(st, now)
    _account(ctx)

    if ctx.phase in c.TERMINAL_PHASES:
        if ctx.phase == c.FAILED:  # a finished job keeps its completed pods for logs; a failed one stops the rest
            ctx.fence([p for p in ctx.pods if p.phase not in ("Succeeded", "Failed")])
    else:
        ctx.fence([p for p in ctx.pods if p.attempt < ctx.attempt])
        held = False
        if job.spec.suspend:
            _suspend(ctx)
        elif job.queue_name and (held := _held_by_kueue(ctx)):
            pass
        elif ctx.phase in ACTIVE:
            _watch_attempt(ctx)
        if ctx.phase not in ACTIVE and ctx.phase not in c.TERMINAL_PHASES and not job.spec.suspend and not held:
            _relaunch(ctx)
    if job.queue_name:
        _report_to_kueue(ctx)
    _summarise(ctx)
    return ctx.plan


def needs_discovery(job: Job, pods: Sequence[PodView], node_map: Mapping[str, NodeView], now: datetime,
                    config: OperatorConfig = DEFAULT_CONFIG) -> bool:
    """Whether this pass needs the checkpoint root read. Not for a finished job, nor for one between attempts
    whose pods are gone and that could not launch even with a checkpoint: below its minimum on the healthy
    nodes (waiting for capacity). Such jobs are looked at on every node event, and reading a root costs a
    sandboxed worker: a few jobs that can never fit must not keep every worker busy. A pass without the
    listing never launches (see _storage_ok): skipping can only delay, never change, a decision."""
    if job.problem or job.root_in_use_by:
        return False
    phase = job.status.get("phase") or c.PENDING
    if phase in c.TERMINAL_PHASES:
        return False
    if phase in ACTIVE or job.spec.suspend or job.queue_name or any(p.owner_uid == job.uid for p in pods):
        return True
    ctx = _Ctx(job, [], node_map, Listing("", None), now, config=config)
    return _target_replicas(ctx)[0] is not None


def _kueue_status(ctx: _Ctx) -> dict[str, Any]:
    kq: dict[str, Any] = ctx.status.setdefault("kueue", {})
    kq["queueName"] = ctx.job.queue_name
    kq.setdefault("generation", 1)
    return kq


def _held_by_kueue(ctx: _Ctx) -> bool:
    """Kueue decides whether the job runs: hold it (stopping what runs) until its Workload is admitted."""
    wl, kq = ctx.workload, _kueue_status(ctx)
    if not ctx.kueue_ready:
        pass  # no Workload API to create one in: the gate below holds the job
    elif wl is None:
        kq.pop("replace", None)
        kq["workload"] = queueing.workload_name(ctx.job, kq["generation"])
        ctx.plan.workload_create = partial(queueing.workload_manifest, ctx.job, kq["workload"])
    elif not wl.deleting and not kq.get("replace") and not queueing.matches(wl, ctx.job) \
            and not wl.is_true(queueing.QUOTA_RESERVED):
        kq["replace"], kq["generation"] = True, kq["generation"] + 1  # the spec changed while queued
    if wl is not None:
        kq["workload"] = wl.name
    gate = queueing.gate(wl) if ctx.kueue_ready else queueing.UNAVAILABLE
    if kq.get("replace") and ctx.kueue_ready:
        gate = queueing.Gate(queueing.HOLD, c.REASON_REQUEUED_TO_GROW, "asking Kueue for a new admission at "
                             f"{ctx.spec.replicas} workers (minimum {ctx.spec.elastic.min_replicas})")
        if wl is not None and not wl.deleting and not ctx.pods:
            ctx.plan.workload_delete = wl.name  # only once the gang is gone: its quota is still in use
    ctx.gate = gate
    if gate.action == queueing.RUN:
        assert gate.admission is not None
        kq.update(admittedReplicas=gate.admission.count, clusterQueue=gate.admission.cluster_queue,
                  flavors=dict(gate.admission.flavors))
        if ctx.phase in (c.QUEUED, c.PENDING):
            ctx.condition(c.COND_QUEUED, False, c.REASON_ADMITTED, gate.message)
            if ctx.phase == c.QUEUED:
                ctx.event("Normal", c.REASON_ADMITTED, f"{gate.message}; starting up to {gate.held} workers")
                if ctx.attempt:  # resumed after an eviction or a re-admission: planned, no budget spent
                    ctx.status["restarts"]["planned"] = ctx.status["restarts"].get("planned", 0) + 1
                ctx.set_phase(c.RESTARTING if ctx.attempt else c.PENDING)
        return False
    for key in ("admittedReplicas", "clusterQueue", "flavors"):
        kq.pop(key, None)
    if ctx.phase != c.QUEUED:
        if ctx.phase in ACTIVE:  # a stopped gang trains nothing: timed like an interruption (goodput)
            goodput.open_recovery(ctx.status, c.QUEUED, ctx.now, ctx.now, _reached(ctx))
            ctx.close_history(gate.reason)
            ctx.condition(c.COND_RUNNING, False, gate.reason, gate.message)
        if gate.action == queueing.STOP:
            ctx.event("Warning", c.REASON_EVICTED_BY_KUEUE, f"{gate.message}; stopping attempt {ctx.attempt} "
                      "gracefully (the trainer checkpoints on SIGTERM) and waiting in the queue")
        ctx.set_phase(c.QUEUED)
    ctx.fence(ctx.pods)  # graceful: SIGTERM, the preemption checkpoint, then the grace period
    ctx.condition(c.COND_QUEUED, True, gate.reason, gate.message)
    if gate.action == queueing.STOP and wl is not None and not ctx.pods:
        ctx.plan.workload_status = queueing.release(wl, gate.reason, gate.message, ctx.ts, ctx.job.generation)
        ctx.event("Normal", c.REASON_QUOTA_RELEASED, f"all workers stopped; Workload {wl.name} released its quota "
                  "and is queued again")
    elif ctx.pods:
        ctx.plan.look_again(FENCE_RECHECK_SECONDS)
    return True


def _report_to_kueue(ctx: _Ctx) -> None:
    """Tell Kueue what the job does with its admission: finished, workers given up, pods ready."""
    wl = ctx.workload
    if wl is None or wl.deleting or ctx.plan.workload_status is not None:
        return
    if ctx.phase in c.TERMINAL_PHASES:
        message = "the job succeeded" if ctx.phase == c.SUCCEEDED else "the job failed"
        ctx.plan.workload_status = queueing.finish(wl, ctx.phase == c.SUCCEEDED, message, ctx.ts, ctx.job.generation)
        return
    if ctx.admitted is None or wl.admission is None:
        return
    running = int(ctx.status.get("replicas") or 0) if ctx.phase in ACTIVE else None
    ctx.plan.workload_status = queueing.running_status(wl, running, ctx.phase == c.RUNNING, ctx.ts,
                                                       ctx.job.generation)


def _refuse_unusable_spec(ctx: _Ctx) -> bool:
    """A spec the CRD let through but the operator cannot use: say which field, start nothing, stay put."""
    problem = ctx.job.problem
    if problem:
        if ctx.condition(c.COND_SPEC_VALID, False, c.REASON_INVALID_SPEC, problem):
            ctx.event("Warning", c.REASON_INVALID_SPEC, f"{problem}; no pods are created until the spec is fixed")
        return True
    if (cond := get_condition(ctx.status, c.COND_SPEC_VALID)) and cond["status"] == "False":
        ctx.condition(c.COND_SPEC_VALID, True, c.REASON_SPEC_OK, "the spec is usable again")
    return False


def _adopt_newer_attempt(ctx: _Ctx) -> None:
    """Pods of an attempt newer than status exist: a status write was lost. Rebuild it from the pods."""
    newest = max((p.attempt for p in ctx.pods), default=0)
    if newest <= ctx.attempt:
        return
    pods = [p for p in ctx.pods if p.attempt == newest]
    st = ctx.status
    st["attempt"] = newest
    st["replicas"] = pods[0].launch_replicas or len(pods)
    resume = pods[0].launch_resume
    if resume and resume.path != posixpath.join(ctx.spec.checkpoint_root, step_dir_name(resume.step)):
        resume = None  # anyone who can edit the pod can write there: inject only a checkpoint of this job's root
    if resume:
        st["resumedFrom"] = {"path": resume.path, "step": resume.step}
    else:
        st.pop("resumedFrom", None)
    if ctx.phase not in c.TERMINAL_PHASES:
        ctx.set_phase(c.STARTING)
    history.open_entry(st, newest, st["replicas"], resume.step if resume else None, ctx.ts)


def _observe_checkpoints(ctx: _Ctx) -> None:
    listing, st = ctx.listing, ctx.status
    if listing.reason == c.DISCOVERY_SKIPPED:  # not read this pass (needs_discovery): nothing new is known
        return
    if other := ctx.job.root_in_use_by:  # two gangs writing one root would resume from each other's saves
        message = (f"checkpoint root {ctx.spec.checkpoint_root} is already used by live job {other}; no pods are "
                   "created: give this job its own spec.checkpoint.root, or set spec.checkpoint.shareRoot: true "
                   "on both jobs to share it on purpose")
        if ctx.condition(c.COND_STORAGE, False, c.REASON_ROOT_IN_USE, message):
            ctx.event("Warning", c.REASON_ROOT_IN_USE, message)
        ctx.plan.look_again(STORAGE_RETRY_SECONDS)
        return
    if listing.reason == layout.REASON_DISCOVERY_BUSY:  # not the storage's doing: its condition stays as it is
        ctx.plan.look_again(DISCOVERY_BUSY_RETRY_SECONDS)
        return
    if listing.error and not listing.missing:
        reason = listing.reason or c.REASON_STORAGE_UNREADABLE
        advice = _STORAGE_ADVICE.get(reason, "the job will not restart until the checkpoint root is readable by "
                                     "the operator (check the volume mount and its permissions; for s3://, the "
                                     "object store's endpoint, the bucket and the operator's keys for it)")
        if ctx.condition(c.COND_STORAGE, False, reason, f"{listing.error}; {advice}"):
            ctx.event("Warning", reason, listing.error)
        ctx.plan.look_again(STORAGE_RETRY_SECONDS)
        return
    if listing.missing and st.get("latestCheckpoint"):
        message = f"{listing.error}, but checkpoints were seen there before; is the volume mounted?"
        if ctx.condition(c.COND_STORAGE, False, c.REASON_STORAGE_UNREADABLE, message):
            ctx.event("Warning", c.REASON_STORAGE_UNREADABLE, f"{listing.error} (it held checkpoints before)")
        ctx.plan.look_again(STORAGE_RETRY_SECONDS)
        return
    ctx.condition(c.COND_STORAGE, True, c.REASON_STORAGE_OK, f"checkpoint root {listing.root} is readable")
    if listing.latest:
        st["latestCheckpoint"] = {"path": listing.latest.path, "step": listing.latest.step}
    for verdict in listing.skipped:
        if verdict.fenced_writer is not None and (
            entry := history.note_late_write(st, verdict.fenced_writer, verdict.step, verdict.path, ctx.ts)
        ):
            where = f" on node(s) {', '.join(entry['nodes'])}" if entry.get("nodes") else ""
            ctx.event("Warning", c.REASON_FENCED_WRITER,
                      f"attempt {verdict.fenced_writer}'s gang{where} was fenced but kept saving: "
                      f"{verdict.path} is refused as a resume source; check that node's containers are gone")


def _storage_ok(ctx: _Ctx) -> bool:
    if ctx.job.root_in_use_by:
        return False
    if ctx.listing.reason == c.DISCOVERY_SKIPPED:  # capacity came back after all: read the root, then launch
        ctx.plan.look_again(DISCOVERY_BUSY_RETRY_SECONDS)
        return False
    return not (ctx.listing.error and (not ctx.listing.missing or ctx.status.get("latestCheckpoint")))


def _cluster_disrupted(ctx: _Ctx) -> bool:
    """Most nodes look lost at once: hold still (no fencing, no restart) until heartbeats resume."""
    if ctx.health.disrupted:
        lost, total = len(ctx.health.lost), len(ctx.health.nodes)
        message = (f"{lost} of {total} nodes look lost at once, as after a control-plane or network outage; "
                   "not restarting until node heartbeats resume")
        if ctx.condition(c.COND_NODES_REPORTING, False, c.REASON_DISRUPTION, message):
            ctx.event("Warning", c.REASON_DISRUPTION, message)
        ctx.plan.look_again(UNSETTLED_RECHECK_SECONDS)
        return True
    if (cond := get_condition(ctx.status, c.COND_NODES_REPORTING)) and cond["status"] == "False":
        ctx.condition(c.COND_NODES_REPORTING, True, c.REASON_HEARTBEATS, "node heartbeats are flowing again")
    return False


def _suspend(ctx: _Ctx) -> None:
    ctx.fence(ctx.pods)
    if ctx.phase != c.SUSPENDED:
        if ctx.phase in ACTIVE:  # a stopped gang trains nothing: timed like an interruption
            goodput.open_recovery(ctx.status, c.SUSPENDED, ctx.now, ctx.now, _reached(ctx))
        ctx.close_history(c.REASON_SUSPENDED)
        ctx.set_phase(c.SUSPENDED)
        ctx.condition(c.COND_RUNNING, False, c.REASON_SUSPENDED, "the job is suspended")
        ctx.event("Normal", c.REASON_SUSPENDED, f"suspended attempt {ctx.attempt}; its pods are being deleted "
                  "and the job resumes from the latest checkpoint when spec.suspend is false")
    ctx.condition(c.COND_SUSPENDED, True, c.REASON_SUSPENDED, "spec.suspend is true")


def _watch_attempt(ctx: _Ctx) -> None:
    """The attempt is starting or running: detect success, failure, missing pods and grow-back."""
    st = ctx.status
    replicas = int(st.get("replicas") or 0)
    current = ctx.current()
    if failures.all_succeeded(current, replicas):
        _succeed(ctx)
        return
    if _cluster_disrupted(ctx):
        return
    notices = drain.affected(current, ctx.draining, ctx.health.lost)
    if notices:
        _drain(ctx, current, notices)
        return
    failure = failures.detect(current, replicas, ctx.phase == c.RUNNING, ctx.health)
    if failure:
        _on_failure(ctx, failure, current)
        return
    if failures.unsettled(current, ctx.health):
        ctx.plan.look_again(UNSETTLED_RECHECK_SECONDS)
    if ctx.phase == c.STARTING:
        _finish_starting(ctx, current, replicas)
    if ctx.phase == c.RUNNING:
        stragglers.summarise(ctx.status, ctx.attempt, ctx.progress, current, ctx.now)
    if ctx.phase == c.RUNNING and ctx.spec.elastic.grow_back:
        _consider_grow_back(ctx, current)
    for name in {p.node_name for p in current if p.node_name}:
        ctx.plan.look_again(ctx.health.next_loss_check(name))
    ctx.plan.look_again(CHECKPOINT_POLL_SECONDS)


def _finish_starting(ctx: _Ctx, current: Sequence[PodView], replicas: int) -> None:
    present = {p.rank for p in current}
    missing = [r for r in range(replicas) if r not in present]
    if missing:  # a crash (or a refused create) between the status write and the creates
        ctx.plan.create.append(partial(render.service_manifest, ctx.job))
        ctx.plan.create.append(partial(render.pdb_manifest, ctx.job, ctx.attempt, replicas))
    resume = _resume_verdict(ctx.status)
    for rank in missing:
        ctx.plan.create.append(_placed(ctx, partial(render.pod_manifest, ctx.job, ctx.attempt, rank, replicas,
                                                    resume, ctx.avoid())))
    if not missing and all(p.phase == "Running" for p in current):
        ctx.set_phase(c.RUNNING)
        goodput.running(ctx.status, ctx.now)
        history.record_nodes(ctx.status, ctx.attempt, current)
        ctx.condition(c.COND_RUNNING, True, c.REASON_ALL_RUNNING, f"all {replicas} workers are running")
        ctx.condition(c.COND_RECOVERING, False, c.REASON_ALL_RUNNING, f"attempt {ctx.attempt} is running")
        ctx.event("Normal", c.REASON_ALL_RUNNING, f"attempt {ctx.attempt}: all {replicas} workers running")


def _placed(ctx: _Ctx, pod: Any) -> Any:
    """A pod render with the admitted flavor's node labels and tolerations applied (Kueue-managed jobs)."""
    gate = ctx.admitted
    return partial(queueing.place, pod, gate.admission) if gate and gate.admission else pod


def _resume_verdict(st: Mapping[str, Any]) -> Verdict | None:
    resumed = st.get("resumedFrom")
    return Verdict(resumed["step"], resumed["path"], True) if resumed else None


def _succeed(ctx: _Ctx) -> None:
    st = ctx.status
    ctx.set_phase(c.SUCCEEDED)
    st["completionTime"] = ctx.ts
    ctx.plan.release.append(drain.pdb_name(ctx.job.name, ctx.attempt))
    ctx.close_history(c.REASON_COMPLETED)
    ctx.condition(c.COND_SUCCEEDED, True, c.REASON_COMPLETED, "all workers finished")
    ctx.condition(c.COND_RUNNING, False, c.REASON_COMPLETED, "the job finished")
    ctx.condition(c.COND_RECOVERING, False, c.REASON_COMPLETED, "the job finished")
    ctx.event("Normal", c.REASON_COMPLETED, f"all {st.get('replicas')} workers of attempt {ctx.attempt} finished")


def _on_failure(ctx: _Ctx, failure: failures.Failure, current: Sequence[PodView]) -> None:
    st = ctx.status
    last: dict[str, Any] = {"kind": failure.kind, "reason": failure.reason, "message": failure.message,
                            "attempt": ctx.attempt, "time": ctx.ts}
    for field, value in (("node", failure.node), ("pod", failure.pod), ("exitCode", failure.exit_code)):
        if value is not None:
            last[field] = value
    st["lastFailure"] = last
    goodput.open_recovery(st, failure.kind, _occurred(ctx, failure, current), ctx.now, _reached(ctx))
    _blame(ctx, failure)
    ctx.close_history(failure.reason)
    ctx.fence(current)
    where = f" on node {failure.node}" if failure.node else ""
    ctx.event("Warning", failure.reason, f"attempt {ctx.attempt} broken{where}: {failure.message}")
    spent = budgets.spend(failure.kind, st["restarts"], ctx.spec.failure)
    if spent.exhausted:
        _fail(ctx, spent.budget_reason, f"{spent.key} restart budget ({spent.limit}) is spent; last "
              f"failure: {failure.message}. Raise spec.failurePolicy or fix the cause, then recreate the job; "
              "checkpoints are kept")
        return
    st["restarts"][spent.key] = spent.count
    ctx.condition(c.COND_RUNNING, False, failure.reason, failure.message)
    ctx.condition(c.COND_RECOVERING, True, failure.reason,
                  f"fencing attempt {ctx.attempt} and restarting: {failure.message}")
    if spent.backoff_seconds is None:
        ctx.set_phase(c.RESTARTING)
        return
    delay = spent.backoff_seconds
    st["nextRetryTime"] = fmt(ctx.now + timedelta(seconds=delay))
    ctx.set_phase(c.BACKING_OFF)
    ctx.event("Normal", c.REASON_BACKOFF, f"application restart {spent.count}/{spent.limit} in {delay:g}s")


def _fail(ctx: _Ctx, reason: str, message: str) -> None:
    ctx.set_phase(c.FAILED)
    ctx.status["completionTime"] = ctx.ts
    ctx.plan.release.append(drain.pdb_name(ctx.job.name, ctx.attempt))
    ctx.condition(c.COND_FAILED, True, reason, message)
    ctx.condition(c.COND_RUNNING, False, reason, message)
    ctx.condition(c.COND_RECOVERING, False, reason, "the job failed")
    ctx.event("Warning", reason, message)


def _target_replicas(ctx: _Ctx, *, within_admission: bool = True) -> tuple[int | None, int]:
    """The size the healthy capacity (and Kueue's admission, if any) allows (None below the minimum), and
    that capacity (draining nodes, even ones the template tolerates, hold nothing: they are about to go)."""
    per_node = capacity.capacity(ctx.health, ctx.placement).per_node
    skip = set(ctx.draining) | set(ctx.bad_nodes())
    cap = sum(n for name, n in per_node.items() if name not in skip)
    desired = _desired(ctx) if within_admission else ctx.spec.replicas
    return capacity.choose_replicas(desired, ctx.spec.elastic, cap), cap


def _desired(ctx: _Ctx) -> int:
    """spec.replicas, or for an admitted Kueue-managed job the workers its admission still holds."""
    gate = ctx.admitted
    return min(ctx.spec.replicas, gate.held) if gate else ctx.spec.replicas


def _consider_grow_back(ctx: _Ctx, current: Sequence[PodView]) -> None:
    st = ctx.status
    replicas = int(st.get("replicas") or 0)
    latest = (st.get("latestCheckpoint") or {}).get("step", -1)
    decision = growback.decide(replicas, _target_replicas(ctx, within_admission=False)[0], latest,
                               st.get("growBack"))
    if decision.action == growback.NONE:
        st.pop("growBack", None)
    elif decision.action == growback.NOTICE:
        st["growBack"] = {"replicas": decision.target, "sinceStep": latest}
        ctx.event("Normal", c.REASON_GROW_BACK, f"capacity for {decision.target} workers is back; growing from "
                  f"{replicas} at the next complete checkpoint")
    elif decision.action == growback.WAIT:
        st["growBack"]["replicas"] = decision.target
    elif (gate := ctx.admitted) and decision.target is not None and decision.target > gate.held:
        _requeue_to_grow(ctx, current, replicas, decision.target, latest)
    else:
        message = f"growing {replicas} -> {decision.target} workers from {step_dir_name(latest)}"
        st.pop("growBack", None)
        st["restarts"]["planned"] = st["restarts"].get("planned", 0) + 1
        goodput.open_recovery(st, c.PLANNED, ctx.now, ctx.now, _reached(ctx))
        ctx.close_history(c.REASON_GROW_BACK)
        ctx.fence(current)
        ctx.set_phase(c.RESTARTING)
        ctx.condition(c.COND_RECOVERING, True, c.REASON_GROW_BACK, message)
        ctx.event("Normal", c.REASON_GROW_BACK, message)


def _requeue_to_grow(ctx: _Ctx, current: Sequence[PodView], replicas: int, target: int, latest: int) -> None:
    """Growing past the quota Kueue holds for the job needs a new admission: stop at this checkpoint and
    replace the Workload by one asking for spec.replicas again (Kueue may grant fewer, or make it wait)."""
    st = ctx.status
    message = (f"capacity for {target} workers is back but Kueue holds quota for {replicas}; stopping at "
               f"{step_dir_name(latest)} and asking for a new admission")
    st.pop("growBack", None)
    kq = _kueue_status(ctx)
    kq["replace"], kq["generation"] = True, kq["generation"] + 1
    _stop_planned(ctx, current, c.REASON_REQUEUED_TO_GROW, c.QUEUED, c.COND_QUEUED, message)


def _relaunch(ctx: _Ctx) -> None:
    """Between attempts: wait for the fenced pods to go, for backoff, capacity and storage; then launch."""
    st, spec = ctx.status, ctx.spec
    if ctx.phase == c.SUSPENDED:
        ctx.condition(c.COND_SUSPENDED, False, c.REASON_RESUMED, "spec.suspend is false")
        st["restarts"]["planned"] = st["restarts"].get("planned", 0) + 1
        ctx.set_phase(c.RESTARTING)
        ctx.event("Normal", c.REASON_RESUMED, "resuming from the latest complete checkpoint")
    leftovers = [p for p in ctx.pods if p.attempt <= ctx.attempt]
    if leftovers:
        ctx.fence(leftovers)
        ctx.plan.look_again(FENCE_RECHECK_SECONDS)  # their deletion events normally bring us back first
        return
    if ctx.phase == c.BACKING_OFF:
        retry = parse(st.get("nextRetryTime"))
        if retry and ctx.now < retry:
            ctx.plan.look_again((retry - ctx.now).total_seconds())
            return
    if ctx.phase == c.RESTARTING:
        silent = capacity.quiet(ctx.health, capacity.capacity(ctx.health, ctx.placement))
        if silent:  # a node that went quiet with the lost one may be about to follow it: restart once
            ctx.plan.look_again(max(0.1, min(UNSETTLED_RECHECK_SECONDS, *silent.values())))
            return
    if _settle(ctx):
        return
    replicas, cap = _target_replicas(ctx)
    if replicas is None:
        message = (f"need at least {spec.elastic.min_replicas} workers (a multiple of "
                   f"{spec.elastic.multiple_of}) but the healthy schedulable nodes hold {cap}; "
                   "waiting for nodes to join or recover")
        if ctx.phase != c.WAITING_FOR_CAPACITY:
            ctx.event("Warning", c.REASON_BELOW_MIN, message)
        ctx.set_phase(c.WAITING_FOR_CAPACITY)
        ctx.condition(c.COND_CAPACITY, False, c.REASON_BELOW_MIN, message)
        ctx.plan.look_again(CAPACITY_RECHECK_SECONDS)  # node events normally bring us back first
        for until in ctx.bad_nodes().values():  # an avoided node becomes usable again with no event
            ctx.plan.look_again((until - ctx.now).total_seconds())
        return
    ctx.condition(c.COND_CAPACITY, True, c.REASON_ENOUGH, f"the healthy nodes hold {cap} workers")
    if not _storage_ok(ctx):
        return  # the storage condition says why; retried on a timer
    _launch(ctx, replicas)


def _launch(ctx: _Ctx, replicas: int) -> None:
    st, spec, listing = ctx.status, ctx.spec, ctx.listing
    previous = int(st.get("replicas") or 0)
    attempt = ctx.attempt + 1
    resume = listing.latest
    for skipped in listing.skipped[:MAX_SKIPPED_EVENTS]:
        ctx.event("Warning", c.REASON_CHECKPOINT_SKIPPED, f"not resuming from {skipped.path}: {skipped.reason}")
    st["attempt"] = attempt
    st["replicas"] = replicas
    st.pop("nextRetryTime", None)
    st.pop("growBack", None)
    st.setdefault("startTime", ctx.ts)
    if resume:
        st["resumedFrom"] = {"path": resume.path, "step": resume.step}
    else:
        st.pop("resumedFrom", None)
    ctx.set_phase(c.STARTING)
    history.open_entry(st, attempt, replicas, resume.step if resume else None, ctx.ts)
    goodput.launched(st, ctx.now, resume.step if resume else None)
    ctx.plan.create.append(partial(render.service_manifest, ctx.job))
    ctx.plan.create.append(partial(render.pdb_manifest, ctx.job, attempt, replicas))
    if attempt > 1:  # the previous attempt's pods are gone: its budget has nothing left to protect
        ctx.plan.release.append(drain.pdb_name(ctx.job.name, attempt - 1))
    for rank in range(replicas):
        ctx.plan.create.append(_placed(ctx, partial(render.pod_manifest, ctx.job, attempt, rank, replicas, resume,
                                                    ctx.avoid())))
    source = f"from {step_dir_name(resume.step)}" if resume else "from scratch (no complete checkpoint)"
    if attempt == 1:
        ctx.event("Normal", c.REASON_STARTED, f"started {replicas} workers ({spec.replicas} desired) {source}")
    else:
        failure = st.get("lastFailure") or {}
        after = f" after: {failure['message']}" if failure.get("attempt") == attempt - 1 else ""
        ctx.event("Normal", c.REASON_STARTED,
                  f"restarted {previous} -> {replicas} workers {source} as attempt {attempt}{after}")


def _summarise(ctx: _Ctx) -> None:
    st = ctx.status
    st["restartCount"] = budgets.total(st["restarts"])
    replicas = int(st.get("replicas") or 0)
    running = sum(1 for p in ctx.current() if p.phase == "Running" and not p.deleting)
    st["workers"] = f"{running}/{ctx.spec.replicas}"
    st["worldSize"] = replicas * ctx.spec.nproc_per_node
    st.setdefault("attempt", 0)
    st.setdefault("phase", c.PENDING)
    goodput.summarise(st, ctx.now, force=ctx.phase in c.TERMINAL_PHASES)


def _settle(ctx: _Ctx) -> bool:
    """Full capacity is seconds away (a node Ready again, its lifecycle taint about to go): wait, bounded."""
    st, spec = ctx.status, ctx.spec
    wait = settle.decide(ctx.health, ctx.placement, _desired(ctx), spec.elastic, ctx.now,
                         ctx.config.settle_seconds, parse(st.get("settlingSince")))
    if wait is None:
        st.pop("settlingSince", None)
        return False
    if "settlingSince" not in st:
        st["settlingSince"] = ctx.ts
        ctx.event("Normal", c.REASON_SETTLING, wait.message)
    ctx.plan.look_again(wait.seconds)
    return True


def _account(ctx: _Ctx) -> None:
    """Goodput: fold in the launchers' reports and the steps a stopped attempt says it reached."""
    st = ctx.status
    for pod in ctx.current():
        for term in pod.terminations:
            outcome = completion.parse_message(term.message)
            if outcome and (step := outcome.int_field("step")) is not None:  # tenant-written: bounded
                goodput.note_reached(st, step)
    goodput.observe(st, ctx.attempt, ctx.progress, ctx.now)


def _reached(ctx: _Ctx) -> int | None:
    """The furthest step the current attempt is known to have completed."""
    steps = [r.step for r in ctx.progress if r.attempt == ctx.attempt]
    latest = (ctx.status.get("latestCheckpoint") or {}).get("step")
    if isinstance(latest, int):
        steps.append(latest)
    return max(steps) if steps else None


def _occurred(ctx: _Ctx, failure: failures.Failure, current: Sequence[PodView]) -> datetime:
    """The last sign of life before the failure: a lost node's lease, a failed pod's exit, else now."""
    if failure.lost_nodes:
        renewals = [n.lease_renewed for name in failure.lost_nodes
                    if (n := ctx.health.nodes.get(name)) and n.lease_renewed]
        if renewals:
            return min(renewals)
    if failure.occurred is not None:
        return failure.occurred
    pod = next((p for p in current if p.name == failure.pod), None)
    ended = [t.finished_at for t in pod.terminations if t.finished_at] if pod else []
    return min(ended) if ended else ctx.now


def _drain(ctx: _Ctx, current: Sequence[PodView], notices: Sequence[drain.Notice]) -> None:
    """A node of the attempt is about to go with warning: stop the gang gracefully (the trainer saves at its
    current step on SIGTERM) and restart without the draining nodes. A planned restart: no budget spent."""
    st = ctx.status
    where = ", ".join(f"{n.node} ({n.why})" for n in notices)
    message = (f"node {where} is about to go: stopping attempt {ctx.attempt} gracefully (its workers save a "
               "checkpoint at the current step) and restarting without it")
    st["restarts"]["planned"] = st["restarts"].get("planned", 0) + 1
    st["lastDrain"] = {"nodes": [n.node for n in notices], "reason": notices[0].why, "attempt": ctx.attempt,
                       "time": ctx.ts}
    _stop_planned(ctx, current, c.REASON_DRAIN, c.RESTARTING, c.COND_RECOVERING, message)


def _stop_planned(ctx: _Ctx, current: Sequence[PodView], reason: str, phase: str, condition: str,
                  message: str) -> None:
    """A stop the job did not fail into (a drain, a requeue to grow): the lost time is planned, the attempt
    closes with `reason`, its pods are fenced gracefully, and `condition` says what happens next."""
    goodput.open_recovery(ctx.status, c.PLANNED, ctx.now, ctx.now, _reached(ctx))
    ctx.close_history(reason)
    ctx.fence(current)
    ctx.set_phase(phase)
    ctx.condition(c.COND_RUNNING, False, reason, message)
    ctx.condition(condition, True, reason, message)
    ctx.event("Normal", reason, message)


def _blame(ctx: _Ctx, failure: failures.Failure) -> None:
    """Remember the node(s) that broke the attempt (infrastructure failures and hangs only)."""
    if failure.kind == c.APPLICATION:
        return
    before = set(ctx.bad_nodes())
    for node in failure.lost_nodes or ((failure.node,) if failure.node else ()):
        lost = node in failure.lost_nodes
        badnodes.record(ctx.status, node, c.REASON_NODE_LOST if lost else failure.reason, ctx.now,
                        ctx.spec.bad_node_seconds, attested=lost or failure.attested)
    for node, until in sorted(ctx.bad_nodes().items()):
        if node not in before:
            ctx.event("Normal", c.REASON_AVOID_NODE, f"node {node} broke attempt {ctx.attempt} ({failure.reason}); "
                      f"this job's next attempts avoid it until {fmt(until)} (spec.badNodeSeconds)")
