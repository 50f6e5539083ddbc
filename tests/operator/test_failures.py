"""failures: which failure broke the attempt, and which kind (budget) it is."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator.core import failures
from resilient_operator.core.model import PodView
from tests.operator.builders import assess, gang, node, pod


def p(rank: int, **kw: Any) -> PodView:
    return pod(1, rank, node_name=f"n{rank}", **kw)


@pytest.mark.parametrize(
    ("name", "pods", "node_changes", "kind", "reason"),
    [
        ("healthy", gang(1, 2), {}, None, None),
        ("lost node wins over its peer's crash", [p(0, phase="Failed", exit_code=1, finished_ago=1), p(1)],
         {"n1": {"lease_age": 25}}, c.INFRASTRUCTURE, c.REASON_NODE_LOST),
        ("evicted", [p(0, phase="Failed", reason="Evicted"), p(1)], {}, c.INFRASTRUCTURE, c.REASON_EVICTED),
        ("disruption target", [p(0, disruption="PreemptionByScheduler"), p(1)], {}, c.INFRASTRUCTURE,
         c.REASON_PREEMPTED),
        ("deleted pod", [p(0, deleting=True), p(1)], {}, c.INFRASTRUCTURE, c.REASON_POD_DELETED),
        ("crash after every node renewed", [p(0, phase="Failed", exit_code=3, finished_ago=5), p(1)], {},
         c.APPLICATION, c.REASON_APP_FAILED),
        ("crash not yet settled (a node has not renewed since)", [p(0, phase="Failed", exit_code=3, finished_ago=0.5),
         p(1)], {}, None, None),
        ("image cannot start", [p(0, phase="Pending", waiting="ImagePullBackOff"), p(1)], {}, c.APPLICATION,
         c.REASON_IMAGE_CANNOT_START),
        ("success recorded despite exit 1", [p(0, phase="Failed", exit_code=1, finished_ago=5,
         message="RTJ_SUCCEEDED step=4"), p(1)], {}, None, None),
    ],
)
def test_failure_classification(name: str, pods: list[PodView], node_changes: dict[str, dict[str, Any]],
                                kind: str | None, reason: str | None) -> None:
    h = assess(*(node(f"n{i}", **node_changes.get(f"n{i}", {})) for i in range(2)))
    failure = failures.detect(pods, 2, True, h)
    assert (failure.kind if failure else None, failure.reason if failure else None) == (kind, reason), name


def test_missing_rank_counts_only_once_all_were_created() -> None:
    h = assess(node("n0"), node("n1"))
    assert failures.detect([p(0)], 2, False, h) is None
    assert failures.detect([p(0)], 2, True, h).reason == c.REASON_POD_DELETED  # type: ignore[union-attr]
