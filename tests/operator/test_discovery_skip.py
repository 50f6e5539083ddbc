"""Jobs that cannot launch anyway are not sent to discovery (issue 25, item 1): a job waiting for capacity is
looked at on every node event, and reading its root would cost a sandboxed worker each time."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_contract.storage import Listing
from resilient_operator import constants as c
from resilient_operator import controller, discovery, views
from resilient_operator.core import reconcile
from resilient_operator.core.conditions import get_condition
from resilient_operator.core.reconcile import needs_discovery
from tests.operator.builders import NOW, gang, healthy, job, job_object, running_status

HUGE = {"replicas": 64, "elasticPolicy": {"minReplicas": 64}}
SKIPPED = Listing("/ckpt/demo", None, reason=c.DISCOVERY_SKIPPED)


@pytest.mark.parametrize(
    ("name", "status", "spec", "pods", "needed"),
    [
        ("a job that can never fit, waiting for capacity", {"phase": c.WAITING_FOR_CAPACITY}, HUGE, [], False),
        ("a new job that can never fit", {}, HUGE, [], False),
        ("a finished job", {"phase": c.SUCCEEDED}, {}, [], False),
        ("a failed job", {"phase": c.FAILED}, {}, [], False),
        ("a new job that fits", {}, {}, [], True),
        ("a job restarting with room", {"phase": c.RESTARTING, "attempt": 1}, {}, [], True),
        ("a running job (checkpoints in status, grow-back)", running_status(), {}, gang(1, 4), True),
        ("a job below its minimum whose old pods are still going", {"phase": c.RESTARTING, "attempt": 1}, HUGE,
         gang(1, 4), True),
    ],
)
def test_needs_discovery(name: str, status: dict[str, Any], spec: dict[str, Any], pods: list[Any],
                         needed: bool) -> None:
    assert needs_discovery(job(status, **spec), pods, healthy(4), NOW) is needed, name


def test_a_pass_without_the_listing_never_launches_and_asks_again_soon() -> None:
    """Capacity came back between the shell's check and the core's decision: read the root first."""
    plan = reconcile(job({}), [], healthy(4), SKIPPED, NOW)
    assert not plan.create and plan.requeue_after is not None and plan.requeue_after <= 1.0
    assert get_condition(plan.status, c.COND_STORAGE) is None  # nothing claimed about storage
    waiting = reconcile(job({}, **HUGE), [], healthy(4), SKIPPED, NOW)
    assert waiting.status["phase"] == c.WAITING_FOR_CAPACITY and not waiting.create


class _Clock:
    def now(self) -> Any:
        return NOW


class _Cache:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj, self.clock = obj, _Clock()

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.obj

    def job_pods(self, namespace: str, name: str) -> list[Any]:
        return []

    def node_views(self) -> Any:
        return healthy(4)

    def jobs_with_root(self, root: str) -> list[Any]:
        return [self.obj]


def test_the_shell_skips_discovery_for_a_job_that_cannot_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(discovery, "discover_with_reports",
                        lambda *a: calls.append(a) or (Listing("/ckpt/demo", None), {}))
    never = job_object(status={"phase": c.WAITING_FOR_CAPACITY}, **HUGE)
    observed = controller.observe(_Cache(never), "ml", "demo")  # type: ignore[arg-type]
    assert observed is not None and observed[4].reason == c.DISCOVERY_SKIPPED and not calls
    fits = job_object(status={})
    controller.observe(_Cache(fits), "ml", "demo")  # type: ignore[arg-type]
    assert len(calls) == 1
    assert views.job_view(fits).spec.replicas == 4
