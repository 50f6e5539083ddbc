"""The in-place plan: only the operator's key signs one, and a plan steers only the pod and job it names."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from resilient_contract import environment, plan

KEY = plan.new_private_key()
PUBLIC = plan.public_key(KEY)
PLAN = plan.Plan(job_uid="job-1", pod_uid="pod-1", attempt=4, nnodes=3, node_rank=0, master_addr="10.0.0.5",
                 master_port=29500, resume_from="/ckpt/step-00000040")


def test_a_signed_plan_verifies_and_becomes_the_worker_environment() -> None:
    got = plan.verify(plan.sign(PLAN, KEY), PUBLIC, "job-1", "pod-1")
    assert got == PLAN
    env = got.environ()
    assert env[environment.ATTEMPT] == "4" and env[environment.NODE_RANK] == "0"
    assert env[environment.NNODES] == "3" and env[environment.RESUME_FROM] == "/ckpt/step-00000040"


@pytest.mark.parametrize(("body", "job", "pod", "error"), [
    pytest.param(plan.sign(PLAN, plan.new_private_key()), "job-1", "pod-1", plan.NotForUs, id="another key"),
    pytest.param(plan.sign(PLAN, KEY), "job-2", "pod-1", plan.NotForUs, id="another job"),
    pytest.param(plan.sign(PLAN, KEY), "job-1", "pod-2", plan.NotForUs, id="another pod"),
    pytest.param(json.dumps({"plan": {**json.loads(plan.sign(PLAN, KEY))["plan"], "attempt": 9},
                             "signature": json.loads(plan.sign(PLAN, KEY))["signature"]}).encode(),
                 "job-1", "pod-1", plan.NotForUs, id="edited after signing"),
    pytest.param(json.dumps({"plan": {**json.loads(plan.sign(PLAN, KEY))["plan"], "master_agent_port": 1},
                             "signature": json.loads(plan.sign(PLAN, KEY))["signature"]}).encode(),
                 "job-1", "pod-1", plan.NotForUs, id="host's agent port edited after signing"),
    pytest.param(b"not json", "job-1", "pod-1", plan.PlanError, id="malformed"),
    pytest.param(b"x" * (plan.MAX_BODY_BYTES + 1), "job-1", "pod-1", plan.PlanError, id="too big"),
    pytest.param(plan.sign(replace(PLAN, node_rank=3), KEY), "job-1", "pod-1", plan.PlanError, id="rank >= nnodes"),
])  # fmt: skip
def test_a_plan_not_for_this_pod_is_refused(body: bytes, job: str, pod: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        plan.verify(body, PUBLIC, job, pod)


def test_a_plan_without_the_hosts_agent_port_parses_as_zero() -> None:
    """Zero: the agent does not wait for the host, as before the field."""
    raw = json.loads(plan.sign(PLAN, KEY))["plan"]
    del raw["master_agent_port"]
    assert plan.Plan.from_dict(raw).master_agent_port == 0
