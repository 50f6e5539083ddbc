"""The launch step (between attempts): wait for the fenced pods to go, for backoff, settling capacity and a
readable checkpoint root; then start the next attempt at the size the healthy capacity allows."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from resilient_contract.storage.names import step_dir_name
from resilient_operator import constants as c
from resilient_operator.core import (
    badcheckpoints,
    capacity,
    drain,
    goodput,
    handover,
    history,
    inplace,
    render,
    rootstate,
    settle,
)
from resilient_operator.core.model import PodView
from resilient_operator.core.steps.draft import FENCE_RECHECK_SECONDS, Draft, Inputs
from resilient_operator.core.timeutil import parse

MAX_SKIPPED_EVENTS = 3
# A node that went quiet with the lost one may be about to follow it: recheck this often.
UNSETTLED_RECHECK_SECONDS = 1.0
# A level-triggered safety net for a job waiting for capacity (a watch can miss node events across an outage).
CAPACITY_RECHECK_SECONDS = 30.0
# The listing names a checkpoint recorded as corrupt (discovered before it was recorded): the next discovery
# leaves it out (status.badCheckpoints), so look again soon.
BAD_CHECKPOINT_RECHECK_SECONDS = 1.0


def relaunch(inp: Inputs, d: Draft) -> None:
    """Launch the next attempt once nothing is in the way; otherwise say what is, and when to look again."""
    if d.phase == c.SUSPENDED:
        d.condition(c.COND_SUSPENDED, False, c.REASON_RESUMED, "spec.suspend is false")
        d.count_planned()
        d.set_phase(c.RESTARTING)
        d.event("Normal", c.REASON_RESUMED, "resuming from the latest complete checkpoint")
    kept = {p.name for p in d.keep(inp)}  # restartStrategy InPlace: these carry on into the next attempt
    if leftovers := [p for p in inp.pods if p.attempt <= d.attempt and p.name not in kept]:
        d.fence(leftovers)
        if not _gone_once_applied(leftovers, d):
            d.plan.look_again(FENCE_RECHECK_SECONDS)  # their deletion events normally bring us back first
            return
    if kept and (save := _drain_save_wait(inp, d)):
        d.plan.look_again(min(1.0, save))  # the discovery of the next pass may show the checkpoint
        return
    if d.phase == c.BACKING_OFF:
        retry = parse(d.status.get("nextRetryTime"))
        if retry and inp.now < retry:
            d.plan.look_again((retry - inp.now).total_seconds())
            return
    if d.phase == c.RESTARTING:
        silent = capacity.quiet(inp.health, inp.healthy_capacity)
        if silent:  # a node that went quiet with the lost one may be about to follow it: restart once
            d.plan.look_again(max(0.1, min(UNSETTLED_RECHECK_SECONDS, *silent.values())))
            return
    if _settling(inp, d):
        return
    replicas, cap = d.target_replicas(inp)
    if replicas is None:
        message = capacity.below_minimum(inp.job.spec.elastic, cap)
        if d.phase != c.WAITING_FOR_CAPACITY:
            d.event("Warning", c.REASON_BELOW_MIN, message)
        d.set_phase(c.WAITING_FOR_CAPACITY)
        d.condition(c.COND_CAPACITY, False, c.REASON_BELOW_MIN, message)
        d.plan.look_again(CAPACITY_RECHECK_SECONDS)  # node events normally bring us back first
        for until in d.bad_nodes(inp.now).values():  # an avoided node becomes usable again with no event
            d.plan.look_again((until - inp.now).total_seconds())
        return
    d.condition(c.COND_CAPACITY, True, c.REASON_ENOUGH, f"the healthy nodes hold {cap} workers")
    ok, wait = rootstate.launchable(inp.listing, inp.job.root_in_use_by, bool(d.status.get("latestCheckpoint")))
    d.plan.look_again(wait)
    if ok and inp.listing.latest and badcheckpoints.refused(d.status, inp.listing.latest.path):
        d.plan.look_again(BAD_CHECKPOINT_RECHECK_SECONDS)  # never inject a checkpoint a trainer refused
        return
    if ok:  # otherwise the storage condition says why; retried on a timer
        _launch(inp, d, replicas)


def _gone_once_applied(leftovers: Sequence[PodView], d: Draft) -> bool:
    """Whether every leftover is force-deleted by this very plan (a pod on a lost node, grace period 0).

    The API server removes such a pod at once, and waiting to see it gone proves nothing about its containers
    (no kubelet answers for them; the lineage rule fences their late saves), so the launch goes in the same
    plan: the shell applies the deletes before the status that names the next attempt, and stops at a failed
    one. A graceful deletion is different: it ends when the kubelet has stopped the containers, so the launch
    waits for it (the old workers are gone before the new ones start)."""
    return {p.name for p in leftovers} <= set(d.plan.force_delete)


def _drain_save_wait(inp: Inputs, d: Draft) -> float:
    """After a drain in place: seconds still to wait for the stopped gang's checkpoint (drain.save_wait)."""
    last = d.status.get("lastDrain") or {}
    if last.get("attempt") != d.attempt:
        return 0.0
    latest = inp.listing.latest.step if inp.listing.latest else None
    return drain.save_wait(last.get("step"), latest, parse(last.get("time")), inp.now, inp.job.spec.grace_seconds)


