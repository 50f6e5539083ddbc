"""A real Kubernetes control plane plus simulated process-running nodes, for integration and e2e tests.

    from e2e.localcluster import Cluster
    with Cluster.start("demo") as c:
        c.add_node("n1", gpus=2)
        c.kubectl("get", "nodes")

Use `e2e.get_cluster()` to let RTJ_CLUSTER choose between this backend and kind; this package never
imports the kind one.
"""

from __future__ import annotations

from e2e.cluster import wait_for

from .cluster import Cluster, down

__all__ = ["Cluster", "down", "wait_for"]
