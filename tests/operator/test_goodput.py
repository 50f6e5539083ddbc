"""Goodput accounting and the bounded wait for capacity that is seconds away: policy tables and a scripted
failure whose lost time is known, driven through the whole reconcile as the shell would."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator.core import goodput, reconcile, settle
from resilient_operator.core.model import ElasticPolicy, Placement, Progress
from resilient_operator.core.timeutil import fmt
from tests.operator.builders import NOW, assess, gang, healthy, job, listing, node, nodes, pod, running_status

UNREACHABLE = [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]


def at(seconds: float) -> Any:
    return NOW + timedelta(seconds=seconds)


def report(attempt: int, step: int, first: float | None = None, rank: int = 0, step_seconds: float = 1.0) -> Progress:
    return Progress(pod=f"demo-a{attempt}-{rank}", attempt=attempt, step=step, updated=NOW, step_seconds=step_seconds,
                    slowest_rank=rank, first_step_at=at(first) if first is not None else None)


def test_scripted_node_loss_lost_time_matches_the_script() -> None:
    """Node n3 last renews at t=-25; the loss is decided at t=0 (20 s timeout), the old pods are gone at t=3,
    the new gang runs at t=7, steps again at t=11 from step 90, having reached step 100 at 1 s a step."""
    status = running_status(startTime=fmt(at(-300)))
    lost = {f"n{i}": node(f"n{i}", lease_age=25.0 if i == 3 else 1.0) for i in range(4)}
    plan = reconcile(job(status), gang(1, 4), lost, listing(90), NOW, progress=[report(1, 100)])
    assert plan.status["phase"] == c.RESTARTING
    plan = reconcile(job(plan.status), [pod(1, r, node_name=f"n{r}", deleting=True) for r in range(3)], lost,
                     listing(90), at(2), progress=[report(1, 101)])  # the survivors finish one more step
    plan = reconcile(job(plan.status), [], lost, listing(90), at(3))
    assert plan.status["attempt"] == 2 and plan.status["resumedFrom"]["step"] == 90
    new = gang(2, 3, resume=(f"/ckpt/demo/step-{90:010d}", 90))
    plan = reconcile(job(plan.status), new, lost, listing(90), at(7))
    assert plan.status["phase"] == c.RUNNING
    plan = reconcile(job(plan.status), new, lost, listing(90), at(12), progress=[report(2, 91, first=11)])
    gp = plan.status["goodput"]
    truth = {"detection": 25.0, "fencing": 3.0, "relaunch": 4.0, "load": 4.0, "recompute": 11.0}
    for stage, seconds in truth.items():
        assert gp["lost"][stage] == pytest.approx(seconds, abs=0.01), stage
    assert gp["stepsRecomputed"] == 11 and gp["recoveries"] == 1 and "open" not in gp
    wall, lost_s = 312.0, sum(truth.values())
    assert gp["lostSeconds"] == pytest.approx(lost_s, abs=0.1)
    assert gp["productiveSeconds"] == pytest.approx(wall - lost_s, abs=0.1)
    assert gp["ratio"] == pytest.approx((wall - lost_s) / wall, abs=1e-3)


def test_an_open_recovery_counts_as_lost_until_it_closes() -> None:
    status: dict[str, Any] = {"startTime": fmt(at(-100))}
    goodput.open_recovery(status, c.INFRASTRUCTURE, at(-10), NOW, 50)
    goodput.summarise(status, NOW)
    assert status["goodput"]["lostSeconds"] == pytest.approx(10) and status["goodput"]["ratio"] == pytest.approx(0.9)


def test_broken_again_mid_recovery_keeps_what_was_spent() -> None:
    status: dict[str, Any] = {"startTime": fmt(at(-100))}
    goodput.open_recovery(status, c.INFRASTRUCTURE, at(-10), at(-5), 50)
    goodput.launched(status, at(-3), 40)
    goodput.open_recovery(status, c.APPLICATION, at(-1), NOW, 40)  # the relaunch failed at once
    lost = status["goodput"]["lost"]
    assert (lost["detection"], lost["fencing"], lost["relaunch"]) == (5.0, 2.0, 3.0)
    assert status["goodput"]["stepsRecomputed"] == 10


def test_planned_restart_at_the_current_step_recomputes_nothing() -> None:
    status: dict[str, Any] = {"startTime": fmt(at(-100))}
    goodput.open_recovery(status, c.PLANNED, NOW, NOW, 57)
    goodput.note_reached(status, 58)  # the trainer finished one more step before its SIGTERM save
    goodput.launched(status, at(4), 58)
    goodput.running(status, at(6))
    goodput.observe(status, 2, [report(2, 59, first=9)], at(10))
    assert status["goodput"]["stepsRecomputed"] == 0 and status["goodput"]["lost"]["recompute"] == 0


def test_the_ratio_is_not_rewritten_on_every_reconcile() -> None:
    status: dict[str, Any] = {"startTime": fmt(at(-100))}
    goodput.summarise(status, NOW)
    first = dict(status["goodput"])
    goodput.summarise(status, at(30))
    assert status["goodput"] == first
    goodput.summarise(status, at(61))
    assert status["goodput"]["productiveSeconds"] == pytest.approx(161)


# --- settle: wait, bounded, when full capacity is seconds away -------------------------------------------------
POLICY = ElasticPolicy(min_replicas=2, max_replicas=4, multiple_of=1, grow_back=True)
ANY = Placement({}, {}, ())


@pytest.mark.parametrize(
    ("name", "n3", "waiting_for", "waits"),
    [
        ("Ready 2 s ago, unreachable taint still on: wait", dict(since=timedelta(seconds=2), taints=UNREACHABLE),
         None, True),
        ("the wait is bounded", dict(since=timedelta(seconds=2), taints=UNREACHABLE), 16.0, False),
        ("Ready long ago and still tainted: someone else's taint, do not wait",
         dict(since=timedelta(minutes=5), taints=UNREACHABLE), None, False),
        ("still NotReady: not seconds away", dict(ready="False", since=timedelta(seconds=2), taints=UNREACHABLE),
         None, False),
        ("another taint too: not ours to wait for", dict(since=timedelta(seconds=2), taints=[
            *UNREACHABLE, {"key": "maint", "effect": "NoSchedule"}]), None, False),
        ("nothing missing", {}, None, False),
    ],
)
def test_settle(name: str, n3: dict[str, Any], waiting_for: float | None, waits: bool) -> None:
    h = assess(node("n0"), node("n1"), node("n2"), node("n3", **n3))
    since = NOW - timedelta(seconds=waiting_for) if waiting_for is not None else None
    wait = settle.decide(h, ANY, 4, POLICY, NOW, 15.0, since)
    assert (wait is not None) == waits, name
    if wait:
        assert "n3" in wait.message and "4 workers instead of 3" in wait.message


def test_settle_reconcile_rows() -> None:
    """The two cases through the whole reconcile (also rows in test_reconcile_table)."""
    back = nodes(node("n0"), node("n1"), node("n2"), node("n3", since=timedelta(seconds=2), taints=UNREACHABLE))
    plan = reconcile(job(running_status(phase=c.RESTARTING)), [], back, listing(10), NOW)
    assert plan.status["phase"] == c.RESTARTING and plan.create == []
    assert plan.status["settlingSince"] == fmt(NOW) and plan.requeue_after == pytest.approx(1.0)
    assert [e.reason for e in plan.events] == [c.REASON_SETTLING]
    later = nodes(*(node(f"n{i}") for i in range(4)))
    plan = reconcile(job(plan.status), [], later, listing(10), at(3))
    assert plan.status["replicas"] == 4 and "settlingSince" not in plan.status
    assert healthy(4)  # builders stay importable
