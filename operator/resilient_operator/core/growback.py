"""When a job running below its desired size grows back: capacity first, then the next checkpoint.

Growing is a planned restart, so it waits for a complete checkpoint written *after* the capacity was
noticed: the restart then recomputes at most the steps since that checkpoint, not everything since an
older one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Action(StrEnum):
    """What to do about growing back this pass."""

    NONE = "none"  # no target: clear any pending status.growBack
    NOTICE = "notice"  # capacity is back: record the target
    WAIT = "wait"  # for a checkpoint newer than the notice
    RESTART = "restart"  # restart larger now


@dataclass(frozen=True)
class Grow:
    action: Action
    target: int | None = None

    def message(self, running: int, from_step: str) -> str:
        """What the user is told: capacity noticed (NOTICE), or growing now (RESTART)."""
        if self.action == NOTICE:
            return f"capacity for {self.target} workers is back; growing from {running} at the next complete checkpoint"
        return f"growing {running} -> {self.target} workers from {from_step}"


NONE, NOTICE, WAIT, RESTART = Action.NONE, Action.NOTICE, Action.WAIT, Action.RESTART


def decide(running: int, target: int | None, latest_step: int, pending: Mapping[str, Any] | None) -> Grow:
    """`running` workers now, `target` the size capacity allows (None: below the minimum), `pending` the
    status.growBack noted earlier ({replicas, sinceStep})."""
    if target is None or target <= running:
        return Grow(NONE)
    if not pending:
        return Grow(NOTICE, target)
    if latest_step > int(pending.get("sinceStep", -1)):
        return Grow(RESTART, target)
    return Grow(WAIT, target)
