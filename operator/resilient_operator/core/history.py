"""The bounded per-attempt history in status: when each attempt started and ended, why, on which nodes, and
from which step it resumed (the lineage record checkpoint fencing tokens are checked against)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from resilient_operator import constants as c
from resilient_operator.core.model import PodView
from resilient_operator.core.status import HistoryEntry, JobStatus


def open_entry(status: JobStatus, attempt: int, replicas: int, resumed_step: int | None, ts: str) -> None:
    history = status.setdefault("history", [])
    if history and history[-1].get("attempt") == attempt:
        return
    entry: HistoryEntry = {"attempt": attempt, "replicas": replicas, "startTime": ts}
    if resumed_step is not None:
        entry["resumedFromStep"] = resumed_step
    history.append(entry)
    del history[: max(0, len(history) - c.HISTORY_LIMIT)]


def note_restart(status: JobStatus, attempt: int, restart: str, kept: Sequence[str] = (),
                 replaced: Sequence[str] = ()) -> None:
    """How `attempt` was started from the one before it: InPlace (which pods were kept, which replaced) or
    Recreate."""
    history = status.get("history") or []
    if history and history[-1].get("attempt") == attempt:
        history[-1]["restart"] = restart
        if restart == c.RestartStrategy.IN_PLACE:
            history[-1]["kept"] = sorted(kept)
            history[-1]["replaced"] = sorted(replaced)


def note_fallback(status: JobStatus, attempt: int, pods: Sequence[str], why: str) -> None:
    """Kept pods of `attempt` were replaced after all (their agents did not take the plan in time)."""
    history = status.get("history") or []
    if history and history[-1].get("attempt") == attempt:
        entry = history[-1]
        entry["kept"] = sorted(set(entry.get("kept") or ()) - set(pods))
        entry["replaced"] = sorted(set(entry.get("replaced") or ()) | set(pods))
        entry["fallback"] = why


def close_entry(status: JobStatus, attempt: int, reason: str, ts: str) -> None:
    history = status.get("history") or []
    if history and history[-1].get("attempt") == attempt and "endTime" not in history[-1]:
        history[-1]["endTime"] = ts
        history[-1]["endReason"] = reason


def record_nodes(status: JobStatus, attempt: int, pods: Sequence[PodView]) -> None:
    history = status.get("history") or []
    if history and history[-1].get("attempt") == attempt:
        history[-1]["nodes"] = sorted({p.node_name for p in pods if p.node_name})


def lineage_starts(status: Mapping[str, Any]) -> list[tuple[int, int | None]]:
    """(attempt, resumed step or None) for every attempt in the history: the operator's record of where each
    attempt started, which the checkpoint lineage rule (resilient_contract.lineage) fences older writers by."""
    out = []
    for entry in status.get("history") or []:
        attempt, resumed = entry.get("attempt"), entry.get("resumedFromStep")
        if isinstance(attempt, int) and (resumed is None or isinstance(resumed, int)):
            out.append((attempt, resumed))
    return out


def note_late_write(status: JobStatus, attempt: int, step: int, path: str, ts: str) -> HistoryEntry | None:
    """Record on the fenced attempt's history entry that its gang kept saving; the entry, if newly noted."""
    for entry in status.get("history") or []:
        if entry.get("attempt") == attempt:
            seen = entry.get("lateWrite")
            if seen and seen.get("step", -1) >= step:
                return None
            entry["lateWrite"] = {"step": step, "path": path, "time": ts}
            return entry
    return None
