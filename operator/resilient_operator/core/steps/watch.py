"""The watch step (a Starting or Running attempt): success, a cluster-wide outage, and what should stop it.

It finishes what it can decide alone (success, all workers up, a pod missing after a crash, the slowest
rank, capacity noticed for growing back) and returns what should stop the attempt (a failure, draining
nodes, a grow-back restart) for the stop step to carry out.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from resilient_contract.storage.listing import Verdict
from resilient_operator import constants as c
from resilient_operator.core import drain, failures, goodput, growback, handover, history, render, stragglers
from resilient_operator.core.conditions import get_condition
from resilient_operator.core.model import PodView
from resilient_operator.core.steps.draft import Draft, Inputs, Interruption

# Storage has no watch: a running job re-reads its checkpoint root this often (for status and grow-back).
CHECKPOINT_POLL_SECONDS = 10.0
# A pod failed while a node may be dying: recheck this often until the nodes prove alive or are lost.
UNSETTLED_RECHECK_SECONDS = 1.0


def attempt(inp: Inputs, d: Draft) -> Interruption | None:
    """Detect success, failure, draining nodes and grow-back; keep the pods of a starting attempt complete."""
    replicas = int(d.status.get("replicas") or 0)
    current = d.current(inp)
    if failures.all_succeeded(current, replicas):
        _succeed(inp, d)
        return None
    if _cluster_disrupted(inp, d):
        return None
    if notices := drain.affected(current, inp.draining, inp.health.lost):
        return notices
    if failure := failures.detect(current, replicas, d.phase == c.RUNNING, inp.health, inp.progress):
        return failure
    if failures.unsettled(current, inp.health, inp.progress):
        d.plan.look_again(UNSETTLED_RECHECK_SECONDS)
    if d.phase == c.STARTING:
        _finish_starting(inp, d, current, replicas)
    grow = None
    if d.phase == c.RUNNING:
        stragglers.summarise(d.status, d.attempt, inp.progress, current, inp.now)
        if handover.agent(inp.job, inp.config):  # agents report a hang in their reports, not by ending
            d.plan.look_again(failures.hang_poll(inp.job.spec.progress_timeout))
        if inp.job.spec.elastic.grow_back:
            grow = _grow_back(inp, d, replicas)
    for name in {p.node_name for p in current if p.node_name}:
        d.plan.look_again(inp.health.next_loss_check(name))
    d.plan.look_again(CHECKPOINT_POLL_SECONDS)
    return grow


def _cluster_disrupted(inp: Inputs, d: Draft) -> bool:
    """Most nodes look lost at once: hold still (no fencing, no restart) until heartbeats resume."""
    if inp.health.disrupted:
        message = inp.health.disruption_message
        if d.condition(c.COND_NODES_REPORTING, False, c.REASON_DISRUPTION, message):
            d.event("Warning", c.REASON_DISRUPTION, message)
        d.plan.look_again(UNSETTLED_RECHECK_SECONDS)
        return True
    if (cond := get_condition(d.raw, c.COND_NODES_REPORTING)) and cond["status"] == "False":
        d.condition(c.COND_NODES_REPORTING, True, c.REASON_HEARTBEATS, "node heartbeats are flowing again")
    return False


def _succeed(inp: Inputs, d: Draft) -> None:
    d.set_phase(c.SUCCEEDED)
    d.status["completionTime"] = inp.ts
    d.plan.release.append(drain.pdb_name(inp.job.name, d.attempt))
    d.close_history(c.REASON_COMPLETED)
    d.condition(c.COND_SUCCEEDED, True, c.REASON_COMPLETED, "all workers finished")
    d.condition(c.COND_RUNNING, False, c.REASON_COMPLETED, "the job finished")
    d.condition(c.COND_RECOVERING, False, c.REASON_COMPLETED, "the job finished")
    d.event("Normal", c.REASON_COMPLETED, f"all {d.status.get('replicas')} workers of attempt {d.attempt} finished")


def _finish_starting(inp: Inputs, d: Draft, current: Sequence[PodView], replicas: int) -> None:
    resumed = d.status.get("resumedFrom")
    resume = Verdict(resumed["step"], resumed["path"], True) if resumed else None
    if _handing_over(inp, d, replicas, resume):
        return
    present = {p.rank for p in current}
    missing = [r for r in range(replicas) if r not in present]
    if missing:  # new ranks of an in-place start; or a crash (or a refused create) after the status write
        d.plan.create.append(partial(render.service_manifest, inp.job))
        d.plan.create.append(partial(render.pdb_manifest, inp.job, d.attempt, replicas))
    master, agent = handover.master(d.status, d.attempt), handover.agent(inp.job, inp.config)
    for rank in missing:
        d.plan.create.append(inp.placed(partial(render.pod_manifest, inp.job, d.attempt, rank, replicas, resume,
                                                 d.avoid(inp), master, agent)))
    if not missing and all(p.phase == "Running" for p in current):
        d.set_phase(c.RUNNING)
        goodput.running(d.raw, inp.now)
        history.record_nodes(d.status, d.attempt, current)
        d.condition(c.COND_RUNNING, True, c.REASON_ALL_RUNNING, f"all {replicas} workers are running")
        d.condition(c.COND_RECOVERING, False, c.REASON_ALL_RUNNING, f"attempt {d.attempt} is running")
        d.event("Normal", c.REASON_ALL_RUNNING, f"attempt {d.attempt}: all {replicas} workers running")


def _handing_over(inp: Inputs, d: Draft, replicas: int, resume: Verdict | None) -> bool:
    """Kept pods are still taking their plans (resend them; no new pod before they did): True. Those whose
    time is up are replaced by new pods for their ranks."""
    pending, overdue, left = handover.follow(d.status, d.attempt, inp.pods, inp.now, inp.config,
                                             inp.undeliverable)
    if overdue:
        reasons: dict[str, list[str]] = {}
        for name, reason in overdue.items():
            reasons.setdefault(reason, []).append(name)
        why = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items())
        why = f"attempt {d.attempt}'s plan did not reach every kept pod ({why}): replacing them with new pods"
        replace = set(overdue)
        if handover.master(d.status, d.attempt) in replace:  # the rendezvous host: every plan names it
            replace |= {p.name for p in d.current(inp)} | set(pending)
            pending = {}
            handover.give_up(d.status)
            why += "; the rendezvous host was among them, so the whole attempt gets new pods"
        d.fence([p for p in inp.pods if p.name in replace])
        history.note_fallback(d.status, d.attempt, sorted(replace), why)
        d.event("Warning", c.REASON_IN_PLACE_FALLBACK, why)
    if not pending:
        return False
    master = handover.master(d.status, d.attempt) or ""
    for pod in inp.pods:
        if pod.name in pending:
            d.plan.deliver.append(handover.delivery(inp.job, inp.config, pod, pending[pod.name], d.attempt,
                                                    replicas, resume, master))
    d.plan.look_again(min(1.0, left))
    return True


def _grow_back(inp: Inputs, d: Draft, replicas: int) -> growback.Grow | None:
    """Note capacity coming back (status.growBack); the decision to restart larger, once it is time."""
    st = d.status
    latest = (st.get("latestCheckpoint") or {}).get("step", -1)
    # At full size no capacity can make it larger: the count of every node's slots (most of a pass over a
    # few hundred nodes) is needed only below it.
    full = replicas >= min(inp.job.spec.replicas, inp.job.spec.elastic.max_replicas)
    target = None if full else d.target_replicas(inp, within_admission=False)[0]
    decision = growback.decide(replicas, target, latest, st.get("growBack"))
    if decision.action == growback.NONE:
        st.pop("growBack", None)
    elif decision.action == growback.NOTICE:
        assert decision.target is not None
        st["growBack"] = {"replicas": decision.target, "sinceStep": latest}
        d.event("Normal", c.REASON_GROW_BACK, decision.message(replicas, ""))
    elif decision.action == growback.WAIT:
        assert decision.target is not None
        st["growBack"]["replicas"] = decision.target
    else:
        return decision
    return None
