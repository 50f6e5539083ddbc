"""conditions: Kubernetes conditions, whose lastTransitionTime moves only when the status flips."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_operator.core.conditions import get_condition, set_condition

EARLIER, NOW = "2026-11-29T11:00:00Z", "2026-11-29T12:00:00Z"


def ready(status: str) -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": status, "reason": "Old", "message": "old",
                            "lastTransitionTime": EARLIER, "observedGeneration": 1}]}


@pytest.mark.parametrize(
    ("name", "status", "value", "flipped", "since"),
    [
        ("new condition: a transition", {}, True, True, NOW),
        ("same status: reason and message move, the time stays", ready("True"), True, False, EARLIER),
        ("flip: the time moves", ready("True"), False, True, NOW),
    ],
)
def test_set_condition(name: str, status: dict[str, Any], value: bool, flipped: bool, since: str) -> None:
    assert set_condition(status, "Ready", value, "New", "new", NOW, 2) == flipped, name
    cond = get_condition(status, "Ready")
    assert cond is not None
    assert (cond["status"], cond["reason"], cond["message"], cond["observedGeneration"]) == (
        "True" if value else "False", "New", "new", 2), name
    assert cond["lastTransitionTime"] == since, name
    assert len(status["conditions"]) == 1


def test_get_condition_skips_malformed_entries() -> None:
    assert get_condition({"conditions": ["junk", {"type": "Other"}]}, "Ready") is None
