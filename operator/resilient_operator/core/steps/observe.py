"""The observe step: what the world says before any decision. The spec is usable, the attempt in status is
the newest one (a lost status write is rebuilt from the pods), the checkpoint root is readable and its newest
complete checkpoint known, and the launchers' reports are folded into goodput."""

from __future__ import annotations

import posixpath

from resilient_contract import completion
from resilient_contract.storage.names import step_dir_name
from resilient_operator import constants as c
from resilient_operator.core import badcheckpoints, goodput, history, rootstate
from resilient_operator.core.conditions import get_condition
from resilient_operator.core.steps.draft import Draft, Inputs


def refuse_unusable_spec(inp: Inputs, d: Draft) -> bool:
    """A spec the CRD let through but the operator cannot use: say which field, start nothing, stay put."""
    problem = inp.job.problem
    if problem:
        if d.condition(c.COND_SPEC_VALID, False, c.REASON_INVALID_SPEC, problem):
            d.event("Warning", c.REASON_INVALID_SPEC, f"{problem}; no pods are created until the spec is fixed")
        return True
    if (cond := get_condition(d.raw, c.COND_SPEC_VALID)) and cond["status"] == "False":
        d.condition(c.COND_SPEC_VALID, True, c.REASON_SPEC_OK, "the spec is usable again")
    return False


def adopt_newer_attempt(inp: Inputs, d: Draft) -> None:
    """Pods of an attempt newer than status exist: a status write was lost. Rebuild it from the pods."""
    newest = max((p.attempt for p in inp.pods), default=0)
    if newest <= d.attempt:
        return
    pods = [p for p in inp.pods if p.attempt == newest]
    st = d.status
    st["attempt"] = newest
    st["replicas"] = pods[0].launch_replicas or len(pods)
    resume = pods[0].launch_resume
    if resume and resume.path != posixpath.join(inp.job.spec.checkpoint_root, step_dir_name(resume.step)):
        resume = None  # anyone who can edit the pod can write there: inject only a checkpoint of this job's root
    if resume:
        st["resumedFrom"] = {"path": resume.path, "step": resume.step}
    else:
        st.pop("resumedFrom", None)
    if d.phase not in c.TERMINAL_PHASES:
        d.set_phase(c.STARTING)
    history.open_entry(d.status, newest, st["replicas"], resume.step if resume else None, inp.ts)


def checkpoints(inp: Inputs, d: Draft) -> None:
    """The storage condition (core/rootstate.py), the newest complete checkpoint, fenced gangs' late saves, and
    checkpoints a trainer refused as corrupt (core/badcheckpoints.py)."""
    listing, st = inp.listing, d.status
    found = badcheckpoints.reported(inp.pods, inp.job.uid, listing.skipped)
    for bad in badcheckpoints.record(st, inp.job.spec.checkpoint_root, found, inp.ts):
        d.event("Warning", c.REASON_CHECKPOINT_CORRUPT, badcheckpoints.announcement(bad))
    state = rootstate.judge(listing, inp.job.spec.checkpoint_root, inp.job.root_in_use_by,
                            bool(st.get("latestCheckpoint")))
    if state is None:
        return
    d.plan.look_again(state.retry)
    if state.ready is None:
        return
    if d.condition(c.COND_STORAGE, state.ready, state.reason, state.message) and state.event:
        d.event("Warning", state.reason, state.event)
    if not state.ready:
        return
    if listing.latest:
        st["latestCheckpoint"] = {"path": listing.latest.path, "step": listing.latest.step}
    for verdict in listing.skipped:
        if verdict.fenced_writer is not None and (
            entry := history.note_late_write(d.status, verdict.fenced_writer, verdict.step, verdict.path, inp.ts)
        ):
            where = f" on node(s) {', '.join(entry['nodes'])}" if entry.get("nodes") else ""
            d.event("Warning", c.REASON_FENCED_WRITER,
                    f"attempt {verdict.fenced_writer}'s gang{where} was fenced but kept saving: "
                    f"{verdict.path} is refused as a resume source; check that node's containers are gone")


def account(inp: Inputs, d: Draft) -> None:
    """Goodput: fold in the launchers' reports and the steps a stopped attempt says it reached."""
    for pod in d.current(inp):
        for term in pod.terminations:
            outcome = completion.parse_message(term.message)
            if outcome and (step := outcome.int_field("step")) is not None:  # tenant-written: bounded
                goodput.note_reached(d.raw, step)
    goodput.observe(d.raw, d.attempt, inp.progress, inp.now)
