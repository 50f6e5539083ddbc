"""A real Kubernetes control plane plus simulated process-running nodes, for integration and e2e tests.

    from e2e.localcluster import Cluster
    with Cluster.start("demo") as c:
        c.add_node("n1", gpus=2)
        c.kubectl("get", "nodes")

`get_cluster()` returns this harness or, with RTJ_CLUSTER=kind, the kind-backed one with the same interface.
"""

from __future__ import annotations

import os
from typing import Any

from .cluster import Cluster, down, wait_for

__all__ = ["Cluster", "down", "get_cluster", "wait_for"]


def get_cluster(name: str = "rtj", **kwargs: Any) -> Any:
    """Start a cluster of the kind chosen by RTJ_CLUSTER (`local`, the default, or `kind`)."""
    if os.environ.get("RTJ_CLUSTER", "local") == "kind":
        from e2e.kindcluster import KindCluster

        return KindCluster.start(name, **kwargs)
    return Cluster.start(name, **kwargs)
