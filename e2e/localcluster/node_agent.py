"""A simulated kubelet: registers a Node, heartbeats, and runs the pods bound to it as local processes.

One agent process per node, authenticated as `system:node:<name>` (so the Node authorizer and
NodeRestriction hold it to what a kubelet may do). It runs inside the cluster's network namespace,
where its InternalIP lives on the cluster bridge. The parts: kubeapi.py (API client, informers),
podspec.py (what a pod spec means, pure), pod_runtime.py (one pod's processes and namespaces),
kubelet_api.py (logs for `kubectl logs`); this module ties them: the Node object, heartbeats,
the pods bound here, and the /etc/hosts records every pod sees.

Run: python -m e2e.localcluster.node_agent <node-dir>/config.json
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from e2e.controlplane import network

from . import podspec
from .kubeapi import Api, ApiError, Informer, now, now_micro
from .kubelet_api import KubeletServer
from .pod_runtime import PodRuntime

LOG = logging.getLogger("node-agent")
# A kubelet renews every leaseDurationSeconds/4 = 10 s, half the operator's default 20 s node-loss timeout.
# The tests run with a 4 s timeout, so a node here renews every second: at most half that timeout, as on
# a real cluster, with room for a heartbeat thread delayed by a busy 2-core machine.
LEASE_RENEW_S = 1.0
STATUS_EVERY_S = 5.0
# The pods' /etc/hosts (our CoreDNS) are rewritten at most this often: each rewrite reads every pod in the
# cluster, and a 200-node recovery changes hundreds a second (pods going, coming, turning Ready). A record
# comes at most this late plus the loop's 0.5 s wake, as CoreDNS's answers lag the EndpointSlices.
HOSTS_EVERY_S = 0.25


class NodeAgent:
    """One simulated node."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.node: str = cfg["node"]
        self.dir = Path(cfg["dir"])
        kc = json.loads(Path(cfg["kubeconfig"]).read_text())
        user = kc["users"][0]["user"]
        self.api = Api(cfg["api_host"], cfg["api_port"], cfg["ca_crt"], user["client-certificate"],
                       user["client-key"])
        self.runtimes: dict[str, PodRuntime] = {}
        self.netns_prefix = network.pod_netns_prefix(cfg["cluster_netns"], cfg["index"])
        self.lock = threading.RLock()
        self.wake = threading.Event()
        self.hosts_dirty = True
        self.hosts_written = 0.0  # time.monotonic() of the last rewrite
        # Like a kubelet, the agent sees only the pods bound to its node...
        self.pods = Informer(self.api, "/api/v1/pods", self.changed,
                             {"fieldSelector": f"spec.nodeName={self.node}"})
        # ...while DNS data comes from a cluster-wide reader with CoreDNS-like rights (its own identity).
        dkc = json.loads(Path(cfg["dns_kubeconfig"]).read_text())["users"][0]["user"]
        self.dns_api = Api(cfg["api_host"], cfg["api_port"], cfg["ca_crt"], dkc["client-certificate"],
                           dkc["client-key"])
        self.all_pods = Informer(self.dns_api, "/api/v1/pods", self.changed, key=podspec.dns_fields)
        self.services = Informer(self.dns_api, "/api/v1/services", self.changed)
        self.started = now()

    def changed(self) -> None:
        """Something in the watched world changed."""
        self.hosts_dirty = True
        self.wake.set()

    def host_path(self, path: str) -> Path:
        """hostPath paths live under the cluster's shared hostpath root (an RWX volume for all nodes)."""
        p = Path(self.cfg["hostpath_root"]) / path.lstrip("/")
        p.mkdir(parents=True, exist_ok=True)
        return p

    # ------------------------------------------------------------ node object
    def register(self) -> None:
        """Create the Node (or take over an existing one after a restart)."""
        labels = {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  **self.cfg["labels"]}
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "labels": labels},
                "spec": {"taints": self.cfg["taints"]} if self.cfg["taints"] else {}}
        try:
            self.api.request("POST", "/api/v1/nodes", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self.node_uid = self.api.request("GET", f"/api/v1/nodes/{self.node}")["metadata"]["uid"]
        self.post_status()

    def post_status(self) -> None:
        """Capacity, addresses, conditions (Ready with a fresh heartbeat), node info."""
        t = now()
        cap = self.cfg["capacity"]

        def cond(kind: str, status: str, reason: str) -> dict[str, Any]:
            return {"type": kind, "status": status, "reason": reason, "message": reason,
                    "lastHeartbeatTime": t, "lastTransitionTime": self.started}

        status = {
            "capacity": cap, "allocatable": cap,
            "addresses": [{"type": "InternalIP", "address": self.cfg["address"]},
                          {"type": "Hostname", "address": self.node}],
            "conditions": [cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                           cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                           cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                           cond("Ready", "True", "KubeletReady")],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": self.node, "systemUUID": self.node, "bootID": self.started,
                         "kernelVersion": os.uname().release, "osImage": "rtj simulated node",
                         "containerRuntimeVersion": "rtj-process://0.1", "kubeletVersion": self.cfg["kubelet_version"],
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        }
        self.api.patch(f"/api/v1/nodes/{self.node}/status", {"status": status})

    def heartbeat_loop(self) -> None:
        """Renew the Lease every second and the node status every 5 s (the node lifecycle controller reads both)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node}"
        skew = Path(self.cfg["dir"]) / "clock_skew_s"  # a test's clock offset for this node (chaos tests)
        last_status = time.monotonic()
        while True:
            try:
                try:
                    self.api.request("PATCH", path, {"spec": {"renewTime": now_micro(skew), "holderIdentity": self.node,
                                                              "leaseDurationSeconds": 40}},
                                     content_type="application/merge-patch+json", timeout=5)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    self.api.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.node, "namespace": "kube-node-lease",
                                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                                          "uid": self.node_uid}]},
                        "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40,
                                 "renewTime": now_micro(skew)}}, timeout=5)
                if time.monotonic() - last_status >= STATUS_EVERY_S:
                    self.post_status()
                    last_status = time.monotonic()
            except Exception as exc:
                LOG.warning("heartbeat: %s", exc)
            time.sleep(LEASE_RENEW_S)

    # ------------------------------------------------------------ DNS
    def dns_records(self, ns: str) -> list[str]:
        """/etc/hosts lines for headless-Service pod names, as CoreDNS serves them to a pod in `ns`."""
        return podspec.dns_records(self.all_pods.snapshot(), self.services.snapshot(), ns)

    # ------------------------------------------------------------ pods
    def allocate_ip(self, pod: dict[str, Any]) -> str:
        """Reuse the pod's reported IP (after a reboot) or take a free one from this node's /24."""
        used = {r.ip for r in self.runtimes.values()}
        used |= {(p.get("status") or {}).get("podIP") for p in self.pods.snapshot()
                 if p["spec"].get("nodeName") == self.node and (p.get("status") or {}).get("phase")
                 not in ("Succeeded", "Failed")}
        return podspec.pick_pod_ip(pod, podspec.node_pod_ips(self.cfg["subnet"], self.cfg["index"]), used)

    def reconcile(self) -> None:
        """Match running pod workers to the pods bound here."""
        pods = {p["metadata"]["uid"]: p for p in self.pods.snapshot() if p["spec"].get("nodeName") == self.node}
        with self.lock:
            for uid, pod in pods.items():
                rt = self.runtimes.get(uid)
                if rt is not None:
                    rt.update(pod)
                    continue
                st = pod.get("status") or {}
                started_before = bool(st.get("containerStatuses")) and any(
                    "running" in (c.get("state") or {}) or "terminated" in (c.get("state") or {})
                    for c in st["containerStatuses"])
                if st.get("phase") in ("Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
                    if pod["metadata"].get("deletionTimestamp") and uid not in self.finalizing:
                        # Nothing runs for it here (e.g. after a node reboot): confirm the deletion.
                        self.finalizing.add(uid)
                        threading.Thread(target=self.finalize, args=(pod,), daemon=True).start()
                    continue
                rt = PodRuntime(self, pod, self.allocate_ip(pod), rebooted=started_before)
                self.runtimes[uid] = rt
                rt.start()
            for uid, rt in list(self.runtimes.items()):
                if uid not in pods:
                    rt.removed.set()
                    rt.wake.set()
            if self.hosts_dirty and time.monotonic() - self.hosts_written >= HOSTS_EVERY_S:
                self.hosts_dirty, self.hosts_written = False, time.monotonic()
                for rt in self.runtimes.values():
                    if (rt.dir / "hosts").exists():
                        with contextlib.suppress(Exception):
                            rt.write_hosts()

    def finalize(self, pod: dict[str, Any]) -> None:
        """Delete a pod with grace 0 once nothing of it runs here; retried across API outages (a refused
        connection or a 403 while a restarted API server's authorizers warm up), or the pod would stay
        Terminating for good."""
        meta = pod["metadata"]
        try:
            while True:
                try:
                    self.api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                     {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                                      "preconditions": {"uid": meta["uid"]}})
                    return
                except ApiError as exc:
                    if exc.status in (404, 409):
                        return
                    LOG.warning("finalize %s/%s: %s; retrying", meta["namespace"], meta["name"], exc)
                except OSError as exc:
                    LOG.warning("finalize %s/%s: %s; retrying", meta["namespace"], meta["name"], exc)
                time.sleep(1)
        finally:
            with self.lock:
                self.finalizing.discard(meta["uid"])

    def runtime_for(self, ns: str, name: str) -> PodRuntime | None:
        """The live pod worker for ns/name, if this node runs it."""
        with self.lock:
            return next((r for r in self.runtimes.values() if (r.ns, r.pod_name) == (ns, name)), None)

    def pod_finished(self, uid: str) -> None:
        """A pod worker ended: forget it (a new pod with the same name has a new uid)."""
        with self.lock:
            self.runtimes.pop(uid, None)
        self.wake.set()

    def run(self) -> None:
        """Register, start the watches and the heartbeat, reconcile forever."""
        self.finalizing: set[str] = set()
        # Orphaned grandchildren of pods re-parent to the agent, so kill_node finds the whole tree.
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        # A restarted agent (a rebooted machine) first drops the pod sandboxes of its previous life:
        # their processes are gone, and a stale veth would duplicate an IP it hands out again.
        network.delete_netns_with_prefix(self.netns_prefix)
        KubeletServer(self).start()
        self.register()
        threading.Thread(target=self.heartbeat_loop, daemon=True, name="heartbeat").start()
        for inf in (self.pods, self.all_pods, self.services):
            inf.start()
        for inf in (self.pods, self.all_pods, self.services):
            inf.synced.wait(60)
        LOG.info("node %s up", self.node)
        while True:
            self.wake.wait(0.5)
            self.wake.clear()
            try:
                self.reconcile()
            except Exception:
                LOG.exception("reconcile")
            self.reap_orphans()

    def reap_orphans(self) -> None:
        """Collect exited re-parented grandchildren (we are their subreaper), never our own children."""
        with self.lock:
            own = {c.proc.pid for rt in self.runtimes.values() for c in rt.containers + rt.init_containers
                   if c.proc is not None}
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in own:
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(entry), os.WNOHANG)


def main() -> None:
    """Entry point: `python -m e2e.localcluster.node_agent <config.json>`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    cfg = json.loads(Path(sys.argv[1]).read_text())
    NodeAgent(cfg).run()


if __name__ == "__main__":
    main()
