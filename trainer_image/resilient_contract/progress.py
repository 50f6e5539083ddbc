"""Progress reports: how far each pod's ranks got, written by the launcher, read by the operator.

Workers have no API rights, so progress travels through the job's own storage, like checkpoints: the
launcher of each pod rewrites `<checkpoint root>/_RTJ_PROGRESS/<pod name>.json` (temp file + rename) a few
seconds apart while its ranks step. The operator reads the files of the current attempt's pods only, at
most MAX_REPORT_BYTES each, and treats every field as hostile: a bad file is ignored, and what a report
says is only ever used for accounting (goodput, step times) and to name the rank that stopped first.

Inside a pod, each rank writes its own tiny file `<RTJ_PROGRESS_DIR>/rank-<global rank>` (`<step>
<seconds of its last step> <time>`) after every step; the launcher compares them (hang watchdog) and
summarises them here. Torch-free: the operator imports this module.

A report may carry the launcher's hang verdict (`hung`: the step, the rank that stopped first, how long it
stalled, the timeout). A plain launcher also ends its pod with RTJ_HUNG; an in-place agent keeps its pod
and waits for a plan, so for it this report is how the operator learns of the hang.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from typing import Any

from resilient_contract.storage.base import StoreReader
from resilient_contract.storage.local import LocalStore

DIRNAME = "_RTJ_PROGRESS"  # in the checkpoint root; never matches a step directory
MAX_REPORT_BYTES = 4096
# Every number in a report is bounded where it is parsed: what a datetime, an int64 status field and the
# checkpoint layout can hold. Anything outside is not a report.
MAX_EPOCH = 253402300799.0  # 9999-12-31T23:59:59Z: the last second a datetime can hold
MAX_STEP = 10**10 - 1  # the largest step the checkpoint layout names (storage.names.STEP_DIGITS)
MAX_ATTEMPT = 2**31 - 1
RANK_DIR_ENV = "RTJ_PROGRESS_DIR"  # set by the launcher for its ranks: a pod-local directory
TIMEOUT_ENV = "RTJ_PROGRESS_TIMEOUT_SECONDS"  # injected from spec.progressTimeoutSeconds; absent: no watchdog


@dataclass(frozen=True)
class Hang:
    """A launcher's hang verdict: its local rank that stopped first, at which step, for how long."""

    step: int
    rank: int
    stalled_seconds: float
    timeout_seconds: float


@dataclass(frozen=True)
class Report:
    pod: str
    attempt: int
    step: int  # the lowest step any local rank completed
    time: float  # epoch seconds of the report (the pod's clock)
    first_step_at: float | None  # epoch seconds of this attempt's first completed step in this pod
    step_seconds: float | None  # the slowest local rank's recent step time
    slowest_rank: int | None
    hung: Hang | None = None  # the watchdog declared a hang (its generation is killed)


def report_path(checkpoint_root: str, pod: str) -> str:
    return os.path.join(checkpoint_root, DIRNAME, f"{pod}.json")


def write_report(checkpoint_root: str, report: Report) -> None:
    target = report_path(checkpoint_root, report.pod)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(to_json(report), f)
    os.replace(tmp, target)


def to_json(report: Report) -> dict[str, Any]:
    """The report as its file holds it (and as the operator's discovery worker hands it over): `parse_report`
    reads exactly this."""
    return {"pod": report.pod, "attempt": report.attempt, "step": report.step, "time": report.time,
            "firstStepAt": report.first_step_at, "stepSeconds": report.step_seconds,
            "slowestRank": report.slowest_rank, **_hang_json(report.hung)}


def _hang_json(hang: Hang | None) -> dict[str, Any]:
    if hang is None:
        return {}
    return {"hung": {"step": hang.step, "rank": hang.rank, "stalledSeconds": hang.stalled_seconds,
                     "timeoutSeconds": hang.timeout_seconds}}


def _parse_hang(value: Any) -> Hang | None:
    """A hang verdict, or None when there is none or it is not one (every field bounded)."""
    if not isinstance(value, dict):
        return None
    step, rank = _num(value.get("step"), 0, MAX_STEP), _num(value.get("rank"), 0, MAX_ATTEMPT)
    stalled, timeout = _num(value.get("stalledSeconds"), 0, MAX_EPOCH), _num(value.get("timeoutSeconds"), 0, MAX_EPOCH)
    if step is None or rank is None or stalled is None or timeout is None:
        return None
    return Hang(int(step), int(rank), stalled, timeout)


def _num(value: Any, lo: float, hi: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and not lo <= value <= hi:  # float() of a 4000-digit int raises
        return None
    v = float(value)
    return v if math.isfinite(v) and lo <= v <= hi else None


def parse_report(raw: bytes, pod: str) -> Report | None:
    """A report, or None when the bytes are not one for this pod (hostile input: validate everything)."""
    if len(raw) > MAX_REPORT_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: deeply nested arrays
        return None
    if not isinstance(data, dict) or data.get("pod") != pod:
        return None
    attempt, step = _num(data.get("attempt"), 0, MAX_ATTEMPT), _num(data.get("step"), 0, MAX_STEP)
    when = _num(data.get("time"), 0, MAX_EPOCH)
    if attempt is None or step is None or when is None:
        return None
    rank = _num(data.get("slowestRank"), 0, MAX_ATTEMPT)
    return Report(pod, int(attempt), int(step), when, _num(data.get("firstStepAt"), 0, MAX_EPOCH),
                  _num(data.get("stepSeconds"), 0, 86400), int(rank) if rank is not None else None,
                  _parse_hang(data.get("hung")))


def read_report(checkpoint_root: str, pod: str) -> Report | None:
    """One pod's report from a mounted root (see `read_report_from`)."""
    try:
        store = LocalStore(checkpoint_root)
    except OSError:
        return None
    try:
        return read_report_from(store, pod)
    finally:
        store.close()


def read_report_from(store: StoreReader, pod: str) -> Report | None:
    """Read one pod's report through the checkpoint store: no link followed below the root, no FIFO opened, at
    most MAX_REPORT_BYTES; None when there is no valid report."""
    try:
        raw = store.read_bytes(f"{DIRNAME}/{pod}.json", MAX_REPORT_BYTES)
    except OSError:  # a symlink, FIFO, oversize file, missing root...: no report
        return None
    return parse_report(raw, pod) if raw is not None else None


def write_rank(directory: str, rank: int, step: int, step_seconds: float, now: float) -> None:
    """One rank's line after each step: cheap (a local file, no fsync), overwritten in place."""
    path = os.path.join(directory, f"rank-{rank}")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{step} {step_seconds:.6f} {now:.3f}\n")
    os.replace(tmp, path)


def read_ranks(directory: str) -> dict[int, tuple[int, float, float]]:
    """rank -> (step, step seconds, time) for every rank file in a pod-local directory."""
    out: dict[int, tuple[int, float, float]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if not name.startswith("rank-") or name.endswith(".tmp"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                step, secs, when = f.read(200).split()
            out[int(name[5:])] = (int(step), float(secs), float(when))
        except (OSError, ValueError):
            continue
    return out


def report_step(step: int, step_seconds: float, now: float, rank: int | None = None) -> None:
    """A rank's call after each step (no-op outside the launcher): its global rank from $RANK."""
    directory = os.environ.get(RANK_DIR_ENV)
    if not directory:
        return
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    with contextlib.suppress(OSError):  # progress is advisory; never fail a training step over it
        write_rank(directory, rank, step, step_seconds, now)
