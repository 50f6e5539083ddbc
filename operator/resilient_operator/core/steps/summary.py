"""The summary step: the fields a user reads at a glance (kubectl's columns), and the goodput figures."""

from __future__ import annotations

from resilient_operator import constants as c
from resilient_operator.core import budgets, goodput, handover
from resilient_operator.core.steps.draft import Draft, Inputs


def write(inp: Inputs, d: Draft) -> None:
    st, spec = d.status, inp.job.spec
    st["restartCount"] = budgets.total(d.raw["restarts"])
    # Kept pods taking the attempt's plan in place are its workers already (their move is no status write).
    waiting = handover.waiting(st, d.attempt, inp.pods)
    gang = d.current(inp) + [p for p in inp.pods if p.name in waiting]
    running = sum(1 for p in gang if p.phase == "Running" and not p.deleting)
    st["workers"] = f"{running}/{spec.replicas}"
    st["worldSize"] = int(st.get("replicas") or 0) * spec.nproc_per_node
    st.setdefault("attempt", 0)
    st.setdefault("phase", c.PENDING)
    goodput.summarise(d.raw, inp.now, force=d.phase in c.TERMINAL_PHASES)