def _settling(inp: Inputs, d: Draft) -> bool:
    """Full capacity is seconds away (a node Ready again, its lifecycle taint about to go): wait, bounded."""
    st = d.status
    wait = settle.decide(inp.health, inp.placement, inp.desired, inp.job.spec.elastic, inp.now,
                         inp.config.settle_seconds, parse(st.get("settlingSince")), inp.healthy_capacity)
    if wait is None:
        st.pop("settlingSince", None)
        return False
    if "settlingSince" not in st:
        st["settlingSince"] = inp.ts
        d.event("Normal", c.REASON_SETTLING, wait.message)
    d.plan.look_again(wait.seconds)
    return True


def _launch(inp: Inputs, d: Draft, replicas: int) -> None:
    st, job, resume = d.status, inp.job, inp.listing.latest
    previous = int(st.get("replicas") or 0)
    attempt = d.attempt + 1
    previous_pods = d.current(inp)  # (before the status moves on to the new attempt)
    arrangement = inplace.arrange(previous_pods, d.keep(inp), replicas)
    for skipped in inp.listing.skipped[:MAX_SKIPPED_EVENTS]:
        d.event("Warning", c.REASON_CHECKPOINT_SKIPPED, f"not resuming from {skipped.path}: {skipped.reason}")
    st["attempt"] = attempt
    st["replicas"] = replicas
    st.pop("nextRetryTime", None)
    st.pop("inPlace", None)
    st.pop("growBack", None)
    st.setdefault("startTime", inp.ts)
    if resume:
        st["resumedFrom"] = {"path": resume.path, "step": resume.step}
    else:
        st.pop("resumedFrom", None)
    d.set_phase(c.STARTING)
    history.open_entry(d.status, attempt, replicas, resume.step if resume else None, inp.ts)
    goodput.launched(d.raw, inp.now, resume.step if resume else None)
    d.plan.create.append(partial(render.service_manifest, job))
    d.plan.create.append(partial(render.pdb_manifest, job, attempt, replicas))
    if attempt > 1:  # the previous attempt's pods are gone or moving into this one: its budget protects nothing
        d.plan.release.append(drain.pdb_name(job.name, attempt - 1))
    how = ""
    if arrangement.kept:  # in place: kept pods get plans; new pods only once they took them (watch step)
        d.fence([p for p in previous_pods if p.name in arrangement.replaced])  # kept beyond the new size
        handover.open_handover(d.status, attempt, arrangement.kept, inp.ts)
        master = arrangement.master or ""
        for pod in previous_pods:
            if pod.name in arrangement.kept:
                d.plan.deliver.append(handover.delivery(job, inp.config, pod, arrangement.kept[pod.name], attempt,
                                                        replicas, resume, master))
        history.note_restart(d.status, attempt, c.RestartStrategy.IN_PLACE, list(arrangement.kept),
                             arrangement.replaced)
        how = (f" in place (kept {len(arrangement.kept)} pods; new pods for ranks "
               f"{', '.join(map(str, arrangement.new_ranks)) or 'none'})")
    else:
        for rank in range(replicas):
            d.plan.create.append(inp.placed(partial(render.pod_manifest, job, attempt, rank, replicas, resume,
                                                    d.avoid(inp), None, handover.agent(job, inp.config))))
        if attempt > 1:
            history.note_restart(d.status, attempt, c.RestartStrategy.RECREATE)
    source = f"from {step_dir_name(resume.step)}" if resume else "from scratch (no complete checkpoint)"
    if attempt == 1:
        d.event("Normal", c.REASON_STARTED, f"started {replicas} workers ({job.spec.replicas} desired) {source}")
    else:
        failure = st.get("lastFailure") or {}
        after = f" after: {failure['message']}" if failure.get("attempt") == attempt - 1 else ""
        d.event("Normal", c.REASON_STARTED,
                f"restarted {previous} -> {replicas} workers{how} {source} as attempt {attempt}{after}")
