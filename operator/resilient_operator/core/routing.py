"""Which jobs a node or Lease change should wake: a pure function of a job's spec and status.

A renewal or a node event only matters to jobs whose size depends on capacity: those waiting for it,
not yet started, or running below their desired size (grow-back). Jobs on the node itself are woken by
the shell's pod-to-node index regardless.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resilient_operator import constants as c


def capacity_bound(spec: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    phase = status.get("phase") or c.PENDING
    try:
        short = int(status.get("replicas") or 0) < int(spec.get("replicas") or 0)
    except (TypeError, ValueError):
        short = False
    return phase in (c.WAITING_FOR_CAPACITY, c.PENDING) or (phase == c.RUNNING and short)
