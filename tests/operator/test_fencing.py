"""fencing: which pods of a broken attempt to delete, and which with grace period 0 (their node is lost)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from resilient_operator.core import fencing
from resilient_operator.core.model import PodView
from tests.operator.builders import assess, node, pod

LOST = node("n1", lease_age=None, ready="Unknown", since=timedelta(minutes=5))


@pytest.mark.parametrize(
    ("name", "pods", "planned", "delete", "force"),
    [
        ("healthy node: graceful", [pod(1, 0, node_name="n0")], (), ["demo-a1-0"], []),
        ("lost node: grace 0", [pod(1, 1, node_name="n1")], (), [], ["demo-a1-1"]),
        ("lost node, already deleting: still forced", [pod(1, 1, node_name="n1", deleting=True)], (), [],
         ["demo-a1-1"]),
        ("healthy node, already deleting: left alone", [pod(1, 0, node_name="n0", deleting=True)], (), [], []),
        ("already planned this pass", [pod(1, 0, node_name="n0")], ("demo-a1-0",), [], []),
        ("unscheduled pod", [pod(1, 2)], (), ["demo-a1-2"], []),
    ],
)
def test_fence(name: str, pods: list[PodView], planned: tuple[str, ...], delete: list[str], force: list[str]) -> None:
    out = fencing.fence(pods, assess(node("n0"), LOST), planned)
    assert (out.delete, out.force) == (delete, force), name
