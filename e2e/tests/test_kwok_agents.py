"""The KWOK stand-in agents: they take only the operator's plans for their own pod, as a real agent does.

(The HTTP path at the pods' IPs runs in e2e/tests/test_scale_kwok.py, on a real control plane.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.kwokagents import PodAgent, pod_agent
from resilient_contract import environment, plan
from resilient_operator import constants as c

KEY = plan.new_private_key()


def signed(attempt: int, pod_uid: str = "pod-1", job_uid: str = "job-1", key: bytes = KEY) -> bytes:
    return plan.sign(plan.Plan(job_uid=job_uid, pod_uid=pod_uid, attempt=attempt, nnodes=2, node_rank=1,
                               master_addr="10.240.0.9", master_port=29500, resume_from=""), key)


def agent(attempt: int = 1) -> PodAgent:
    return PodAgent(pod="j-0", pod_uid="pod-1", job_uid="job-1", public_key=plan.public_key(KEY), attempt=attempt)


@pytest.mark.parametrize(("body", "status", "attempt_after"), [
    pytest.param(signed(2), 200, 2, id="the next attempt: taken"),
    pytest.param(signed(1), 200, 1, id="the running attempt again: acknowledged, nothing restarts"),
    pytest.param(signed(2, pod_uid="pod-2"), 403, 1, id="another pod's plan"),
    pytest.param(signed(2, job_uid="job-2"), 403, 1, id="another job's plan"),
    pytest.param(signed(2, key=plan.new_private_key()), 403, 1, id="an impostor's key"),
    pytest.param(b"{}", 400, 1, id="malformed"),
])  # fmt: skip
def test_a_stand_in_agent_takes_only_the_operators_plan_for_its_pod(body: bytes, status: int,
                                                                     attempt_after: int) -> None:
    a = agent()
    got, answer = a.offer(body)
    assert got == status, answer
    assert a.attempt == attempt_after
    if status == 200:
        assert answer == {"attempt": attempt_after, "state": plan.STARTED}


def test_an_older_attempt_is_refused_as_stale() -> None:
    a = agent(attempt=3)
    assert a.offer(signed(2))[0] == 409
    assert a.offer(signed(4))[0] == 200 and a.plans == [4]


def pod(ip: str | None = "10.240.1.7", env: dict[str, str] | None = None, attempt: str = "2") -> dict[str, Any]:
    env = {plan.AGENT_PORT_ENV: "29401", plan.PUBLIC_KEY_ENV: plan.public_key(KEY), environment.JOB_UID: "job-1",
           **(env or {})}
    return {"metadata": {"name": "j-0", "uid": "pod-1", "labels": {c.LABEL_ATTEMPT: attempt}},
            "spec": {"containers": [{"name": "trainer", "env": [{"name": k, "value": v} for k, v in env.items()]}]},
            "status": {"podIP": ip} if ip else {}}


def test_a_pod_rendered_with_an_agent_gets_one_at_its_ip() -> None:
    found = pod_agent(pod())
    assert found is not None
    ip, port, a = found
    assert (ip, port, a.pod_uid, a.job_uid, a.attempt) == ("10.240.1.7", 29401, "pod-1", "job-1", 2)


@pytest.mark.parametrize("p", [
    pytest.param(pod(ip=None), id="no IP yet"),
    pytest.param(pod(ip="10.100.3.4"), id="not a KWOK pod's IP"),
    pytest.param(pod(env={plan.AGENT_PORT_ENV: "0"}), id="no agent (Recreate)"),
    pytest.param(pod(env={plan.PUBLIC_KEY_ENV: ""}), id="no key"),
])  # fmt: skip
def test_no_agent_where_the_pod_has_none(p: dict[str, Any]) -> None:
    assert pod_agent(p) is None


def test_the_answer_is_what_the_operator_reads() -> None:
    """The delivery counts a 200 as acknowledged only if it says this attempt started (delivery._started)."""
    from resilient_operator import delivery

    status, answer = agent().offer(signed(2))
    assert status == 200 and delivery._started(json.dumps(answer).encode(), 2)
