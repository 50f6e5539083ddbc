"""capacity: quantities, slots per node, and the world size the healthy nodes allow."""

from __future__ import annotations

import pytest

from resilient_operator import views
from resilient_operator.core import capacity
from resilient_operator.core.model import ElasticPolicy, Toleration
from tests.operator.builders import assess, node, placement


@pytest.mark.parametrize(
    ("requests", "allocatable", "slots"),
    [
        (None, {"cpu": "1"}, 1),  # no requests: one worker per node
        ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "8"}, 4),
        ({"nvidia.com/gpu": "3"}, {"nvidia.com/gpu": "8"}, 2),
        ({"cpu": "500m", "memory": "8Gi"}, {"cpu": "4", "memory": "20Gi"}, 2),
        ({"cpu": "100u"}, {"cpu": "1m"}, 10),  # micro-units parse (the old parser crashed)
        ({"memory": "1Ei"}, {"memory": "2Ei"}, 2),  # exbi too
        ({"memory": "1.5Gi"}, {"memory": "3Gi"}, 2),  # exact, no float rounding
        ({"nvidia.com/gpu": "1"}, {}, 0),  # the node has none
    ],
)
def test_slots(requests: dict[str, str] | None, allocatable: dict[str, str], slots: int) -> None:
    view = views.node_view({"metadata": {"name": "a"}, "status": {"allocatable": allocatable}}, None)
    assert capacity.slots(view, placement(requests)) == slots


def test_slots_follow_selectors_and_taints() -> None:
    tainted = node("a", taints=[{"key": "dedicated", "effect": "NoSchedule"}])
    assert capacity.slots(tainted, placement()) == 0
    assert capacity.slots(tainted, placement(tolerations=[{"key": "dedicated", "operator": "Exists"}])) == 1
    assert capacity.slots(tainted, placement(tolerations=[{"operator": "Exists"}])) == 1
    assert capacity.slots(node("a"), placement(nodeSelector={"kubernetes.io/hostname": "b"})) == 0
    assert capacity.slots(node("a"), placement(nodeSelector={"kubernetes.io/hostname": "a"})) == 1
    assert placement(tolerations=[{"operator": "Exists"}]).tolerations == (Toleration(None, "Exists", None),)


def test_capacity_counts_only_healthy_schedulable_nodes() -> None:
    h = assess(node("a"), node("b", unschedulable=True), node("c", lease_age=25), node("d", ready="False"))
    cap = capacity.capacity(h, placement({"nvidia.com/gpu": "4"}))
    assert dict(cap.per_node) == {"a": 2} and cap.total == 2


@pytest.mark.parametrize(
    ("desired", "policy", "cap", "chosen"),
    [
        (4, ElasticPolicy(1, 4, 1, True), 10, 4),
        (4, ElasticPolicy(1, 4, 1, True), 3, 3),
        (8, ElasticPolicy(2, 8, 2, True), 7, 6),  # rounded down to the multiple
        (8, ElasticPolicy(4, 8, 4, True), 7, 4),
        (8, ElasticPolicy(4, 8, 4, True), 3, None),  # below the minimum: wait
        (4, ElasticPolicy(4, 4, 1, False), 3, None),  # not elastic
        (8, ElasticPolicy(1, 6, 1, True), 10, 6),  # maxReplicas caps it
        (4, ElasticPolicy(1, 4, 1, True), 0, None),
    ],
)
def test_choose_replicas(desired: int, policy: ElasticPolicy, cap: int, chosen: int | None) -> None:
    assert capacity.choose_replicas(desired, policy, cap) == chosen


def test_quiet_nodes_among_capacity() -> None:
    h = assess(node("a", lease_age=1), node("b", lease_age=12), node("c", lease_age=25))
    assert capacity.quiet(h, capacity.capacity(h, placement())) == {"b": pytest.approx(8)}
