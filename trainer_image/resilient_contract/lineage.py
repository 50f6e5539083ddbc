"""Fencing tokens in the checkpoint lineage: which attempt wrote a step directory, and whether it still may.

Force-deleting a lost node's pods removes them from the API, not from the machine: a partitioned gang can
keep running and saving after the operator started the next attempt against the same root. So every save
says who wrote it, every attempt says where it started from, and the completeness rule (`storage.check_step`)
accepts a directory only if no newer attempt of the same job had fenced its writer when it was written:

- `<root>/_RTJ_ATTEMPT-<job>-<10-digit attempt>` (a *fence mark*): created exclusively by rank 0 of each
  attempt before it saves anything: `{"job": ..., "attempt": N, "resumed_step": S | null}` (null: a fresh
  start). The operator's own record of the same decision (status.history: attempt, resumedFromStep) is
  merged in, so the rule holds even before the new gang wrote its mark.
- `<step dir>/.rtj-writer` (a *writer token*): `attempt=N job=<job>`, written by rank 0 right after it
  created the directory (exclusively: `mkdir`, never reused), before any shard. The fence marks are checked
  again before `.metadata` is committed, and a writer that finds a newer attempt's mark stops saving.
- A step directory is `step-<10 digits>`; when another attempt already holds that name, the save goes to
  `step-<10 digits>.a<attempt>`: no directory is ever shared by two attempts.

`<job>` is the job's uid (`RTJ_JOB_UID`; `local` outside the operator): attempt numbers restart when a job
is recreated over the same root, so the rule compares only marks and tokens of one job incarnation.

The rule: a directory of step s written by attempt a is refused if some newer attempt b > a of the same job
started from a step r_b < s (or from scratch): a's gang wrote it after b's launch fenced a (or on a branch b
abandoned). Directories without a token (older than tokens), or with another incarnation's, are judged by
the other rules only. Torch-free and I/O-free: `storage` reads these files, the `Checkpointer` writes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MARKER_PREFIX = "_RTJ_ATTEMPT-"
WRITER_FILE = ".rtj-writer"
REFUSED_FILE = ".rtj-refused"  # left by a fenced gang in a directory whose save it gave up (evidence)
LOCAL_JOB = "local"
MAX_TOKEN_BYTES = 512  # both files are tiny; anything longer is not ours
MAX_MARKS = 256  # the newest marks of a job that discovery reads
MAX_ATTEMPT = 10**9 - 1  # what a 9-digit writer token can name
MAX_STEP = 10**10 - 1  # what a 10-digit step directory can name
_JOB = r"[A-Za-z0-9][A-Za-z0-9-]{0,63}"
_MARKER_RE = re.compile(rf"^{MARKER_PREFIX}({_JOB})-([0-9]{{10}})$", re.ASCII)
_WRITER_RE = re.compile(rf"^attempt=([0-9]{{1,9}}) job=({_JOB})\s*$", re.ASCII)


def job_id(uid: str | None) -> str:
    """The job identity marks and tokens carry: the uid, or `local` for a run outside the operator."""
    return uid if uid and re.fullmatch(_JOB, uid) else LOCAL_JOB


def marker_name(job: str, attempt: int) -> str:
    return f"{MARKER_PREFIX}{job}-{attempt:010d}"


def parse_marker_name(name: str) -> tuple[str, int] | None:
    match = _MARKER_RE.match(name)
    return (match.group(1), int(match.group(2))) if match else None


def format_marker(job: str, attempt: int, resumed_step: int | None) -> bytes:
    return json.dumps({"job": job, "attempt": attempt, "resumed_step": resumed_step}).encode()


def parse_marker(data: bytes | None) -> tuple[str, int, int | None] | None:
    """(job, attempt, resumed step) from a fence mark, or None if it is not one of ours."""
    if data is None or len(data) > MAX_TOKEN_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    job, attempt, resumed = doc.get("job"), doc.get("attempt"), doc.get("resumed_step")
    if not isinstance(job, str) or job_id(job) != job:
        return None
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= MAX_ATTEMPT:
        return None
    if resumed is not None and (not isinstance(resumed, int) or isinstance(resumed, bool)
                                or not 0 <= resumed <= MAX_STEP):
        return None
    return job, attempt, resumed


def format_writer(job: str, attempt: int) -> bytes:
    return f"attempt={attempt} job={job}\n".encode()


def parse_writer(data: bytes | None) -> tuple[str, int] | None:
    """(job, attempt) from a writer token, or None."""
    if data is None or len(data) > MAX_TOKEN_BYTES:
        return None
    try:
        match = _WRITER_RE.match(data.decode("ascii"))
    except UnicodeDecodeError:
        return None
    return (match.group(2), int(match.group(1))) if match else None


@dataclass(frozen=True)
class Lineage:
    """Where each known attempt of one job started: attempt -> the step it resumed from (None: from scratch)."""

    job: str
    starts: Mapping[int, int | None]
    known: int | None = None  # the operator's newest attempt: marks and tokens past it name no real attempt

    @classmethod
    def merge(cls, job: str, *sources: Iterable[tuple[int, int | None]], newest: int | None = None) -> Lineage:
        """Later sources win for the same attempt (pass the operator's record last: it made the decision).
        With `newest` (the operator's newest launched attempt), a mark naming a later attempt is ignored: a forged
        mark must not fence the job's own checkpoints."""
        starts: dict[int, int | None] = {}
        for source in sources:
            for attempt, resumed in source:
                if newest is None or attempt <= newest:
                    starts[attempt] = resumed
        return cls(job, starts, newest)

    @property
    def newest(self) -> int:
        return max(self.starts, default=0)

    def fenced_by(self, step: int, writer: tuple[str, int] | None) -> int | None:
        """The newest attempt that fences a directory of `step` with this writer token, or None."""
        if writer is None or writer[0] != self.job:
            return None
        for attempt in sorted(self.starts, reverse=True):
            if attempt <= writer[1]:
                break
            resumed = self.starts[attempt]
            if resumed is None or step > resumed:
                return attempt
        return None

    def refusal(self, step: int, writer: tuple[str, int] | None) -> str | None:
        """Why the rule refuses this directory, or None if the lineage admits it."""
        if writer is not None and writer[0] == self.job and self.known is not None and writer[1] > self.known:
            # no such attempt was ever launched: a token that lies about its writer (to escape the fence)
            return (f"its writer token names attempt {writer[1]}, which this job never launched (newest: "
                    f"{self.known})")
        fence = self.fenced_by(step, writer)
        if fence is None or writer is None:
            return None
        start = self.starts[fence]
        origin = f"step {start}" if start is not None else "scratch"
        return (f"written by attempt {writer[1]} after attempt {fence} fenced it (attempt {fence} started from "
                f"{origin}): a cut-off gang kept saving")
