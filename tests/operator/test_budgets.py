"""budgets: which restart budget a failure spends, when it is spent, and the backoff."""

from __future__ import annotations

import pytest

from resilient_operator import constants as c
from resilient_operator.core import budgets
from resilient_operator.core.model import FailurePolicy

POLICY = FailurePolicy(max_infrastructure_restarts=2, max_application_restarts=3, backoff_seconds=2,
                       max_backoff_seconds=5)


@pytest.mark.parametrize(
    ("kind", "restarts", "exhausted", "count", "backoff"),
    [
        (c.INFRASTRUCTURE, {}, False, 1, None),
        (c.INFRASTRUCTURE, {"infrastructure": 2}, True, 2, None),
        (c.INFRASTRUCTURE, {"application": 3}, False, 1, None),  # budgets are separate
        (c.APPLICATION, {}, False, 1, 2.0),
        (c.APPLICATION, {"application": 1}, False, 2, 4.0),
        (c.APPLICATION, {"application": 2}, False, 3, 5.0),  # capped
        (c.APPLICATION, {"application": 3}, True, 3, None),
    ],
)
def test_budgets(kind: str, restarts: dict[str, int], exhausted: bool, count: int, backoff: float | None) -> None:
    spent = budgets.spend(kind, restarts, POLICY)
    assert (spent.exhausted, spent.count, spent.backoff_seconds) == (exhausted, count, backoff)
