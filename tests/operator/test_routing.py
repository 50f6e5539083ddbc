"""routing: which jobs a node or Lease event wakes."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator.core import routing


@pytest.mark.parametrize(
    ("spec", "status", "bound"),
    [
        ({"replicas": 4}, {}, True),  # Pending
        ({"replicas": 4}, {"phase": c.WAITING_FOR_CAPACITY}, True),
        ({"replicas": 4}, {"phase": c.RUNNING, "replicas": 3}, True),  # may grow back
        ({"replicas": 4}, {"phase": c.RUNNING, "replicas": 4}, False),
        ({"replicas": 4}, {"phase": c.SUCCEEDED}, False),
        ({"replicas": "x"}, {"phase": c.RUNNING, "replicas": 3}, False),  # hostile spec: no crash
    ],
)
def test_capacity_bound(spec: dict[str, Any], status: dict[str, Any], bound: bool) -> None:
    assert routing.capacity_bound(spec, status) is bound
