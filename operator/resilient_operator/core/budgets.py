"""Which restart budget a failure spends, whether it is spent, and how long an application failure waits.

Infrastructure failures (node loss, eviction, preemption) and application failures (a non-zero exit with
no infrastructure cause) count against separate budgets: a flaky cluster must not use up the retries a
buggy script gets, nor the reverse. Application restarts back off exponentially; infrastructure ones do
not (the cause is gone once the gang is fenced and moved).

A hang (the launcher's watchdog saw no step for spec.progressTimeoutSeconds) is its own failure kind but
spends the infrastructure budget: the usual causes are a dead peer or link, a wedged GPU or NIC, a stuck
volume, which a restart away from the blamed node fixes (the node is avoided, core/badnodes.py) without
backoff; a deterministic deadlock in the script hangs again at the same step, and the infrastructure
budget still bounds it, each try costing only the timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from resilient_operator import constants as c
from resilient_operator.core.model import FailurePolicy

RESTART_KINDS = ("infrastructure", "application", "planned")


@dataclass(frozen=True)
class Spend:
    key: str  # status.restarts key
    limit: int
    exhausted: bool  # the budget was already spent: the job fails instead of restarting
    count: int  # restarts of this kind once this one is counted
    backoff_seconds: float | None  # application failures only

    @property
    def budget_reason(self) -> str:
        return c.REASON_INFRA_BUDGET if self.key == "infrastructure" else c.REASON_APP_BUDGET

    def exhausted_message(self, last_failure: str) -> str:
        """Why the job failed instead of restarting, and what the user can do."""
        return (f"{self.key} restart budget ({self.limit}) is spent; last failure: {last_failure}. Raise "
                "spec.failurePolicy or fix the cause, then recreate the job; checkpoints are kept")

    @property
    def backoff_message(self) -> str:
        return f"application restart {self.count}/{self.limit} in {self.backoff_seconds:g}s"


def spend(kind: str, restarts: Mapping[str, int], policy: FailurePolicy) -> Spend:
    """The budget decision for one failure of `kind` (constants.INFRASTRUCTURE or APPLICATION)."""
    infra = kind in (c.INFRASTRUCTURE, c.HANG)
    key = "infrastructure" if infra else "application"
    limit = policy.max_infrastructure_restarts if infra else policy.max_application_restarts
    used = int(restarts.get(key, 0))
    if used >= limit:
        return Spend(key, limit, True, used, None)
    count = used + 1
    delay = None if infra else float(min(policy.backoff_seconds * 2 ** (count - 1), policy.max_backoff_seconds))
    return Spend(key, limit, False, count, delay)


def total(restarts: Mapping[str, int]) -> int:
    return sum(int(restarts.get(k, 0)) for k in RESTART_KINDS)
