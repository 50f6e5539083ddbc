"""settle: wait (bounded) when full capacity is seconds away: a node Ready again whose lifecycle taint is
about to go."""

from __future__ import annotations

from datetime import timedelta

import pytest

from resilient_operator.core import settle
from resilient_operator.core.model import ElasticPolicy, NodeView
from tests.operator.builders import NOW, assess, node, placement

POLICY = ElasticPolicy(min_replicas=1, max_replicas=4, multiple_of=1, grow_back=True)
UNREACHABLE = [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]
PLACE = placement({"nvidia.com/gpu": "8"})


def back(name: str, ago: float, taints: list[dict[str, str]] | None = None) -> NodeView:
    return node(name, since=timedelta(seconds=ago), taints=UNREACHABLE if taints is None else taints)


@pytest.mark.parametrize(
    ("name", "extra", "waiting_for", "seconds"),
    [
        ("full size already", [node("n3")], None, None),
        ("a node Ready again 2s ago, tainted: wait", [back("n3", 2)], None, 1.0),
        ("Ready for longer than the bound: something else holds the taint", [back("n3", 60)], None, None),
        ("another taint: not about to go", [back("n3", 2, [{"key": "gpu", "effect": "NoSchedule"}])], None, None),
        ("waited the whole bound: launch smaller", [back("n3", 2)], 15.0, None),
        ("part of the bound left", [back("n3", 2)], 14.5, 0.5),
    ],
)
def test_decide(name: str, extra: list[NodeView], waiting_for: float | None, seconds: float | None) -> None:
    health = assess(node("n0"), node("n1"), node("n2"), *extra)
    since = None if waiting_for is None else NOW - timedelta(seconds=waiting_for)
    wait = settle.decide(health, PLACE, 4, POLICY, NOW, 15.0, since)
    assert (wait.seconds if wait else None) == seconds, name
    if wait:
        assert "waiting up to 15s to start 4 workers instead of 3" in wait.message
