"""The world size a (re)start uses: what capacity allows, clamped to the job's range and multiple."""

from __future__ import annotations

from resilient_operator.core.model import ElasticPolicy


def choose_replicas(desired: int, policy: ElasticPolicy, capacity: int) -> int | None:
    """Largest allowed worker count <= min(desired, max, capacity); None if below the minimum."""
    upper = min(desired, policy.max_replicas, capacity)
    rounded = upper - upper % policy.multiple_of
    if rounded < policy.min_replicas or rounded <= 0:
        return None
    return rounded
