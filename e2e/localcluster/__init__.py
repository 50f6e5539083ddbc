"""Simulated process-running nodes on the local control plane (e2e.controlplane), for integration and e2e tests.

    from e2e.localcluster import Cluster
    with Cluster.start("demo") as c:
        c.add_node("n1", gpus=2)
        c.kubectl("get", "nodes")

Use `e2e.get_cluster()` to let RTJ_CLUSTER choose the backend; this package imports no other node
backend (.importlinter).
"""

from __future__ import annotations

from e2e.cluster import wait_for

from .cluster import Cluster, down

__all__ = ["Cluster", "down", "wait_for"]
