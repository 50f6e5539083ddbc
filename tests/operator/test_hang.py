"""Hangs as the operator sees them (the launchers' RTJ_HUNG termination messages) and straggler status."""

from __future__ import annotations

from datetime import timedelta

from resilient_contract import completion, environment, progress
from resilient_operator import constants as c
from resilient_operator.core import failures, reconcile, render
from resilient_operator.core.model import Progress
from tests.operator.builders import NOW, gang, healthy, job, listing, running_status


def hung(step: int, rank: int, stalled: float) -> str:
    return completion.format_message(completion.HUNG, step=step, rank=rank, stalled_s=stalled, timeout_s=30,
                                     attempt=1)


def ended(step: int, rank: int, stalled: float, ago: float) -> dict[str, object]:
    return dict(phase="Failed", exit_code=124, message=hung(step, rank, stalled), finished_ago=ago)


def test_a_hang_restarts_from_the_newest_checkpoint_and_names_who_stopped_first() -> None:
    # Rank 2 stopped at step 41; its peers reached 42 and waited for it in the next collective. Each
    # launcher sees only its own rank, so a peer's watchdog may fire (and its pod end) before rank 2's.
    pods = gang(1, 4, r0=ended(42, 0, 30.0, 2.0), r1=ended(42, 1, 30.0, 1.0), r2=ended(41, 2, 30.1, 1.0),
                r3=ended(42, 3, 30.0, 2.0))
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


def test_the_first_hang_report_waits_briefly_for_its_peers_then_stands_alone() -> None:
    """The race CI met: a peer's report came first and named the wrong rank. While the other pods still
    run, a report waits up to HANG_GATHER_SECONDS for theirs; past that (a wedged launcher), it stands."""
    status = running_status()
    early = gang(1, 4, r2=ended(10, 2, 20.0, 1.0))
    plan = reconcile(job(status, progressTimeoutSeconds=20), early, healthy(4), listing(8), NOW)
    assert "lastFailure" not in plan.status and plan.status["phase"] == c.RUNNING
    assert plan.requeue_after is not None and plan.requeue_after <= 1.0  # looks again soon
    # a peer whose collective broke when the hung rank's workers were killed: part of the hang, not a bug
    broken = gang(1, 4, r0=dict(phase="Failed", exit_code=1, finished_ago=2.0), r2=ended(10, 2, 20.0, 1.0))
    plan = reconcile(job(status, progressTimeoutSeconds=20), broken, healthy(4), listing(8), NOW)
    assert "lastFailure" not in plan.status and plan.status["phase"] == c.RUNNING
    complete = gang(1, 4, r0=ended(10, 0, 20.0, 1.0), r1=ended(9, 1, 20.2, 0.0), r2=ended(10, 2, 20.0, 1.0),
                    r3=ended(10, 3, 20.0, 1.0))
    plan = reconcile(job(status, progressTimeoutSeconds=20), complete, healthy(4), listing(8), NOW)
    assert "hang at step 9; rank 1 (pod demo-a1-1 on node n1) stopped first" in plan.status["lastFailure"]["message"]
    alone = gang(1, 4, r2=ended(10, 2, 20.0, failures.HANG_GATHER_SECONDS))
    plan = reconcile(job(status, progressTimeoutSeconds=20), alone, healthy(4), listing(8), NOW)
    assert "rank 2 (pod demo-a1-2 on node n2) stopped first" in plan.status["lastFailure"]["message"]


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
