"""KWOK on the local control plane: thousands of fake nodes and pods without processes, for scale only.

The control plane is e2e.controlplane's (real etcd, apiserver, controller-manager, scheduler), with
the simulated nodes of `e2e.localcluster.Cluster` beside KWOK's. The operator runs as its pod (helm,
its ServiceAccount) on one simulated process node, `infra`; every other node is a KWOK node
(annotation `kwok.x-k8s.io/node=fake`), which KWOK keeps Ready and whose Lease it renews every 10 s
(leaseDurationSeconds 40 / 4, as a kubelet does); pods
bound to them become Running through KWOK's stock stages. The scheduler places the pods for real.

Killing a KWOK node changes that annotation (KWOK stops selecting the node, as its docs describe taking
a node out of its hands) and hands its Lease to a holder that never renews (see `kill_nodes`): the Lease
is no longer renewed, the controller-manager marks the node NotReady after its grace period, and its pods
stay as they were until the operator force-deletes them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e import support
from e2e.cluster import wait_for
from e2e.controlplane import Component
from e2e.controlplane.binaries import REPO_ROOT
from e2e.localcluster import Cluster

BUILD_SCRIPT = REPO_ROOT / "hack" / "kwok" / "build.sh"
MANAGED = "kwok.x-k8s.io/node"
KWOK_LABEL = {"type": "kwok"}
POD_CIDR = "10.240.0.0/12"  # KWOK's --cidr: every KWOK pod's IP comes from here (e2e.kwokagents listens there)
LEASE_SECONDS = 40  # a kubelet's default; renewed every 10 s
# A real cluster's node-monitor-grace-period (50 s since 1.32; 40 s before): longer than a renew interval.
NODE_MONITOR_GRACE = "40s"
# KWOK plays every pod's stages (ready, delete) through one pool of 4 workers by default: at hundreds of
# pods that pool, not the control plane, paced a recovery (pods deleted or made Running up to 9 s after
# the operator asked, measured from the audit log). Real kubelets work in parallel, one per node, so the
# simulation gets as many workers as a small rack of kubelets would bring.
KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
    "options": {"podPlayStageParallelism": 32, "nodePlayStageParallelism": 8, "nodeLeaseParallelism": 8},
}

# apiserver_request_total has no user label, so the operator's own requests are counted from the audit
# log: one Metadata-level entry per request made by a ServiceAccount of the operator's namespace.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "userGroups": [f"system:serviceaccounts:{support.OPERATOR_NS}"]},
              {"level": "None"}],
}


def ensure_kwok(timeout: float = 3600) -> Path:
    """Build KWOK (a no-op when cached) and return the binary; stages.yaml lies beside it."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True, timeout=timeout)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class KwokCluster:
    cluster: Cluster
    kwok: Component

    audit_log: Path

    @classmethod
    def start(cls, name: str = "kwok", **cluster_args: Any) -> KwokCluster:
        """The control plane with an audit log of the operator's requests, and KWOK attached to it."""
        binary = ensure_kwok()
        policy_dir = Path(tempfile.mkdtemp(prefix="rtj-audit-"))
        policy, audit_log = policy_dir / "policy.json", policy_dir / "audit.log"
        policy.write_text(json.dumps(AUDIT_POLICY))
        options = policy_dir / "kwok-options.yaml"  # JSON is YAML
        options.write_text(json.dumps(KWOK_OPTIONS))
        cl = Cluster.start(name, node_monitor_grace_period=NODE_MONITOR_GRACE, extra_apiserver_args=(
            f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}", "--audit-log-maxsize=1000"),
            **cluster_args)
        try:
            log = cl.log_dir / "kwok.log"
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    [str(binary), f"--kubeconfig={cl.kubeconfig}", f"--config={binary.parent / 'stages.yaml'}",
                     f"--config={options}", f"--manage-nodes-with-annotation-selector={MANAGED}=fake",
                     f"--node-lease-duration-seconds={LEASE_SECONDS}", f"--cidr={POD_CIDR}",
                     "--node-ip=10.239.0.1", "--v=WARN"],  # its per-object INFO lines cost a core at scale
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            kwok = cl.adopt("kwok", proc, log)  # stopped with the cluster (and by its watchdog)
        except BaseException:
            cl.stop()
            raise
        return cls(cl, kwok, audit_log)

    def stop(self, *, remove: bool = False) -> None:
        self.cluster.stop(remove=remove)
        if remove:  # the audit log (15 MB at 200 nodes) lives outside the cluster's directory
            shutil.rmtree(self.audit_log.parent, ignore_errors=True)

    def install_operator(self, *, workers: int | None = None, memory_limit: str = "2Gi",
                         env: dict[str, str] | None = None) -> None:
        """A process node for the operator's pod, then the chart (as the e2e suite installs it)."""
        cl = self.cluster
        # one replica: the figures are one operator's; a standby would double the watch load on the 2 cores
        support.install_operator(cl, pool=(), values={"resources.limits.memory": memory_limit, "replicaCount": "1"},
                                 wait="180s")
        env = {**(env or {}), **({"RTJ_WORKERS": str(workers)} if workers else {})}
        if env:
            cl.kubectl("-n", support.OPERATOR_NS, "set", "env", "deployment", "--all",
                       *(f"{k}={v}" for k, v in env.items()))
            # the change rolls the pod: wait until the old one is gone, so the figures are the new one's
            cl.kubectl("-n", support.OPERATOR_NS, "rollout", "status", "deployment", "--timeout=180s")
            wait_for(lambda: len(support.core(cl).list_namespaced_pod(support.OPERATOR_NS).items) == 1, 120,
                     "one operator pod")
        support.wait_operator_ready(cl)
        wait_for(lambda: support.operator_metrics(cl), 120, "operator metrics")

    def add_nodes(self, names: list[str], *, cpu: str = "64", memory: str = "512Gi", gpus: int = 32,
                  pods: int = 110, timeout: float = 600) -> None:
        """Create KWOK nodes (in parallel) and wait until every one is Ready.

        32 GPUs a node (twice the bench's demand): the hit jobs must fit again after the kill, because the core
        sizes a job from the healthy nodes' allocatable, not from what other jobs already hold."""
        from kubernetes import client

        api = client.CoreV1Api(self.cluster.api_client())
        capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}

        def create(name: str) -> None:
            api.create_node({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {MANAGED: "fake"},
                             "labels": {**KWOK_LABEL, "kubernetes.io/hostname": name, "pool": "train"}},
                "status": {"allocatable": capacity, "capacity": capacity},
            })

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, names))
        wanted = set(names)

        def all_ready() -> bool:
            nodes = api.list_node(label_selector="type=kwok").items
            ready = {n.metadata.name for n in nodes
                     if any(cond.type == "Ready" and cond.status == "True" for cond in n.status.conditions or [])}
            return wanted <= ready

        wait_for(all_ready, timeout, f"{len(names)} KWOK nodes Ready", interval=2)

    def kill_nodes(self, names: list[str]) -> None:
        """The machines die at once: KWOK stops renewing their Leases and stops driving them.

        KWOK v0.8.0 keeps renewing the Lease of a node it no longer selects, but it holds a Lease like a
        leader election does: it never renews one another holder holds unexpired. So each dead node's Lease
        is handed to a holder that never renews (renewTime untouched: the last sign of life stays the last).
        """
        from kubernetes import client

        api = self.cluster.api_client()
        core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
        unmanaged = {"metadata": {"annotations": {MANAGED: "dead"}}}
        taken = {"spec": {"holderIdentity": "dead-machine", "leaseDurationSeconds": 86400}}

        def kill(name: str) -> None:
            coordination.patch_namespaced_lease(name, "kube-node-lease", taken)
            core.patch_node(name, unmanaged)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(kill, names))


def kwok_worker_template(gpus: int = 1) -> dict[str, Any]:
    """A worker pod template for KWOK nodes (the image never runs: KWOK fakes the container)."""
    return {"spec": {
        "terminationGracePeriodSeconds": 2,
        "nodeSelector": dict(KWOK_LABEL),
        "containers": [{"name": "trainer", "image": "busybox", "command": ["sh", "-c", "sleep 3600"],
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }}
