"""End-to-end tests, the demo and the cluster backends they run on.

`get_cluster` is the one place that chooses a backend; `e2e.cluster` holds the interface both share.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from e2e.cluster import ClusterLike


def get_cluster(name: str = "rtj", **kwargs: Any) -> ClusterLike:
    """Start a cluster of the kind chosen by RTJ_CLUSTER (`local`, the default, `real` or `kind`).

    Backends are imported here, not at the top, so importing any `e2e` module stays cheap and
    `e2e.localcluster` never pulls in `e2e.kindcluster` (or the reverse).
    """
    backend = os.environ.get("RTJ_CLUSTER", "local")
    if backend == "kind":
        from e2e.kindcluster import KindCluster

        return KindCluster.start(name, **kwargs)
    if backend == "real":  # the local control plane with real kubelets and containerd (e2e/realnodes)
        from e2e.realnodes import RealCluster

        return RealCluster.start(name, **kwargs)
    from e2e.localcluster import Cluster

    return Cluster.start(name, **kwargs)
