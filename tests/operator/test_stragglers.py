"""stragglers: the running attempt's step and its slowest rank, refreshed at most every REFRESH_SECONDS."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from resilient_operator.core import stragglers
from resilient_operator.core.model import Progress
from resilient_operator.core.timeutil import fmt
from tests.operator.builders import NOW, gang


def report(rank: int, step: int, seconds: float | None, attempt: int = 1) -> Progress:
    return Progress(f"demo-a{attempt}-{rank}", attempt, step, NOW, seconds, slowest_rank=rank * 8)


SLOW = {"attempt": 1, "step": 90, "slowestPod": "demo-a1-1", "stepSeconds": 2.5, "updatedAt": fmt(NOW),
        "slowestNode": "n1", "slowestRank": 8}
RECENT = {**SLOW, "step": 1, "updatedAt": fmt(NOW - timedelta(seconds=5))}


@pytest.mark.parametrize(
    ("name", "reports", "old", "expected"),
    [
        ("no reports: unchanged", [], None, None),
        ("another attempt's reports are ignored", [report(0, 10, 1.0, attempt=2)], None, None),
        ("the slowest rank, the lowest step", [report(0, 100, 1.0), report(1, 90, 2.5)], None, SLOW),
        ("same node within the refresh: kept", [report(0, 100, 1.0), report(1, 90, 2.5)],
         RECENT, RECENT),
        ("stale entry: refreshed", [report(0, 100, 1.0), report(1, 90, 2.5)],
         {**SLOW, "step": 1, "updatedAt": fmt(NOW - timedelta(seconds=60))}, SLOW),
        ("the straggler moved: refreshed at once", [report(0, 100, 3.0), report(1, 90, 2.5)],
         {**SLOW, "updatedAt": fmt(NOW - timedelta(seconds=5))},
         {**SLOW, "slowestPod": "demo-a1-0", "stepSeconds": 3.0, "slowestNode": "n0", "slowestRank": 0}),
    ],
)
def test_summarise(name: str, reports: list[Progress], old: dict[str, Any] | None,
                   expected: dict[str, Any] | None) -> None:
    status: dict[str, Any] = {"progress": old} if old else {}
    stragglers.summarise(status, 1, reports, gang(1, 2), NOW)
    assert status.get("progress") == expected, name
