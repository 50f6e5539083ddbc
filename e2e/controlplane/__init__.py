"""The local Kubernetes control plane the process-node backends share (see plane.py).

    plane.py     etcd, apiserver, controller-manager, scheduler; the watchdog; node bookkeeping; `down`
    network.py   the cluster's network namespace, bridge and node/pod addresses
    pki.py       the cluster CA and the certificates it issues
    forward.py   the host-loopback forwarder into the namespace (a process of its own)
    binaries.py  the Kubernetes binaries hack/k8s/build.sh builds (or finds in the cache)

It imports no node backend: e2e.localcluster (simulated nodes) and e2e.realnodes (real kubelets) build on it.
"""

from __future__ import annotations

from .plane import Component, ControlPlane, NodeHandle, down, in_cluster, kill_process_tree, newest_dir

__all__ = ["Component", "ControlPlane", "NodeHandle", "down", "in_cluster", "kill_process_tree", "newest_dir"]
