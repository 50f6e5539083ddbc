"""Hangs as the operator sees them (the launchers' RTJ_HUNG termination messages) and straggler status."""

from __future__ import annotations

from datetime import timedelta

from resilient_contract import completion, environment, progress
from resilient_operator import constants as c
from resilient_operator.core import reconcile, render
from resilient_operator.core.model import Progress
from tests.operator.builders import NOW, gang, healthy, job, listing, running_status


def hung(step: int, rank: int, stalled: float) -> str:
    return completion.format_message(completion.HUNG, step=step, rank=rank, stalled_s=stalled, timeout_s=30,
                                     attempt=1)


def test_a_hang_restarts_from_the_newest_checkpoint_and_names_who_stopped_first() -> None:
    pods = gang(1, 4, r2=dict(phase="Failed", exit_code=124, message=hung(41, 2, 30.1), finished_ago=1.0),
                r3=dict(phase="Failed", exit_code=124, message=hung(42, 3, 30.0), finished_ago=0.5))
    plan = reconcile(job(running_status(), progressTimeoutSeconds=30), pods, healthy(4), listing(40), NOW)
    failure = plan.status["lastFailure"]
    assert failure["kind"] == c.HANG and failure["reason"] == c.REASON_HANG and failure["node"] == "n2"
    assert plan.status["phase"] == c.RESTARTING and plan.status["restarts"]["infrastructure"] == 1
    (event,) = [e for e in plan.events if e.reason == c.REASON_HANG]
    assert "hang at step 41" in event.message and "rank 2 (pod demo-a1-2 on node n2) stopped first" in event.message
    assert plan.status["badNodes"][0]["node"] == "n2"
    # the hang began at its last step: detection = the timeout, as the goodput says
    assert plan.status["goodput"]["open"]["occurredAt"].startswith((NOW - timedelta(seconds=31.1)).strftime(
        "%Y-%m-%dT%H:%M:%S"))
    plan = reconcile(job(plan.status, progressTimeoutSeconds=30), [], healthy(4), listing(40), NOW)
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    assert len(pods) == 3 and plan.status["resumedFrom"]["step"] == 40  # without the blamed node


def test_the_timeout_is_injected_only_when_set() -> None:
    def env(**spec: object) -> dict[str, str]:
        pod = render.pod_manifest(job(**spec), 1, 0, 4, None)
        return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}

    assert env(progressTimeoutSeconds=45)[progress.TIMEOUT_ENV] == "45"
    assert progress.TIMEOUT_ENV not in env()
    assert environment.RESUME_FROM in env()


def test_the_slowest_pod_and_node_are_named_while_running() -> None:
    reports = [Progress(f"demo-a1-{r}", 1, 50, NOW, step_seconds=0.5 + (r == 2), slowest_rank=r) for r in range(4)]
    plan = reconcile(job(running_status()), gang(1, 4), healthy(4), listing(40), NOW, progress=reports)
    assert plan.status["progress"] == {"attempt": 1, "step": 50, "slowestPod": "demo-a1-2", "slowestNode": "n2",
                                       "slowestRank": 2, "stepSeconds": 1.5, "updatedAt": "2026-11-29T12:00:00Z"}
    again = reconcile(job(plan.status), gang(1, 4), healthy(4), listing(40), NOW + timedelta(seconds=10),
                      progress=reports)
    assert again.status["progress"] == plan.status["progress"]  # not rewritten on every report
