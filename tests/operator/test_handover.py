"""core/handover.py, the in-place handover as a pure policy: which kept pods are still waiting for their plans,
which to replace because their agents did not answer in time, and how long to wait for the rest; where the
rendezvous host is; the agent settings a job's pods get. The whole reconcile around it is test_inplace.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from resilient_operator.core import handover
from resilient_operator.core.model import OperatorConfig, PodView
from resilient_operator.core.status import JobStatus
from resilient_operator.core.timeutil import fmt
from tests.operator.builders import NOW, job, pod

ACK = 10.0
CONFIG = OperatorConfig(plan_public_key="operator-public-key", in_place_ack_seconds=ACK)
KEPT = {"demo-a1-1": 0, "demo-a1-2": 1, "demo-a1-3": 2}  # attempt 2 keeps three pods of attempt 1


def status(attempt: int = 2, since_s: float = 3.0, pods: dict[str, int] | None = None) -> JobStatus:
    """A job whose handover to `attempt` began `since_s` seconds before NOW."""
    st: JobStatus = {}
    handover.open_handover(st, attempt, dict(KEPT if pods is None else pods), fmt(NOW - timedelta(seconds=since_s)))
    return st


def kept(name: str, attempt: int, **kw: Any) -> PodView:
    """A kept pod: still labelled with its old attempt until its agent acknowledges (then the new one)."""
    rank = int(name.rsplit("-", 1)[1])
    return pod(attempt, rank, node_name=f"n{rank}", name=name, **kw)


ALL_OLD = [kept(n, 1) for n in KEPT]


@dataclass
class Row:
    name: str
    status: JobStatus
    pods: list[PodView]
    waiting: dict[str, int]
    replace: list[str]
    left: float
    attempt: int = 2
    undeliverable: dict[str, str] | None = None  # pod uid -> the delivery's answer that will not change


ROWS = [
    Row("no handover (a recreated attempt): nothing to follow", {}, ALL_OLD, {}, [], 0.0),
    Row("a handover to another attempt is not this one's", status(attempt=3), ALL_OLD, {}, [], 0.0),
    Row("every kept pod waits, within the bound: wait the rest of it", status(since_s=3.0), ALL_OLD, KEPT, [],
        ACK - 3.0),
    Row("acknowledged pods (relabelled into attempt 2) no longer wait; no status write needed",
        status(since_s=4.0), [kept("demo-a1-1", 2), kept("demo-a1-2", 2), kept("demo-a1-3", 1)],
        {"demo-a1-3": 2}, [], ACK - 4.0),
    Row("every kept pod moved: nothing waits", status(since_s=4.0), [kept(n, 2) for n in KEPT], {}, [], ACK - 4.0),
    Row("a kept pod being deleted or gone waits no more (its rank gets a new pod elsewhere)", status(since_s=1.0),
        [kept("demo-a1-1", 1), kept("demo-a1-2", 1, deleting=True)], {"demo-a1-1": 0}, [], ACK - 1.0),
    Row("the bound passed with agents silent: replace exactly those, wait no longer", status(since_s=ACK),
        [kept("demo-a1-1", 2), kept("demo-a1-2", 1), kept("demo-a1-3", 1)], {}, ["demo-a1-2", "demo-a1-3"], 0.0),
    Row("an unreadable start time counts as overdue (never an endless wait)",
        {"inPlace": {"attempt": 2, "since": "not-a-time", "master": "demo-a1-1", "pods": dict(KEPT)}}, ALL_OLD,
        {}, sorted(KEPT), 0.0),
    Row("no agent listens in one kept pod: it is replaced at once, the others wait the rest of the bound",
        status(since_s=1.0), ALL_OLD, {"demo-a1-1": 0, "demo-a1-2": 1}, ["demo-a1-3"], ACK - 1.0,
        undeliverable={"uid-demo-a1-3": "unreachable"}),
    Row("every kept pod refused (no agents at all): all replaced on the first pass after the answers",
        status(since_s=1.0), ALL_OLD, {}, sorted(KEPT), ACK - 1.0,
        undeliverable={f"uid-{n}": "refused" for n in KEPT}),
    Row("an answer about a pod that already moved, or about another pod under the same name, replaces nothing",
        status(since_s=1.0), [kept("demo-a1-1", 2), kept("demo-a1-2", 1), kept("demo-a1-3", 1)],
        {"demo-a1-2": 1, "demo-a1-3": 2}, [], ACK - 1.0,
        undeliverable={"uid-demo-a1-1": "unreachable", "uid-an-older-demo-a1-2": "unreachable"}),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_follow(row: Row) -> None:
    waiting, replace, left = handover.follow(row.status, row.attempt, row.pods, NOW, CONFIG, row.undeliverable)
    assert (waiting, sorted(replace)) == (row.waiting, row.replace)
    assert all(replace.values())  # each says why (the event and history carry it)
    assert left == pytest.approx(row.left, abs=1e-3)
    if row.replace:  # replaced pods leave the handover, so a later pass does not replace them twice
        again = handover.follow(row.status, row.attempt, row.pods, NOW, CONFIG, row.undeliverable)
        assert again[:2] == (row.waiting, {})


def test_the_rendezvous_host_is_the_kept_rank_0_until_it_is_replaced() -> None:
    st = status()
    assert handover.master(st, 2) == "demo-a1-1"
    assert handover.master(st, 3) is None  # another attempt: its rank 0 is its own pod
    handover.give_up(st)
    assert handover.master(st, 2) is None
    assert handover.waiting(st, 2, ALL_OLD) == {}  # every plan named it: no kept pod waits any more


def test_a_job_that_recreates_gets_no_agent_and_one_that_keeps_pods_outlives_detection_and_handover() -> None:
    assert handover.agent(job(restartStrategy="Recreate"), CONFIG) is None
    agent = handover.agent(job(restartStrategy="InPlace"), CONFIG)
    assert agent is not None
    in_place = job(restartStrategy="InPlace")
    assert agent.linger_seconds >= 2 * in_place.spec.node_loss_timeout + CONFIG.in_place_ack_seconds
