"""drain: which nodes are about to go with warning, and which of them host the attempt (a planned restart)."""

from __future__ import annotations

import pytest

from resilient_operator.core import drain
from tests.operator.builders import gang, node, nodes, pod

TAINTS = frozenset({"karpenter.sh/disrupted"})


@pytest.mark.parametrize(
    ("name", "view", "why"),
    [
        ("ready node", node("n0"), None),
        ("cordoned", node("n0", unschedulable=True), "cordoned"),
        ("notice taint", node("n0", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]),
         "tainted karpenter.sh/disrupted"),
        ("unrelated taint", node("n0", taints=[{"key": "gpu", "effect": "NoSchedule"}]), None),
    ],
)
def test_notice(name: str, view: object, why: str | None) -> None:
    found = drain.notice(view, TAINTS)  # type: ignore[arg-type]
    assert (found.why if found else None) == why, name


@pytest.mark.parametrize(
    ("name", "pods", "lost", "affected"),
    [
        ("a live pod on a draining node", gang(1, 2), (), ["n1"]),
        ("a lost node is a failure, not a drain", gang(1, 2), ("n1",), []),
        ("a finished pod holds nothing", [pod(1, 0, node_name="n0"), pod(1, 1, node_name="n1", phase="Succeeded")],
         (), []),
        ("a deleting pod is already going", [pod(1, 0, node_name="n0"), pod(1, 1, node_name="n1", deleting=True)],
         (), []),
    ],
)
def test_affected(name: str, pods: list, lost: tuple[str, ...], affected: list[str]) -> None:  # type: ignore[type-arg]
    notices = drain.draining(nodes(node("n0"), node("n1", unschedulable=True)), TAINTS)
    assert [n.node for n in drain.affected(pods, notices, lost)] == affected, name


def test_pdb_name_is_per_attempt() -> None:
    assert drain.pdb_name("demo", 3) == "demo-a3"


@pytest.mark.parametrize(("reached", "latest", "since_s", "wait"), [
    (42, 45, 1.0, 0.0),  # the stopped gang's checkpoint is there: launch now
    (42, 42, 1.0, 0.0),
    (42, 40, 1.0, 29.0),  # not yet: wait the rest of the pods' grace period
    (42, None, 1.0, 29.0),  # no checkpoint at all yet
    (42, 40, 30.0, 0.0),  # the grace period is over: launch from what there is (steps lost, never correctness)
    (None, 40, 1.0, 0.0),  # nothing known to have been reached: nothing to wait for
])  # fmt: skip
def test_save_wait(reached: int | None, latest: int | None, since_s: float, wait: float) -> None:
    from datetime import timedelta

    from tests.operator.builders import NOW

    assert drain.save_wait(reached, latest, NOW - timedelta(seconds=since_s), NOW, 30.0) == pytest.approx(wait)
    assert drain.save_wait(reached, latest, None, NOW, 30.0) == 0.0  # an unreadable drain time never blocks
