"""The stop step: end an attempt, for the reason the watch step found or because the job is suspended.

A failure spends a budget (or fails the job); draining nodes and growing back are planned stops (no budget);
a suspended job stops and waits. Each closes the attempt's history entry, times the interruption for
goodput, fences the pods and says what happens next in a condition and an event.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from resilient_contract.storage.names import step_dir_name
from resilient_operator import constants as c
from resilient_operator.core import badnodes, budgets, drain, failures, goodput, growback
from resilient_operator.core.model import PodView
from resilient_operator.core.steps.draft import ACTIVE, Draft, Inputs, Interruption
from resilient_operator.core.timeutil import fmt


def interrupt(inp: Inputs, d: Draft, why: Interruption | None) -> None:
    """Carry out what the watch step found, if anything."""
    current = d.current(inp)
    if isinstance(why, failures.Failure):
        _on_failure(inp, d, why, current)
    elif isinstance(why, growback.Grow):
        _grow(inp, d, why, current)
    elif why:
        _drain(inp, d, current, why)


def suspend(inp: Inputs, d: Draft) -> None:
    """spec.suspend: stop the gang (timed like an interruption) and wait until it is false again."""
    d.fence(inp.pods)
    if d.phase != c.SUSPENDED:
        if d.phase in ACTIVE:  # a stopped gang trains nothing: timed like an interruption
            goodput.open_recovery(d.raw, c.SUSPENDED, inp.now, inp.now, d.reached(inp))
        d.close_history(c.REASON_SUSPENDED)
        d.set_phase(c.SUSPENDED)
        d.condition(c.COND_RUNNING, False, c.REASON_SUSPENDED, "the job is suspended")
        d.event("Normal", c.REASON_SUSPENDED, f"suspended attempt {d.attempt}; its pods are being deleted "
                "and the job resumes from the latest checkpoint when spec.suspend is false")
    d.condition(c.COND_SUSPENDED, True, c.REASON_SUSPENDED, "spec.suspend is true")


def fail(inp: Inputs, d: Draft, reason: str, message: str) -> None:
    d.set_phase(c.FAILED)
    d.status["completionTime"] = inp.ts
    d.plan.release.append(drain.pdb_name(inp.job.name, d.attempt))
    d.condition(c.COND_FAILED, True, reason, message)
    d.condition(c.COND_RUNNING, False, reason, message)
    d.condition(c.COND_RECOVERING, False, reason, "the job failed")
    d.event("Warning", reason, message)


def _on_failure(inp: Inputs, d: Draft, failure: failures.Failure, current: Sequence[PodView]) -> None:
    st = d.status
    st["lastFailure"] = {"kind": failure.kind, "reason": failure.reason, "message": failure.message,
                         "attempt": d.attempt, "time": inp.ts}
    if failure.node is not None:
        st["lastFailure"]["node"] = failure.node
    if failure.pod is not None:
        st["lastFailure"]["pod"] = failure.pod
    if failure.exit_code is not None:
        st["lastFailure"]["exitCode"] = failure.exit_code
    goodput.open_recovery(d.raw, failure.kind, _occurred(inp, failure, current), inp.now, d.reached(inp))
    _blame(inp, d, failure)
    d.close_history(failure.reason)
    d.fence_all_but_kept(inp, current)
    where = f" on node {failure.node}" if failure.node else ""
    d.event("Warning", failure.reason, f"attempt {d.attempt} broken{where}: {failure.message}")
    spent = budgets.spend(failure.kind, d.raw["restarts"], inp.job.spec.failure)
    if spent.exhausted:
        fail(inp, d, spent.budget_reason, spent.exhausted_message(failure.message))
        return
    d.raw["restarts"][spent.key] = spent.count
    d.condition(c.COND_RUNNING, False, failure.reason, failure.message)
    d.condition(c.COND_RECOVERING, True, failure.reason,
                f"fencing attempt {d.attempt} and restarting: {failure.message}")
    if spent.backoff_seconds is None:
        d.set_phase(c.RESTARTING)
        return
    st["nextRetryTime"] = fmt(inp.now + timedelta(seconds=spent.backoff_seconds))
    d.set_phase(c.BACKING_OFF)
    d.event("Normal", c.REASON_BACKOFF, spent.backoff_message)


def _occurred(inp: Inputs, failure: failures.Failure, current: Sequence[PodView]) -> datetime:
    """The last sign of life before the failure: a lost node's lease, a failed pod's exit, else now."""
    if failure.lost_nodes:
        renewals = [n.lease_renewed for name in failure.lost_nodes
                    if (n := inp.health.nodes.get(name)) and n.lease_renewed]
        if renewals:
            return min(renewals)
    if failure.occurred is not None:
        return failure.occurred
    pod = next((p for p in current if p.name == failure.pod), None)
    ended = [t.finished_at for t in pod.terminations if t.finished_at] if pod else []
    return min(ended) if ended else inp.now


def _blame(inp: Inputs, d: Draft, failure: failures.Failure) -> None:
    """Remember the node(s) that broke the attempt (infrastructure failures and hangs only)."""
    if failure.kind == c.APPLICATION:
        return
    before = set(d.bad_nodes(inp.now))
    for node in failure.lost_nodes or ((failure.node,) if failure.node else ()):
        lost = node in failure.lost_nodes
        badnodes.record(d.status, node, c.REASON_NODE_LOST if lost else failure.reason, inp.now,
                        inp.job.spec.bad_node_seconds, attested=lost or failure.attested)
    for node, until in sorted(d.bad_nodes(inp.now).items()):
        if node not in before:
            d.event("Normal", c.REASON_AVOID_NODE, f"node {node} broke attempt {d.attempt} ({failure.reason}); "
                    f"this job's next attempts avoid it until {fmt(until)} (spec.badNodeSeconds)")


def _drain(inp: Inputs, d: Draft, current: Sequence[PodView], notices: Sequence[drain.Notice]) -> None:
    """A node of the attempt is about to go with warning: stop the gang gracefully (the trainer saves at its
    current step on SIGTERM) and restart without the draining nodes. A planned restart: no budget spent."""
    where = ", ".join(f"{n.node} ({n.why})" for n in notices)
    message = (f"node {where} is about to go: stopping attempt {d.attempt} gracefully (its workers save a "
               "checkpoint at the current step) and restarting without it")
    d.count_planned()
    d.status["lastDrain"] = {"nodes": [n.node for n in notices], "reason": notices[0].why, "attempt": d.attempt,
                             "time": inp.ts}
    if (reached := d.reached(inp)) is not None:  # in place, the launch waits for a checkpoint this new
        d.status["lastDrain"]["step"] = reached
    d.stop_planned(inp, current, c.REASON_DRAIN, c.RESTARTING, c.COND_RECOVERING, message, in_place=True)


def _grow(inp: Inputs, d: Draft, decision: growback.Grow, current: Sequence[PodView]) -> None:
    """Restart larger at this checkpoint; past the quota Kueue holds, ask it for a new admission first."""
    replicas = int(d.status.get("replicas") or 0)
    latest = (d.status.get("latestCheckpoint") or {}).get("step", -1)
    d.status.pop("growBack", None)
    if (gate := inp.admitted) and decision.target is not None and decision.target > gate.held:
        message = (f"capacity for {decision.target} workers is back but Kueue holds quota for {replicas}; "
                   f"stopping at {step_dir_name(latest)} and asking for a new admission")
        kq = d.kueue(inp)
        kq["replace"], kq["generation"] = True, kq["generation"] + 1
        d.stop_planned(inp, current, c.REASON_REQUEUED_TO_GROW, c.QUEUED, c.COND_QUEUED, message)
        return
    message = decision.message(replicas, step_dir_name(latest))
    d.count_planned()
    goodput.open_recovery(d.raw, c.PLANNED, inp.now, inp.now, d.reached(inp))
    d.close_history(c.REASON_GROW_BACK)
    d.fence_all_but_kept(inp, current)
    d.set_phase(c.RESTARTING)
    d.condition(c.COND_RECOVERING, True, c.REASON_GROW_BACK, message)
    d.event("Normal", c.REASON_GROW_BACK, message)
