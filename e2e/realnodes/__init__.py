"""Real nodes (kubelet + containerd per node, CoreDNS, kube-proxy) on the local control plane.

    from e2e.realnodes import RealCluster
    with RealCluster.start("demo") as c:
        c.add_node("n1")
        c.kill_node("n1"); c.restore_node("n1"); c.partition_node("n1"); c.heal_node("n1")

`e2e.get_cluster()` picks it with RTJ_CLUSTER=real. Needs root and `hack/realnodes/build.sh`'s binaries.
"""

from __future__ import annotations

from .cluster import RealCluster, RealNode, down

__all__ = ["RealCluster", "RealNode", "down"]
