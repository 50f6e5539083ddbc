"""One table per policy of the core (and the boundary that feeds it), beside the whole-reconcile table."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator import views
from resilient_operator.core import budgets, capacity, failures, growback, health, routing
from resilient_operator.core.model import ElasticPolicy, FailurePolicy, NodeView, Placement, PodView, Toleration
from tests.operator.builders import NOW, gang, job, node, nodes, pod

TIMEOUT = 20.0


def assess(*views_: NodeView) -> health.Health:
    return health.assess(nodes(*views_), NOW, TIMEOUT)


# --- health: one view of the nodes per reconcile ---------------------------------------------------------------
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


# --- capacity: quantities, slots and the world size ------------------------------------------------------------
def placement(requests: dict[str, Any] | None = None, **spec: Any) -> Placement:
    container: dict[str, Any] = {"name": "t"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    return views.placement({"spec": {"containers": [container], **spec}})


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


# --- failures: which failure broke the attempt, and which kind it is ------------------------------------------
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


# --- budgets -------------------------------------------------------------------------------------------------
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


# --- grow-back -----------------------------------------------------------------------------------------------
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


# --- routing: which jobs a node or Lease event wakes ----------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "status", "bound"),
    [
        ({"replicas": 4}, {}, True),  # Pending
        ({"replicas": 4}, {"phase": c.WAITING_FOR_CAPACITY}, True),
        ({"replicas": 4}, {"phase": c.RUNNING, "replicas": 3}, True),  # may grow back
        ({"replicas": 4}, {"phase": c.RUNNING, "replicas": 4}, False),
        ({"replicas": 4}, {"phase": c.SUCCEEDED}, False),
        ({"replicas": "x"}, {"phase": c.RUNNING, "replicas": 3}, False),  # hostile spec: no crash
    ],
)
def test_capacity_bound(spec: dict[str, Any], status: dict[str, Any], bound: bool) -> None:
    assert routing.capacity_bound(spec, status) is bound


# --- views: spec shapes that pass the CRD but the core cannot use ----------------------------------------------
def container(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "t", **fields}]}}


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (container(env=["A=1"]), "containers[0].env[0]"),
        ({"metadata": {"labels": "team=a"}, **container()}, "metadata.labels"),
        ({"spec": {"containers": [{"name": "t"}], "nodeSelector": ["gpu"]}}, "spec.nodeSelector"),
        (container(resources={"limits": ["cpu"]}), "resources.limits"),
        (container(resources={"requests": {"cpu": "1.2.3"}}), "resources.cpu"),
        ({"spec": {"containers": []}}, "containers"),
        ({"spec": {"containers": [{"name": "t"}], "tolerations": {"key": "a"}}}, "spec.tolerations"),
        (container(env=[{"name": "PET_NNODES", "value": "9"}]), "PET_NNODES"),
        (container(env=[{"name": "X", "value": "y" * 200_000}]), "bound"),  # x 500 replicas > 64 MiB
    ],
)
def test_unusable_templates_are_refused_naming_the_field(template: dict[str, Any], field: str) -> None:
    j = job(template=template, replicas=500, elasticPolicy={"minReplicas": 1})
    assert j.problem and field in j.problem, j.problem


def test_labels_and_annotations_are_parsed_defensively() -> None:
    impostor = pod(1, 0, labels={c.LABEL_ATTEMPT: "x", c.LABEL_RANK: "0"}, owner_uid=None)
    assert impostor.attempt == 0 and impostor.owner_uid is None
    assert pod(1, 0).owner_uid == "uid-1" and pod(1, 0).launch_replicas == 4
    view = views.node_view({"metadata": {"name": "a"}, "status": {"allocatable": {"cpu": "lots"}}}, None)
    assert view.allocatable["cpu"] == Decimal(0)
