"""The decision core: pure functions from observed state to a plan. No I/O, no clock, no client.

`reconcile(job, pods, nodes, checkpoints, now) -> Plan` is the only entry point the shell needs.
"""

from resilient_operator.core.model import Job, NodeView, PodView
from resilient_operator.core.plan import Event, Plan
from resilient_operator.core.reconcile import reconcile

__all__ = ["Event", "Job", "NodeView", "Plan", "PodView", "reconcile"]
