"""Bad-node memory: per job (status, affinity, capacity, expiry) and the opt-in cluster-wide taint decision."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator.core import badnodes, failures, reconcile
from resilient_operator.core.timeutil import fmt
from tests.operator.builders import NOW, gang, healthy, job, listing, node, nodes, running_status

KEY = "training.resilient.dev/bad-node"


def lost_n3() -> dict[str, Any]:
    return nodes(*(node(f"n{i}", lease_age=25.0 if i == 3 else 1.0) for i in range(4)))


def avoided_in(pod: dict[str, Any]) -> set[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return {v for t in terms["nodeSelectorTerms"] for r in t.get("matchFields", []) for v in r["values"]}


def test_a_lost_node_is_remembered_with_reason_and_expiry() -> None:
    plan = reconcile(job(running_status()), gang(1, 4), lost_n3(), listing(10), NOW)
    (entry,) = plan.status["badNodes"]
    assert entry["node"] == "n3" and entry["reason"] == c.REASON_NODE_LOST and entry["avoided"]
    assert entry["expires"] == fmt(NOW + timedelta(seconds=3600))
    assert any(e.reason == c.REASON_AVOID_NODE and "n3" in e.message for e in plan.events)


def test_a_remembered_node_is_avoided_even_when_healthy_again_until_it_expires() -> None:
    status = running_status(phase=c.RESTARTING, badNodes=[{"node": "n3", "reason": c.REASON_NODE_LOST,
                            "avoided": True, "failureTimes": [fmt(NOW)], "expires": fmt(NOW + timedelta(hours=1))}])
    plan = reconcile(job(status), [], healthy(4), listing(10), NOW)
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    assert len(pods) == 3 and all(avoided_in(p) == {"n3"} for p in pods)  # not counted as capacity either
    later = reconcile(job(status), [], healthy(4), listing(10), NOW + timedelta(hours=1, seconds=1))
    assert "badNodes" not in later.status and later.status["replicas"] == 4


def test_waiting_for_capacity_wakes_when_an_avoided_node_expires() -> None:
    status = running_status(phase=c.RESTARTING, badNodes=[{"node": f"n{i}", "reason": c.REASON_NODE_LOST,
                            "avoided": True, "failureTimes": [fmt(NOW)], "expires": fmt(NOW + timedelta(seconds=7))}
                            for i in range(3)])
    plan = reconcile(job(status), [], healthy(4), listing(10), NOW)
    assert plan.status["phase"] == c.WAITING_FOR_CAPACITY and plan.requeue_after == pytest.approx(7)


@pytest.mark.parametrize(
    ("name", "failures", "avoided"),
    [
        ("one eviction blames nobody yet", [c.REASON_EVICTED], False),
        ("a repeated infrastructure failure does", [c.REASON_EVICTED, c.REASON_POD_DELETED], True),
        ("a hang blames at once", [c.REASON_HANG], True),
    ],
)
def test_blame(name: str, failures: list[str], avoided: bool) -> None:
    status: dict[str, Any] = {}
    for i, reason in enumerate(failures):
        badnodes.record(status, "n1", reason, NOW + timedelta(minutes=i), 600)
    assert bool(badnodes.avoided(status, NOW + timedelta(minutes=len(failures)))) == avoided, name


def test_application_failures_and_a_zero_hold_blame_nobody() -> None:
    app = reconcile(job(running_status()), gang(1, 4, r1=dict(phase="Failed", exit_code=1)), healthy(4), listing(),
                    NOW)
    assert "badNodes" not in app.status
    off = reconcile(job(running_status(), badNodeSeconds=0), gang(1, 4), lost_n3(), listing(10), NOW)
    assert "badNodes" not in off.status


def entries(node_name: str, *ages_s: float) -> dict[str, Any]:
    times = [fmt(NOW - timedelta(seconds=a)) for a in ages_s]
    return {"badNodes": [{"node": node_name, "failureTimes": times, "attestedTimes": times}]}


TEN = nodes(*(node(f"n{i}") for i in range(10)))


@pytest.mark.parametrize(
    ("name", "statuses", "cluster", "fraction", "tainted"),
    [
        ("three failures across jobs in the window", [entries("n1", 10), entries("n1", 20, 30)], TEN, 0.2, ["n1"]),
        ("below the threshold", [entries("n1", 10), entries("n1", 20)], TEN, 0.2, []),
        ("old failures fall out of the window", [entries("n1", 10, 20), entries("n1", 7200)], TEN, 0.2, []),
        ("never past the fraction: the worst first", [entries("n1", 1, 2, 3), entries("n2", 1, 2, 3, 4)], TEN, 0.1,
         ["n2"]),
        ("already tainted nodes count against the fraction",
         [entries("n1", 1, 2, 3)], nodes(*(node(f"n{i}", taints=[{"key": KEY, "effect": "NoSchedule"}] if i == 5
                                            else None) for i in range(10))), 0.1, []),
        ("a node already tainted is not tainted again", [entries("n5", 1, 2, 3)],
         nodes(*(node(f"n{i}", taints=[{"key": KEY, "effect": "NoSchedule"}] if i == 5 else None)
                 for i in range(10))), 0.5, []),
        ("a deleted node is not tainted", [entries("gone", 1, 2, 3)], TEN, 0.5, []),
    ],
)
def test_cluster_wide_taint(name: str, statuses: list[dict[str, Any]], cluster: Any, fraction: float,
                            tainted: list[str]) -> None:
    out = badnodes.to_taint(statuses, cluster, NOW, KEY, failures=3, window_seconds=3600, max_fraction=fraction)
    assert [t.node for t in out] == tainted, name
    for t in out:
        assert KEY in t.message and "failures attributed" in t.message


# ---- only signals a tenant cannot forge count cluster-wide (issue 25, item 3) ------------------------------
HUNG_ON_N1 = "RTJ_HUNG step=7 rank=1 stalled_s=31 timeout_s=30 attempt=1"


def _three_jobs(pods_for: Any, cluster: Any, rounds: int = 1) -> list[dict[str, Any]]:
    """Three jobs pinned to the same nodes, each broken `rounds` times by what `pods_for` shows."""
    statuses = []
    for _ in range(3):
        status: dict[str, Any] = {}
        for i in range(rounds):
            before = running_status(attempt=i + 1, **({"badNodes": status["badNodes"]} if status else {}))
            status = reconcile(job(before), pods_for(i + 1), cluster, listing(5), NOW).status
        statuses.append(status)
    return statuses


@pytest.mark.parametrize(
    ("name", "pods_for", "rounds"),
    [
        ("a forged RTJ_HUNG written by the container", lambda a: gang(a, 4, r1=dict(
            phase="Failed", exit_code=124, finished_ago=failures.HANG_GATHER_SECONDS + 1, message=HUNG_ON_N1)), 1),
        ("the tenant deleting its own pods", lambda a: gang(a, 4, r1=dict(deleting=True)), 2),
        ("the tenant evicting its own pods (Eviction API)", lambda a: gang(a, 4, r1=dict(
            disruption="EvictionByEvictionAPI")), 2),
        ("a preemption by the tenant's own priorities", lambda a: gang(a, 4, r1=dict(
            disruption="PreemptionByScheduler")), 2),
    ],
)
def test_what_a_tenant_can_forge_never_taints_a_node_for_everyone(name: str, pods_for: Any, rounds: int) -> None:
    statuses = _three_jobs(pods_for, healthy(4), rounds)
    for st in statuses:  # each job still avoids the node itself
        assert [e["node"] for e in st["badNodes"]] == ["n1"] and st["badNodes"][0]["avoided"], name
        assert "attestedTimes" not in st["badNodes"][0], name
    assert badnodes.to_taint(statuses, TEN, NOW, KEY, failures=3, window_seconds=3600, max_fraction=0.5) == [], name


@pytest.mark.parametrize(
    ("name", "pods_for", "cluster", "node_name"),
    [
        ("a lost node (stale lease)", lambda a: gang(a, 4), lost_n3(), "n3"),
        ("a kubelet eviction (node pressure)", lambda a: gang(a, 4, r1=dict(phase="Failed", reason="Evicted")),
         healthy(4), "n1"),
        ("the taint manager's deletion", lambda a: gang(a, 4, r1=dict(disruption="DeletionByTaintManager")),
         healthy(4), "n1"),
    ],
)
def test_what_only_the_cluster_can_say_counts_towards_the_taint(name: str, pods_for: Any, cluster: Any,
                                                                 node_name: str) -> None:
    rounds = 1 if node_name == "n3" else 2
    statuses = _three_jobs(pods_for, cluster, rounds)
    every = nodes(*(node(f"n{i}") for i in range(10)))
    out = badnodes.to_taint(statuses, every, NOW, KEY, failures=3, window_seconds=3600,
                            max_fraction=0.5)
    assert [t.node for t in out] == [node_name], name
