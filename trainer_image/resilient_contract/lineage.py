"""Fencing tokens in the checkpoint lineage: which attempt wrote a step directory, and whether it still may.

Force-deleting a lost node's pods removes them from the API, not from the machine: a partitioned gang can
keep running and saving after the operator started the next attempt against the same root. So every save
says who wrote it, and every attempt says where it started from, and the completeness rule (in `layout`)
accepts a directory only if no newer attempt had fenced its writer when it was written:

- `<root>/.rtj-fence/attempt-<10 digits>`: written by rank 0 of each attempt before it saves anything,
  `{"attempt": N, "resumed_step": S | null}` (null: a fresh start). The operator's own record of the same
  decision (status.history: attempt, resumedFromStep) is merged in, so the rule holds even before the new
  gang wrote its mark.
- `<step dir>/.rtj-writer`: `attempt=N`, written by rank 0 right after it created the directory
  (exclusively: `mkdir`, never reused), before any shard, and checked against the fence marks again
  before `.metadata` is committed.
- A step directory is named `step-<10 digits>`; when another attempt already holds that name, the save
  goes to `step-<10 digits>.a<attempt>`: no directory is ever shared by two attempts.

The rule: a directory of step s written by attempt a is refused if some newer attempt b > a started from
step r_b < s (or from scratch): a's gang wrote it after b's launch fenced a (or on a branch b abandoned).
Directories with no writer token predate fencing tokens and are judged by the other rules only.
Torch-free and I/O-free: `layout` reads the files, the `Checkpointer` writes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FENCE_DIR = ".rtj-fence"
WRITER_FILE = ".rtj-writer"
MAX_TOKEN_BYTES = 256  # both files are tiny; anything longer is not ours
_MARKER_RE = re.compile(r"^attempt-(\d{10})$")
_WRITER_RE = re.compile(rb"^attempt=(\d{1,9})\s*$")


def marker_name(attempt: int) -> str:
    return f"attempt-{attempt:010d}"


def parse_marker_name(name: str) -> int | None:
    match = _MARKER_RE.match(name)
    return int(match.group(1)) if match else None


def format_marker(attempt: int, resumed_step: int | None) -> bytes:
    return json.dumps({"attempt": attempt, "resumed_step": resumed_step}).encode()


def parse_marker(data: bytes) -> tuple[int, int | None] | None:
    """(attempt, resumed step) from a fence mark, or None if it is not one of ours."""
    if len(data) > MAX_TOKEN_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    attempt, resumed = doc.get("attempt"), doc.get("resumed_step")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        return None
    if resumed is not None and (not isinstance(resumed, int) or isinstance(resumed, bool) or resumed < 0):
        return None
    return attempt, resumed


def format_writer(attempt: int) -> bytes:
    return f"attempt={attempt}\n".encode()


def parse_writer(data: bytes | None) -> int | None:
    if data is None or len(data) > MAX_TOKEN_BYTES:
        return None
    match = _WRITER_RE.match(data)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Lineage:
    """Where each known attempt started: attempt -> the step it resumed from (None: from scratch)."""

    starts: Mapping[int, int | None]

    @classmethod
    def merge(cls, *sources: Iterable[tuple[int, int | None]]) -> Lineage:
        """Later sources win for the same attempt (pass the operator's record last: it made the decision)."""
        starts: dict[int, int | None] = {}
        for source in sources:
            for attempt, resumed in source:
                starts[attempt] = resumed
        return cls(starts)

    @property
    def newest(self) -> int:
        return max(self.starts, default=0)

    def fenced_by(self, step: int, writer: int | None) -> int | None:
        """The newest attempt that fences a directory of `step` written by `writer`, or None if none does."""
        if writer is None:
            return None
        for attempt in sorted(self.starts, reverse=True):
            if attempt <= writer:
                break
            resumed = self.starts[attempt]
            if resumed is None or step > resumed:
                return attempt
        return None

    def refusal(self, step: int, writer: int | None) -> str | None:
        """Why the rule refuses this directory, or None if the lineage admits it."""
        fence = self.fenced_by(step, writer)
        if fence is None:
            return None
        start = self.starts[fence]
        origin = f"step {start}" if start is not None else "scratch"
        return (f"written by attempt {writer} after attempt {fence} fenced it (attempt {fence} started from "
                f"{origin}): a partitioned gang kept saving")
