"""Goodput: how much of a job's wall time trained, and where the rest went, from what the operator observes.

Each interruption (a failure, a drain, a hang, a grow-back) opens a *recovery* in `status.goodput.open` and
stamps it as the operator sees each stage; it closes when the next attempt's first new step is reported:

    occurred ─ detection ─► detected ─ fencing ─► launched ─ relaunch ─► running ─ load ─► first step
    + recompute: (step the broken attempt reached - step resumed from) x the step time

`occurred` is the last sign of life the operator has: the lost node's Lease renewal, the failed pod's exit,
the hung pod's last step; a planned restart occurs when it is decided. Steps reached and the first step come
from the launchers' progress reports (files in the job's checkpoint area; workers have no API rights) and
termination messages; without them a recovery closes when its workers run, load and recompute then count 0
(the steps recomputed are still counted from the checkpoint the attempt resumed from).

Totals move at transitions, and the running clock at most every REFRESH_SECONDS, so a running job is not
rewritten on every reconcile.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from datetime import UTC, datetime
from typing import Any

from resilient_operator.core.model import Progress
from resilient_operator.core.timeutil import parse

STAGES = ("detection", "fencing", "relaunch", "load", "recompute")
REFRESH_SECONDS = 60.0
# Without progress reports, a recovery closes this long after its workers run (load counts as 0).
NO_REPORT_CLOSE_SECONDS = 120.0


def _stamp(value: datetime) -> str:
    """RFC 3339 with milliseconds: stages of a recovery are often shorter than a second."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _gp(status: MutableMapping[str, Any]) -> dict[str, Any]:
    gp: dict[str, Any] = status.setdefault("goodput", {})
    gp.setdefault("lost", {s: 0.0 for s in STAGES})
    gp.setdefault("stepsRecomputed", 0)
    gp.setdefault("recoveries", 0)
    return gp


def _secs(a: datetime | None, b: datetime | None) -> float:
    return max(0.0, (b - a).total_seconds()) if a and b else 0.0


def open_recovery(status: MutableMapping[str, Any], kind: str, occurred: datetime, now: datetime,
                  reached_step: int | None) -> None:
    """An attempt broke (or is being stopped on purpose): start timing its recovery."""
    gp = _gp(status)
    if gp.get("open"):
        close(status, now)  # broke again mid-recovery: what was spent so far is lost
    gp.pop("asOf", None)
    start = parse(status.get("startTime"))
    if start is not None:  # a claimed last sign of life (a hang's stall) never predates the job itself
        occurred = max(occurred, start)
    entry: dict[str, Any] = {"kind": kind, "occurredAt": _stamp(min(occurred, now)), "detectedAt": _stamp(now)}
    if reached_step is not None:
        entry["reachedStep"] = reached_step
    gp["open"] = entry


def note_reached(status: MutableMapping[str, Any], step: int | None) -> None:
    """The broken attempt got further than we knew (a later report, a RTJ_PREEMPTED step)."""
    entry = (status.get("goodput") or {}).get("open")
    if entry and step is not None and "launchedAt" not in entry and step > int(entry.get("reachedStep", -1)):
        entry["reachedStep"] = step


def launched(status: MutableMapping[str, Any], now: datetime, resumed_step: int | None) -> None:
    entry = (status.get("goodput") or {}).get("open")
    if entry and "launchedAt" not in entry:
        entry["launchedAt"] = _stamp(now)
        entry["resumedStep"] = resumed_step if resumed_step is not None else 0


def running(status: MutableMapping[str, Any], now: datetime) -> None:
    entry = (status.get("goodput") or {}).get("open")
    if entry and "launchedAt" in entry and "runningAt" not in entry:
        entry["runningAt"] = _stamp(now)


def step_seconds(reports: Sequence[Progress]) -> float | None:
    """The gang's step time: the slowest pod's (a synchronous step waits for it)."""
    times = [r.step_seconds for r in reports if r.step_seconds]
    return max(times) if times else None


def observe(status: MutableMapping[str, Any], attempt: int, reports: Sequence[Progress], now: datetime) -> None:
    """Fold the launchers' reports in: the broken attempt's reach, the new attempt's first step."""
    gp = status.get("goodput") or {}
    entry = gp.get("open")
    if not entry:
        return
    if "launchedAt" not in entry:
        note_reached(status, max((r.step for r in reports if r.attempt == attempt), default=None))
        return
    ours = [r for r in reports if r.attempt == attempt]
    if st := step_seconds(ours):
        gp["stepSeconds"] = round(st, 4)
    resumed = int(entry.get("resumedStep", 0))
    firsts = [r.first_step_at for r in ours if r.first_step_at and r.step > resumed]
    if "runningAt" in entry and firsts:  # a launcher's clock, never believed past the operator's own
        close(status, min(max(min(firsts), parse(entry["runningAt"]) or now), now))
    elif "runningAt" in entry and _secs(parse(entry["runningAt"]), now) >= NO_REPORT_CLOSE_SECONDS and not ours:
        close(status, parse(entry["runningAt"]) or now)


def close(status: MutableMapping[str, Any], first_step: datetime) -> None:
    """Add the open recovery's stages to the totals (stages it never reached end at `first_step`)."""
    gp = _gp(status)
    entry = gp.pop("open", None)
    if not entry:
        return
    marks = [parse(entry.get(k)) for k in ("occurredAt", "detectedAt", "launchedAt", "runningAt")]
    points = [m if m is not None else first_step for m in marks] + [first_step]
    for stage, a, b in zip(STAGES[:4], points[:-1], points[1:], strict=True):
        gp["lost"][stage] = round(float(gp["lost"].get(stage, 0.0)) + _secs(a, b), 2)
    if "launchedAt" in entry:
        steps = max(0, int(entry.get("reachedStep", 0)) - int(entry.get("resumedStep", 0)))
        gp["stepsRecomputed"] = int(gp.get("stepsRecomputed", 0)) + steps
        # Steps and step times come from the tenant's reports: what they claim to have cost is clamped to the
        # job's own wall time so far (no recomputation can take longer than the job has existed).
        wall = _secs(parse(status.get("startTime")), first_step)
        gp["lost"]["recompute"] = round(float(gp["lost"].get("recompute", 0.0))
                                        + min(steps * float(gp.get("stepSeconds") or 0.0), wall), 2)
    gp["recoveries"] = int(gp.get("recoveries", 0)) + 1
    gp.pop("asOf", None)  # totals moved: refresh the ratio now


def summarise(status: MutableMapping[str, Any], now: datetime, force: bool = False) -> None:
    """Productive time and the ratio over the job's wall time so far (or until it finished)."""
    start = parse(status.get("startTime"))
    if not start:
        return
    gp = _gp(status)
    as_of = parse(gp.get("asOf"))
    end = parse(status.get("completionTime")) or now
    if not force and as_of and _secs(as_of, end) < REFRESH_SECONDS:
        return
    lost = sum(float(v) for v in gp["lost"].values())
    entry = gp.get("open")
    if entry:  # an interruption in progress is lost time already
        lost += _secs(parse(entry.get("occurredAt")), end)
    wall = _secs(start, end)
    productive = max(0.0, wall - lost)
    gp["lostSeconds"] = round(min(lost, wall), 1)
    gp["productiveSeconds"] = round(productive, 1)
    gp["ratio"] = round(productive / wall, 4) if wall > 0 else 1.0
    gp["asOf"] = _stamp(end)
