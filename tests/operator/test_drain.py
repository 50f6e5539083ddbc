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
