"""health: one view of the nodes per reconcile (lost, quiet, a cluster-wide disruption)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from resilient_operator import constants as c
from resilient_operator.core.model import NodeView
from tests.operator.builders import assess, node


@pytest.mark.parametrize(
    ("name", "view", "lost_reason", "quiet"),
    [
        ("fresh lease", node("a", lease_age=1), None, False),
        ("lease past the timeout", node("a", lease_age=25), c.REASON_NODE_LEASE_STALE, False),
        ("lease quiet for half the timeout", node("a", lease_age=12), None, True),
        ("NotReady briefly (flapping)", node("a", ready="False", since=timedelta(seconds=5)), None, False),
        ("NotReady past the timeout", node("a", ready="False", since=timedelta(seconds=30)), c.REASON_NODE_NOT_READY,
         False),
        ("Unknown past the timeout", node("a", ready="Unknown", since=timedelta(seconds=30)),
         c.REASON_NODE_UNREACHABLE, False),
        ("no lease at all, Ready", node("a", lease_age=None), None, False),
    ],
)
def test_health(name: str, view: NodeView, lost_reason: str | None, quiet: bool) -> None:
    h = assess(view)
    loss = h.loss("a")
    assert (loss.reason if loss else None) == lost_reason, name
    assert (h.quiet_for("a") is not None) == quiet, name


def test_health_deleted_node_and_disruption() -> None:
    h = assess(node("a"), node("b", lease_age=30), node("c", lease_age=30))
    assert h.loss("gone") is not None and h.loss("gone").reason == c.REASON_NODE_DELETED  # type: ignore[union-attr]
    assert h.lost_names == ["b", "c"] and h.disrupted  # 2 of 3 > 55 %: an outage, not dead machines
    assert not assess(node("a"), node("b"), node("c", lease_age=30)).disrupted
    assert assess(node("a", lease_age=5)).next_loss_check("a") == pytest.approx(15)
