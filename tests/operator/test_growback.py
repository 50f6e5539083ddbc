"""growback: capacity first, then the next complete checkpoint."""

from __future__ import annotations

import pytest

from resilient_operator.core import growback


@pytest.mark.parametrize(
    ("running", "target", "latest", "pending", "action"),
    [
        (4, 4, 10, None, growback.NONE),
        (3, None, 10, {"replicas": 4, "sinceStep": 5}, growback.NONE),  # capacity went away again
        (3, 4, 10, None, growback.NOTICE),
        (3, 4, 10, {"replicas": 4, "sinceStep": 10}, growback.WAIT),  # no newer checkpoint yet
        (3, 4, 12, {"replicas": 4, "sinceStep": 10}, growback.RESTART),
    ],
)
def test_grow_back(running: int, target: int | None, latest: int, pending: dict[str, int] | None, action: str) -> None:
    assert growback.decide(running, target, latest, pending).action == action
