"""Per-rank step time while running: the slowest pod (and its node) named in status, so a straggler shows.

The launchers report each pod's slowest local rank and its recent step time (resilient_contract.progress).
A synchronous step runs at the pace of the slowest rank, so the slowest pod of the gang is where to look.
Rewritten when the slowest node changes or every REFRESH_SECONDS, not on every report.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from resilient_operator.core.model import PodView, Progress
from resilient_operator.core.status import JobStatus, StepProgress
from resilient_operator.core.timeutil import fmt, parse

REFRESH_SECONDS = 30.0


def summarise(status: JobStatus, attempt: int, reports: Sequence[Progress],
              pods: Sequence[PodView], now: datetime) -> None:
    ours = [r for r in reports if r.attempt == attempt and r.step_seconds is not None]
    if not ours:
        return
    slowest = max(ours, key=lambda r: (r.step_seconds or 0.0, r.pod))
    node = next((p.node_name for p in pods if p.name == slowest.pod), None)
    old = status.get("progress") or {}
    last = parse(old.get("updatedAt")) if isinstance(old, dict) else None
    if old.get("attempt") == attempt and old.get("slowestNode") == node and last and (
        (now - last).total_seconds() < REFRESH_SECONDS
    ):
        return
    entry: StepProgress = {"attempt": attempt, "step": min(r.step for r in ours), "slowestPod": slowest.pod,
                             "stepSeconds": round(slowest.step_seconds or 0.0, 4), "updatedAt": fmt(now)}
    if node:
        entry["slowestNode"] = node
    if slowest.slowest_rank is not None:
        entry["slowestRank"] = slowest.slowest_rank
    status["progress"] = entry
