"""Real nodes: a real kubelet and containerd per node, CoreDNS and kube-proxy, on the local control plane.

`RealCluster` is a node backend on the local control plane (e2e.controlplane: same network namespace,
same `ClusterLike` interface as the simulated nodes) whose nodes are real: per node a containerd (own
root, state and socket) and a kubelet (client cert from the cluster CA, cgroupfs under a cgroup root of
its own), both in the cluster's network namespace and in a mount namespace (and root) of the node's own, its "machine"
(node_init.sh): /var/lib and /var/log are the node's directories, /run a tmpfs of its own, the shared
hostPath roots (SHARED_PATHS) the cluster's `host_path` directories, any other new top-level path the
node's own, and the global sysctls the kubelet would set are files holding the values it wants
(config.KUBELET_SYSCTLS), so nothing the node does lands on the host. When every process of a node dies,
its mounts (overlay rootfs, volumes, netns pins) go with that namespace, which is what makes `kill_node`
a machine's death and teardown clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from e2e.cluster import wait_for
from e2e.controlplane import network
from e2e.controlplane.plane import ControlPlane, NodeHandle

from . import cgroups, config
from .binaries import ensure_images, ensure_node_binaries, image_refs

# The node's mount namespace, then containerd: $1 = node dir. Every later process of the node enters it.
NODE_INIT = Path(__file__).with_name("node_init.sh")  # the node's mount namespace; see its header
# hostPath roots every node shares, as `host_path` maps them (e2e/support.py's HOST_DIR, create_shared_pvc).
SHARED_PATHS = ("/rtj-checkpoints", "/rtj-shared")


@dataclass
class RealNode(NodeHandle):
    """One real node: the control plane's node handle (`proc` is the kubelet), plus containerd."""

    cgroup: str = ""
    containerd: subprocess.Popen[bytes] | None = None
    gpus: int = 0
    argv: list[str] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        """containerd's CRI/API socket (a file in the node dir, reachable from the host)."""
        return self.dir / "containerd.sock"


@dataclass
class RealCluster(ControlPlane):
    """The local control plane with real nodes, CoreDNS (on the bridge address) and kube-proxy."""

    # Its `down` also kills the nodes (by cgroup: shims and containers too).
    DOWN_MODULE: ClassVar[str] = "e2e.realnodes.cluster"

    node_bin_dir: Path = Path()
    image_dir: Path = Path()
    images: dict[str, str] = field(default_factory=dict)
    image_archives: list[Path] = field(default_factory=list)
    nodes: dict[str, RealNode] = field(default_factory=dict)  # type: ignore[assignment]

    @classmethod
    def start(cls, name: str = "rtj", **kwargs: Any) -> Self:
        """Build/reuse the node binaries and images, start the control plane, then CoreDNS and kube-proxy."""
        node_bin, image_dir = ensure_node_binaries(), ensure_images()
        cgroups.cleanup_stale(network.list_netns())
        cluster = super().start(name, **kwargs)
        cluster.node_bin_dir, cluster.image_dir = node_bin, image_dir
        cluster.images = image_refs(image_dir)
        cluster.image_archives = sorted(image_dir.glob("*.tar"))
        try:
            cluster._start_addons()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def dns_address(self) -> str:
        """Where CoreDNS answers, the kubelets' clusterDNS: the control plane's bridge address."""
        return self.api_host

    def _nsenter_net(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", f"--net={network.RUN_NETNS / self.netns}", *cmd], check=True,
                              capture_output=True, text=True, timeout=30)

    def _start_addons(self) -> None:
        # Routing between the nodes' pod bridges, in the cluster's namespace only (the host's stays 0).
        self._nsenter_net("sysctl", "-qw", "net.ipv4.ip_forward=1")
        d = self.dir / "addons"
        d.mkdir(exist_ok=True)
        (d / "Corefile").write_text(config.corefile(self.dns_address, self.dir / "dns.kubeconfig"))
        self._spawn("coredns", ["-conf", str(d / "Corefile")], binary=self.node_bin_dir / "coredns")
        ready = f"http://127.0.0.1:{config.COREDNS_READY_PORT}/ready"

        def dns_ready() -> bool:
            self.check_alive()
            return self.in_netns(lambda: urllib.request.urlopen(ready, timeout=2).status == 200)

        wait_for(dns_ready, 60, "CoreDNS /ready")
        self._save()

    def _start_kube_proxy(self, node: str) -> None:
        """One kube-proxy for the cluster's namespace, named after the first node: at start it waits 30 s
        for its Node to exist, so it starts once one does (Services need a node to have pods anyway)."""
        d = self.dir / "addons"
        crt, key = self.pki.issue("kube-proxy", "system:kube-proxy")
        self.write_kubeconfig(d / "kube-proxy.kubeconfig", "system:kube-proxy", crt, key)
        (d / "kube-proxy.yaml").write_text(config.to_json(
            config.kube_proxy_config(d / "kube-proxy.kubeconfig", self.api_host, node)))
        self._spawn("kube-proxy", [f"--config={d / 'kube-proxy.yaml'}", "--v=1"],
                    binary=self.node_bin_dir / "kube-proxy")
        # kube-proxy has programmed the `kubernetes` Service once its chain holds a rule for it.
        def programmed() -> bool:
            self.check_alive()
            return "default/kubernetes" in self._nsenter_net("iptables-save", "-t", "nat").stdout

        wait_for(programmed, 60, "kube-proxy rules for default/kubernetes")
        self._save()

    def describe(self) -> dict[str, Any]:
        """cluster.json: the control plane's fields plus every real node's processes and cgroup."""
        info = super().describe()
        info["backend"] = "real"
        info["real_nodes"] = {n.name: {"dir": str(n.dir), "cgroup": n.cgroup, "address": n.address,
                                       "containerd": n.containerd.pid if n.containerd else None,
                                       "kubelet": n.proc.pid if n.proc else None}
                              for n in self.nodes.values()}
        return info

    # ---------------------------------------------------------------- nodes
    def add_node(self, name: str, *, cpu: str = "8", memory: str = "32Gi", gpus: int = 0,
                 pods: int = 110, labels: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None, wait: bool = True,
                 timeout: float = 60) -> RealNode:
        """Start a real node (containerd, images imported, kubelet) and wait until it is Ready.

        `cpu` and `memory` are not applied: a real kubelet reports the machine's capacity. `gpus` fake
        `nvidia.com/gpu` by patching the Node's status (the device-plugin socket directory is per
        machine, so kubelets on one host cannot each run a plugin).
        """
        del cpu, memory
        if name in self.nodes:
            raise ValueError(f"node {name} exists")
        ndir = self.dir / "nodes" / name
        for sub in ("machine/var-lib", "machine/var-log", "cni", "containerd"):
            (ndir / sub).mkdir(parents=True, exist_ok=True)
        index, address, serving_crt, serving_key = self.enroll_node(name, ndir)
        node = RealNode(name=name, index=index, address=address, dir=ndir, config=ndir / "kubelet.yaml",
                        cgroup=cgroups.node_root(self.netns, name), gpus=gpus)
        for rel, value in config.KUBELET_SYSCTLS.items():
            (ndir / "machine" / "sysctl" / rel).parent.mkdir(parents=True, exist_ok=True)
            (ndir / "machine" / "sysctl" / rel).write_text(value + "\n")
        (ndir / "containerd.toml").write_text(config.containerd_config(ndir, self.images["pause"], ndir / "cni"))
        (ndir / "cni" / "10-rtj.conflist").write_text(config.to_json(
            config.cni_conflist(index, Path("/var/lib/cni/networks"))))
        (ndir / "kubelet.yaml").write_text(config.to_json(config.kubelet_config(
            address=address, cgroup_root=node.cgroup, runtime_socket=node.socket, ca_crt=self.pki.ca_crt,
            serving_crt=serving_crt, serving_key=serving_key, cluster_dns=self.dns_address, max_pods=pods,
            taints=taints)))
        node.argv = [f"--config={ndir / 'kubelet.yaml'}", f"--kubeconfig={ndir / 'kubeconfig'}",
                     f"--hostname-override={name}", f"--node-ip={address}", "--root-dir=/var/lib/kubelet",
                     "--v=1"]
        if labels:
            node.argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
        self.nodes[name] = node
        self._boot(node)
        if wait:
            self.wait_node_ready(name, timeout=timeout)
        return node

    def _boot(self, node: RealNode) -> None:
        """Start the node's machine: mount namespace + containerd, its images, then the kubelet."""
        cgroups.create(node.cgroup)
        logs = node.dir / "logs"
        logs.mkdir(exist_ok=True)
        with (logs / "containerd.log").open("ab") as out:
            node.containerd = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", str(NODE_INIT), str(node.dir),
                 str(self.hostpath_root), *SHARED_PATHS, "--",
                 "containerd", f"--config={node.dir / 'containerd.toml'}"],
                preexec_fn=self.preexec(),  # noqa: PLW1509 (two syscalls, see controlplane.in_cluster)
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        cgroups.join_runtime(node.cgroup, node.containerd.pid)
        node.killed = node.partitioned = False
        self._save()

        def containerd_up() -> bool:
            if node.containerd is not None and node.containerd.poll() is not None:
                raise RuntimeError(f"containerd of {node.name} exited: "
                                   f"{(logs / 'containerd.log').read_text(errors='replace')[-3000:]}")
            return self.ctr(node.name, "version", check=False).returncode == 0

        wait_for(containerd_up, 30, f"containerd of {node.name}", interval=0.05)
        for archive in self.image_archives:
            self.ctr(node.name, "images", "import", "--snapshotter=overlayfs", str(archive))
        with (logs / "kubelet.log").open("ab") as out:
            node.proc = subprocess.Popen(
                ["nsenter", f"--target={node.containerd.pid}", "--mount", "--root", "--wd", "--",
                 str(self.node_bin_dir / "kubelet"), *node.argv],
                preexec_fn=self.preexec(),  # noqa: PLW1509
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        cgroups.join_runtime(node.cgroup, node.proc.pid)
        self._save()

    def ctr(self, node: str, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """containerd's own CLI against `node`'s containerd, in the `k8s.io` namespace the CRI uses."""
        res = subprocess.run(["ctr", f"--address={self.nodes[node].socket}", "--namespace=k8s.io", *args],
                             check=False, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} on {node} failed ({res.returncode}): {res.stderr}")
        return res

    def load_image(self, archive: Path) -> None:
        """Import a docker/OCI archive into every node now and into every node booted later."""
        self.image_archives.append(archive)
        for name, node in self.nodes.items():
            if not node.killed:
                self.ctr(name, "images", "import", "--snapshotter=overlayfs", str(archive), timeout=1800)

    def wait_node_ready(self, name: str, timeout: float = 60) -> None:
        """Block until the Node is Ready (failing early if its kubelet or containerd died), then fake GPUs."""
        node = self.nodes[name]

        def ready() -> bool:
            for what, proc in (("kubelet", node.proc), ("containerd", node.containerd)):
                if proc is not None and proc.poll() is not None:
                    tail = (node.dir / "logs" / f"{what}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{what} of {name} exited with {proc.returncode}: {tail}")
            return self.node_ready(name)

        wait_for(ready, timeout, f"node {name} Ready (logs in {node.dir / 'logs'})")
        if "kube-proxy" not in self.components:
            self._start_kube_proxy(name)
        if node.gpus:
            gpus = str(node.gpus)
            patch = {"status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus}}}
            self.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(patch))

    def _reap(self, node: RealNode) -> None:
        for proc in (node.proc, node.containerd):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)

    def kill_node(self, name: str) -> None:
        """The machine dies: every process of the node (kubelet, containerd, shims, containers) is SIGKILLed
        at once; its mounts go with its mount namespace; nothing is cleaned up in the API."""
        node = self.nodes[name]
        cgroups.kill_all(node.cgroup)
        self._reap(node)
        cgroups.wait_empty(node.cgroup)
        node.killed, node.partitioned = True, False
        self._save()

    def restore_node(self, name: str, *, wait: bool = True, timeout: float = 60) -> None:
        """The machine boots again on the same disk: the kubelet reconciles (stale sandboxes are removed)."""
        node = self.nodes[name]
        if not node.killed:
            raise RuntimeError(f"node {name} is running")
        self._boot(node)
        if wait:
            self.wait_node_ready(name, timeout=timeout)

    def partition_node(self, name: str) -> None:
        """The node is cut off from the control plane: its kubelet is frozen (SIGSTOP), its containers
        keep running, so the Node goes NotReady while the workload lives on."""
        node = self.nodes[name]
        if node.proc is None or node.killed:
            raise RuntimeError(f"node {name} is not running")
        os.kill(node.proc.pid, signal.SIGSTOP)
        node.partitioned = True

    def heal_node(self, name: str) -> None:
        """Undo `partition_node`: the kubelet resumes where it stopped and reports again."""
        node = self.nodes[name]
        if node.proc is not None and node.partitioned:
            os.kill(node.proc.pid, signal.SIGCONT)
        node.partitioned = False

    def container_pids(self, namespace: str, pod: str) -> list[int]:
        """Host pids of a pod's processes (its containers and sandbox), from the node's cgroup tree."""
        obj = self.get("pod", pod, namespace)
        if not obj or not obj["spec"].get("nodeName"):
            return []
        uid = obj["metadata"]["uid"]
        node = self.nodes[obj["spec"]["nodeName"]]
        base = cgroups.CGROUP_FS / "freezer" / node.cgroup.strip("/") / "kubepods"
        pids: list[int] = []
        for d in base.rglob(f"pod{uid}"):
            pids += cgroups.pids(str(d.relative_to(cgroups.CGROUP_FS / "freezer")))
        return pids

    def pod_cgroup(self, namespace: str, pod: str, controller: str) -> Path | None:
        """The pod's cgroup directory in `controller`'s hierarchy (for asserting limits)."""
        obj = self.get("pod", pod, namespace)
        if not obj or not obj["spec"].get("nodeName"):
            return None
        node = self.nodes[obj["spec"]["nodeName"]]
        base = cgroups.CGROUP_FS / controller / node.cgroup.strip("/") / "kubepods"
        return next(iter(base.rglob(f"pod{obj['metadata']['uid']}")), None)

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A container's log as the kubelet wrote it (/var/log/pods of its node; works on dead nodes too)."""
        for ndir in sorted((self.dir / "nodes").glob("*")):
            for d in sorted((ndir / "machine" / "var-log" / "pods").glob(f"{namespace}_{pod}_*"),
                            key=lambda p: p.stat().st_mtime):
                logs = sorted(d.glob(f"{container or '*'}/*.log"))
                if logs:
                    return "".join(_cri_log_line(line) for line in logs[-1].read_text(errors="replace")
                                   .splitlines(keepends=True))
        return ""

    def disk_usage(self, name: str) -> int:
        """Bytes a node's directory holds (containerd's content store and snapshots, kubelet, logs)."""
        total = 0
        for dirpath, _, files in os.walk(self.nodes[name].dir):
            for f in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(dirpath, f))
                    total += st.st_blocks * 512
        return total

    def stop(self, *, remove: bool = False) -> None:
        """Kill every node (cgroup by cgroup), remove their cgroups, then the control plane and network."""
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGCONT)  # a frozen kubelet would hold the freezer
            cgroups.kill_all(node.cgroup)
            self._reap(node)
            with contextlib.suppress(TimeoutError):
                cgroups.wait_empty(node.cgroup)
            cgroups.remove(node.cgroup)
        super().stop(remove=remove)
        cgroups.remove(f"/{cgroups.PREFIX}/{self.netns}")


def _cri_log_line(line: str) -> str:
    """`<time> <stream> <F|P> <text>` (the CRI log format) -> `<text>`, joining partial lines."""
    parts = line.split(" ", 3)
    if len(parts) < 4:
        return line
    return parts[3] if parts[2] == "F" else parts[3].rstrip("\n")


def down(cluster_dir: Path | str) -> None:
    """Tear down a real-node cluster from its directory: nodes by cgroup, then the local backend's `down`."""
    from e2e.controlplane.plane import down as local_down

    info = json.loads((Path(cluster_dir) / "cluster.json").read_text())
    for node in (info.get("real_nodes") or {}).values():
        cgroups.kill_all(node["cgroup"])
        with contextlib.suppress(TimeoutError):
            cgroups.wait_empty(node["cgroup"], timeout=10)
        cgroups.remove(node["cgroup"])
    local_down(cluster_dir)
    if info.get("netns"):
        cgroups.remove(f"/{cgroups.PREFIX}/{info['netns']}")

