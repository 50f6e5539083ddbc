"""The control plane every process-node backend runs on: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler as local processes, with their PKI, a network namespace of their own, the host's forwarder
into it and a watchdog that tears it all down when the harness dies.

Unlike envtest, the controller-manager and scheduler run too, so node lifecycle (NotReady, unreachable
taints, taint eviction), garbage collection and scheduling are Kubernetes' own. Node backends build on
`ControlPlane`: simulated nodes (e2e.localcluster), real kubelets (e2e.realnodes); KWOK attaches to the
simulated one (e2e.kwokcluster). It keeps the bookkeeping every process node shares (`NodeHandle`: its
address on the bridge, its identity, its process), so `stop` and `down` reach every node too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from e2e.cluster import ClusterTools, wait_for
from e2e.processes import terminate
from e2e.s3server import Identity, S3Server

from . import network
from .binaries import REPO_ROOT, ensure_binaries
from .pki import PKI

K8S_SERVICE_CIDR = "10.96.0.0/16"
# Fixed ports: each cluster has a network namespace of its own, so nothing else binds them.
T = TypeVar("T")
API_PORT, ETCD_PORT, ETCD_PEER_PORT, KCM_PORT, SCHEDULER_PORT = 6443, 2379, 2380, 10257, 10259
# SeaweedFS inside the namespace, on the bridge address (gRPC on each +10000): master, volume, filer, S3.
S3_PORTS = (9333, 8080, 8888, 8333)
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Frozen while the apiserver restarts (see ControlPlane.restart_component): the harness's controllers, not ours.
FROZEN_DURING_APISERVER_RESTART = ("kube-controller-manager", "kube-scheduler")

# The node agents' /etc/hosts writer reads pods and services cluster-wide, as CoreDNS does
# (with CoreDNS' rights), under its own identity rather than the node's.
DNS_RBAC = {"apiVersion": "v1", "kind": "List", "items": [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "rtj:dns"},
     "rules": [{"apiGroups": [""], "resources": ["pods", "services", "endpoints", "namespaces"],
                "verbs": ["get", "list", "watch"]},
               {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "rtj:dns"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rtj:dns"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:rtj-dns"}]},
]}


def in_cluster(netns_fd: int) -> Callable[[], None]:
    """preexec_fn: enter the cluster's network namespace and raise the CPU priority.

    Control plane and node agents run at a higher priority than pods (which the launcher resets to 0):
    on a 2-core machine a busy training pod must not starve heartbeats into a false NotReady, just as
    real nodes reserve CPU for the kubelet. (Two syscalls, no locks: safe between fork and exec.)
    """

    def preexec() -> None:
        network.enter(netns_fd)
        os.setpriority(os.PRIO_PROCESS, 0, -5)

    return preexec


def kill_process_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Freeze `pid`, then signal it and every descendant (found through /proc)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(children.get(p, []))
    for p in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


@dataclass
class NodeHandle:
    """Bookkeeping for one process node (simulated agent or real kubelet): its process and state."""

    name: str
    index: int
    address: str
    dir: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False
    partitioned: bool = False


@dataclass
class Component:
    """One control-plane process, its arguments (for a restart) and its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)
    throwaway: bool = False  # killed at once on stop (no state worth a graceful exit: a test's S3 server)

@dataclass
class ControlPlane(ClusterTools):
    """A running control plane. Create with `start(...)` (on a node backend); stop with `.stop()`.

    `api_url` is the host's way in (the loopback forwarder); `api_host`/`api_port` are the apiserver's
    address inside the cluster's namespace, where the nodes and pods reach it.
    """

    # The module whose `down(dir)` the watchdog runs: a backend with more to tear down names its own.
    DOWN_MODULE: ClassVar[str] = "e2e.controlplane.plane"

    name: str
    dir: Path
    bin_dir: Path
    kubeconfig: Path
    api_url: str
    api_host: str
    api_port: int
    subnet: int
    bridge: str
    netns: str
    pki: PKI
    node_monitor_grace_period: str
    components: dict[str, Component] = field(default_factory=dict)
    nodes: dict[str, NodeHandle] = field(default_factory=dict)
    _watchdog: subprocess.Popen[bytes] | None = None
    _forwarder: subprocess.Popen[bytes] | None = None
    _netns_fd: int = -1

    # ---------------------------------------------------------------- start/stop
    @classmethod
    def start(
        cls,
        name: str = "rtj",
        *,
        base_dir: Path | str | None = None,
        node_monitor_grace_period: str = "8s",
        node_monitor_period: str = "1s",
        extra_apiserver_args: tuple[str, ...] = (),
        extra_controller_manager_args: tuple[str, ...] = (),
        timeout: float = 120,
        detach: bool = False,
        **backend_fields: Any,
    ) -> Self:
        """Start etcd, kube-apiserver, kube-controller-manager and kube-scheduler; wait until ready.

        Processes die with the calling process unless `detach` (then `down(dir)` cleans up).
        `backend_fields` are the node backend's own dataclass fields.
        """
        if os.geteuid() != 0:
            raise RuntimeError("the local cluster needs root (network namespaces, mount namespaces)")
        bin_dir = ensure_binaries()
        base = Path(base_dir or os.environ.get("RTJ_CLUSTER_BASE", "/tmp/rtj-clusters"))
        base.mkdir(parents=True, exist_ok=True)
        cdir = base / f"{name}-{time.strftime('%H%M%S')}-{secrets.token_hex(2)}"
        cdir.mkdir(parents=True)
        api_host = network.gateway()
        pki = PKI(cdir / "pki")
        cluster = cls(
            name=name, dir=cdir, bin_dir=bin_dir, kubeconfig=cdir / "admin.kubeconfig",
            api_url="", api_host=api_host, api_port=API_PORT, subnet=network.SUBNET,
            bridge=network.BRIDGE, netns=network.cluster_netns_name(cdir.name), pki=pki,
            node_monitor_grace_period=node_monitor_grace_period, **backend_fields,
        )
        cluster._save()
        if not detach:
            cluster._start_watchdog()
        try:
            with network.locked():  # until the forwarder runs in it, the namespace would look stale
                network.cleanup_stale()
                network.create_cluster_netns(cluster.netns)
                cluster._netns_fd = network.open_netns(cluster.netns)
                cluster._start_forwarder()
            cluster._save()
            cluster._start_control_plane(node_monitor_period, extra_apiserver_args,
                                         extra_controller_manager_args, timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def describe(self) -> dict[str, Any]:
        """What a shell user needs to reach this cluster (also written to cluster.json)."""
        return {"name": self.name, "dir": str(self.dir), "kubeconfig": str(self.kubeconfig),
                "api_url": self.api_url, "bin_dir": str(self.bin_dir), "bridge": self.bridge,
                "subnet": f"10.{self.subnet}.0.0/16", "netns": self.netns,
                "pids": {**{n: c.proc.pid for n, c in self.components.items()},
                         **({"api-forward": self._forwarder.pid} if self._forwarder else {})},
                "nodes": {n: (h.proc.pid if h.proc else None) for n, h in self.nodes.items()}}

    def _spawn(self, name: str, args: list[str], binary: Path | None = None) -> Component:
        log = self.dir / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen([str(binary or self.bin_dir / name), *args], stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=self.preexec(),  # noqa: PLW1509 (see in_cluster)
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.dir)
        comp = Component(name, proc, log, args)
        self.components[name] = comp
        return comp

    def _start_forwarder(self) -> None:
        """Host 127.0.0.1:<free port> -> the apiserver inside the namespace (see forward.py)."""
        self._forwarder, port = self._spawn_forwarder(f"{self.api_host}:{self.api_port}", "api-forward")
        self.api_url = f"https://127.0.0.1:{port}"

    def _spawn_forwarder(self, target: str, name: str) -> tuple[subprocess.Popen[bytes], int]:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        log = self.dir / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        with listener, log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "e2e.controlplane.forward", f"--listen-fd={listener.fileno()}",
                 f"--target={target}", f"--cluster-dir={self.dir}"],
                pass_fds=(listener.fileno(),), preexec_fn=self.preexec(),  # noqa: PLW1509
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=REPO_ROOT, env=env)
        return proc, port

    def forward_port(self, host: str, port: int, name: str) -> int:
        """Reach `host:port` inside the cluster's namespace from this machine: returns a 127.0.0.1 port
        (a forwarder like the apiserver's, stopped with the cluster)."""
        proc, local = self._spawn_forwarder(f"{host}:{port}", name)
        self.components[name] = Component(name, proc, self.dir / "logs" / f"{name}.log", [f"{host}:{port}"],
                                          throwaway=True)
        self._save()
        return local

    def start_s3(self, identities: Iterable[Identity] = ()) -> S3Server:
        """A real S3 server (SeaweedFS) inside the cluster: pods reach `server.endpoint` (on the bridge
        address), this process `server.local_endpoint` (a forwarded loopback port). Stopped with the cluster."""
        workdir = self.dir / "s3"
        ports = {"master": S3_PORTS[0], "volume": S3_PORTS[1], "filer": S3_PORTS[2], "s3": S3_PORTS[3]}
        server = S3Server.start(workdir, identities=identities, host=self.api_host, ports=ports,
                                preexec_fn=self.preexec(), wait=False)
        assert server.process is not None
        self.components["seaweedfs"] = Component("seaweedfs", server.process, workdir / "weed.log", throwaway=True)
        local = self.forward_port(self.api_host, server.port, "s3-forward")
        server.local_endpoint = f"http://127.0.0.1:{local}"
        server.wait_ready()
        return server

    def in_netns(self, fn: Callable[[], T], timeout: float = 60) -> T:
        """Run `fn` on a thread inside the cluster's network namespace (to reach node or pod addresses)."""
        return network.call_in_netns(self.netns, fn, timeout)

    def _start_watchdog(self) -> None:
        # Tie the cluster's lifetime to the harness process unless detached (`up` from the CLI):
        # a crashed or killed pytest must not leave a control plane behind. The watchdog waits for
        # EOF on a pipe only we hold, then runs `down`. (PR_SET_PDEATHSIG would fire when the
        # *thread* that spawned a process exits, which breaks add_node from a worker thread.)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read(); "
             f"from {self.DOWN_MODULE} import down; down(sys.argv[1])", str(self.dir)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=(self.dir / "watchdog.log").open("ab"),
            start_new_session=True, cwd=REPO_ROOT, env=env)

    @property
    def internal_api_url(self) -> str:
        """The apiserver as the control plane, the nodes and the pods reach it (inside the namespace)."""
        return f"https://{self.api_host}:{self.api_port}"

    def write_kubeconfig(self, path: Path, user: str, cert: Path, key: Path, *, internal: bool = True) -> None:
        """A kubeconfig for `user` (client cert and key), pointing inside the namespace unless not `internal`."""
        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {"server": self.internal_api_url if internal else self.api_url,
                                                         "certificate-authority": str(self.pki.ca_crt)}}],
            "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": user}}],
            "current-context": self.name,
        }
        path.write_text(json.dumps(cfg, indent=2))

    def _start_control_plane(self, node_monitor_period: str, extra_api: tuple[str, ...],
                             extra_kcm: tuple[str, ...], timeout: float) -> None:
        pki, d = self.pki, self.dir
        etcd_port, etcd_peer, kcm_port, sched_port = ETCD_PORT, ETCD_PEER_PORT, KCM_PORT, SCHEDULER_PORT
        self._spawn("etcd", [
            "--name=default", f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync=true",  # test data: trade durability for speed on slow CI disks
            "--log-level=warn",
        ])
        api_crt, api_key = pki.issue(
            "apiserver", "kube-apiserver", server=True, client=False,
            dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local", "localhost"),
            ips=(self.api_host, "127.0.0.1", "10.96.0.1"))
        sa_key, sa_pub = pki.service_account_keys()
        kubelet_crt, kubelet_key = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                             ("system:masters",))
        admin_crt, admin_key = pki.issue("admin", "kubernetes-admin", ("system:masters",))
        kcm_crt, kcm_key = pki.issue("controller-manager", "system:kube-controller-manager")
        sch_crt, sch_key = pki.issue("scheduler", "system:kube-scheduler")
        self.write_kubeconfig(self.kubeconfig, "admin", admin_crt, admin_key, internal=False)
        kcm_kc, sch_kc = d / "controller-manager.kubeconfig", d / "scheduler.kubeconfig"
        self.write_kubeconfig(kcm_kc, "system:kube-controller-manager", kcm_crt, kcm_key)
        self.write_kubeconfig(sch_kc, "system:kube-scheduler", sch_crt, sch_key)
        etcd_health = f"http://127.0.0.1:{etcd_port}/health"
        wait_for(lambda: self.in_netns(lambda: urllib.request.urlopen(etcd_health, timeout=2).status == 200),
                 timeout, "etcd /health")
        self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.api_host}", f"--advertise-address={self.api_host}",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={api_crt}", f"--tls-private-key-file={api_key}",
            f"--client-ca-file={pki.ca_crt}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_key}",
            "--authorization-mode=Node,RBAC",
            # The default plugin set is on; NodeRestriction is added as every real cluster does,
            # so simulated nodes are held to what a kubelet may do.
            "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={K8S_SERVICE_CIDR}",
            f"--kubelet-client-certificate={kubelet_crt}", f"--kubelet-client-key={kubelet_key}",
            f"--kubelet-certificate-authority={pki.ca_crt}", "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true", "--profiling=false", "--v=1",
            *extra_api,
        ])
        ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
        ctx.load_cert_chain(str(admin_crt), str(admin_key))
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def ok(url: str, context: ssl.SSLContext, inside: bool = True) -> bool:
            self.check_alive()
            get = lambda: urllib.request.urlopen(url, timeout=2, context=context).status == 200  # noqa: E731
            return self.in_netns(get) if inside else get()

        # Through the forwarder, as every host-side client will come in.
        wait_for(lambda: ok(f"{self.api_url}/readyz", ctx, inside=False), timeout, "kube-apiserver /readyz")
        dns_crt, dns_key = pki.issue("dns", "system:rtj-dns")
        self.write_kubeconfig(d / "dns.kubeconfig", "system:rtj-dns", dns_crt, dns_key)
        self.kubectl("apply", "-f", "-", input=json.dumps(DNS_RBAC))
        # RBAC bootstrap must be in place first: the controllers exit on a 403 at startup.
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kcm_kc}", f"--authentication-kubeconfig={kcm_kc}",
            f"--authorization-kubeconfig={kcm_kc}",
            "--bind-address=127.0.0.1", f"--secure-port={kcm_port}",
            f"--service-account-private-key-file={sa_key}", f"--root-ca-file={pki.ca_crt}",
            "--use-service-account-credentials=true", "--leader-elect=false",
            f"--node-monitor-grace-period={self.node_monitor_grace_period}",
            f"--node-monitor-period={node_monitor_period}",
            f"--cluster-name={self.name}", "--profiling=false", "--v=1",
            *extra_kcm,
        ])
        self._spawn("kube-scheduler", [
            f"--kubeconfig={sch_kc}", f"--authentication-kubeconfig={sch_kc}",
            f"--authorization-kubeconfig={sch_kc}",
            "--bind-address=127.0.0.1", f"--secure-port={sched_port}", "--leader-elect=false",
            "--profiling=false", "--v=1",
        ])
        wait_for(lambda: ok(f"https://127.0.0.1:{kcm_port}/healthz", insecure), timeout,
                 "kube-controller-manager /healthz")
        wait_for(lambda: ok(f"https://127.0.0.1:{sched_port}/healthz", insecure), timeout,
                 "kube-scheduler /healthz")
        # The default ServiceAccount appears once the controller-manager's SA controller runs;
        # pods created before that are rejected, so wait for it as `kubectl` users would.
        wait_for(lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
                 timeout, "default ServiceAccount")
        self._save()

    def adopt(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> Component:
        """Stop a process started outside the namespace (e.g. KWOK) with the cluster, and by its watchdog."""
        comp = Component(name, proc, log)
        self.components[name] = comp
        self._save()
        return comp

    def signal_component(self, name: str, sig: int) -> None:
        """Signal a control-plane process (SIGSTOP etcd: the API server cannot reach its storage)."""
        os.kill(self.components[name].proc.pid, sig)

    def start_component(self, name: str, binary: Path, args: list[str]) -> Component:
        """Run an add-on controller (e.g. Kueue, e2e/kueue.py) like the control plane: inside the
        cluster's network namespace, logged to logs/<name>.log, stopped with the cluster."""
        comp = self._spawn(name, args, binary)
        self._save()
        return comp

    def restart_component(self, name: str, *, down_seconds: float = 0.0, grace: float = 5.0,
                          timeout: float = 120) -> None:
        """Stop a control-plane process (SIGTERM, `grace` seconds, SIGKILL) and start it again, same flags.

        `down_seconds` keeps it down that long (an injected outage); waits for the apiserver's /readyz.
        The apiserver stops listening at once on SIGTERM but can linger ~30 s draining long-running
        requests, so a long `grace` turns a short outage into a long one.

        While the apiserver is down, the controller-manager and scheduler are frozen (SIGSTOP) and thawed once
        it is ready again. Left running, their informers retry through the outage with client-go's jittered
        exponential backoff and can sit out up to a minute after it ends; the controller-manager's namespace and
        ServiceAccount controllers then stall the next test (seen in CI: 79 s). Our operator and the nodes
        are left running: how they ride out the outage is what the tests are about.
        """
        comp = self.components[name]
        args = comp.args
        frozen = [self.components[c].proc for c in FROZEN_DURING_APISERVER_RESTART
                  if name == "kube-apiserver" and c in self.components and self.components[c].proc.poll() is None]
        for proc in frozen:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            terminate(comp.proc, grace)
            if down_seconds:
                time.sleep(down_seconds)
            self._spawn(name, args)
            self._save()
            wait_for(lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, timeout,
                     f"apiserver ready after restarting {name}")
        finally:
            for proc in frozen:
                os.kill(proc.pid, signal.SIGCONT)

    def _save(self) -> None:
        (self.dir / "cluster.json").write_text(json.dumps(self.describe(), indent=2))

    def check_alive(self) -> None:
        """Raise, with its log's tail, when the forwarder or a component has exited (while waiting on one)."""
        if self._forwarder is not None and self._forwarder.poll() is not None:
            raise RuntimeError(f"the API forwarder exited; see {self.dir / 'logs' / 'api-forward.log'}")
        for comp in self.components.values():
            if comp.proc.poll() is not None:
                tail = comp.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{comp.name} exited with {comp.proc.returncode}; log {comp.log}:\n{tail}")

    def stop(self, *, remove: bool = False) -> None:
        """Kill every node and component, delete the network; keep the directory (logs) unless `remove`."""
        if self._watchdog is not None:
            # Gone before we free the bridge name, so it cannot tear down a successor cluster's network.
            self._watchdog.kill()
            self._watchdog.wait(timeout=10)
            self._watchdog.stdin.close()  # type: ignore[union-attr]
            self._watchdog = None
        for node in self.nodes.values():
            if node.proc and node.proc.poll() is None:
                kill_process_tree(node.proc.pid)
                node.proc.wait(timeout=10)
        for comp in reversed(list(self.components.values())):
            if comp.proc.poll() is None and comp.throwaway:
                comp.proc.kill()
                comp.proc.wait(timeout=10)
            else:
                terminate(comp.proc)
        if self._forwarder is not None and self._forwarder.poll() is None:
            self._forwarder.kill()
            self._forwarder.wait(timeout=10)
        network.delete_cluster_netns(self.netns)
        if self._netns_fd >= 0:
            os.close(self._netns_fd)
            self._netns_fd = -1
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def log_dir(self) -> Path:
        """Component logs (`<component>.log`); node and pod logs live under nodes/."""
        return self.dir / "logs"

    def preexec(self) -> Callable[[], None]:
        """preexec_fn for a process that belongs inside the cluster (see `in_cluster`)."""
        return in_cluster(self._netns_fd)

    # ---------------------------------------------------------------- node bookkeeping
    def enroll_node(self, name: str, ndir: Path) -> tuple[int, str, Path, Path]:
        """A new node's index, its address on the bridge, its kubeconfig (`ndir/kubeconfig`, as
        system:node:<name>) and its kubelet serving certificate: (index, address, cert, key)."""
        if name in self.nodes:
            raise ValueError(f"node {name} exists")
        index = len(self.nodes) + 1
        if index > 250:
            raise ValueError("at most 250 nodes per cluster")
        address = network.add_node_address(self.netns, index, self.subnet)
        crt, key = self.pki.issue(f"node-{name}", f"system:node:{name}", ("system:nodes",))
        self.write_kubeconfig(ndir / "kubeconfig", f"system:node:{name}", crt, key)
        # The kubelet API (logs) is served on the node's InternalIP, verified by the apiserver.
        serving_crt, serving_key = self.pki.issue(f"node-{name}-serving", f"system:node:{name}", ("system:nodes",),
                                                  server=True, client=False, dns=(name,), ips=(address,))
        return index, address, serving_crt, serving_key

    def is_killed(self, name: str) -> bool:
        """True between `kill_node` and `restore_node`."""
        return self.nodes[name].killed

    def partitioned_nodes(self) -> list[str]:
        """Nodes cut off by `partition_node` and not healed since (nor killed)."""
        return [n for n, h in self.nodes.items() if h.partitioned and not h.killed]

    # ---------------------------------------------------------------- volumes
    @property
    def hostpath_root(self) -> Path:
        """hostPath volumes (and PVs) are rooted here, shared by every node: an RWX volume."""
        return self.dir / "hostpath"

    def host_path(self, path: str) -> Path:
        """Where a pod-visible hostPath `path` lives on this machine."""
        return self.hostpath_root / path.lstrip("/")

    # ---------------------------------------------------------------- clients
    def version(self) -> str:
        """The Kubernetes version the binaries were built as (e.g. v1.34.4)."""
        return self.bin_dir.name.split("-")[1]

    def tool_env(self) -> dict[str, str]:
        """Environment for kubectl/helm subprocesses: this cluster's kubeconfig, no user config."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(self.dir / "helm/cache"),
                "HELM_CONFIG_HOME": str(self.dir / "helm/config"), "HELM_DATA_HOME": str(self.dir / "helm/data"),
                "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises with stderr on failure when `check`."""
        res = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                             check=False, capture_output=True, text=True, input=input, timeout=timeout,
                             env=self.tool_env())
        if check and res.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster."""
        res = subprocess.run([str(self.bin_dir / "helm"), f"--kubeconfig={self.kubeconfig}", *args], check=False,
                             capture_output=True, text=True, timeout=timeout, env=self.tool_env())
        if check and res.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res


def newest_dir() -> Path:
    """The most recently written cluster directory (what `down`/`status` act on when given none)."""
    base = Path(os.environ.get("RTJ_CLUSTER_BASE", "/tmp/rtj-clusters"))
    dirs = sorted(base.glob("*/cluster.json"), key=lambda p: p.stat().st_mtime)
    if not dirs:
        sys.exit(f"no cluster under {base}")
    return dirs[-1].parent


def down(cluster_dir: Path | str) -> None:
    """Tear down a cluster from its directory (cluster.json), e.g. one started detached."""
    info = json.loads((Path(cluster_dir) / "cluster.json").read_text())
    pids = [p for p in info.get("nodes", {}).values() if p] + list(info.get("pids", {}).values())
    for pid in pids:
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(info["dir"]).encode() in cmdline:  # never signal a recycled pid
                kill_process_tree(pid)
    if info.get("netns"):
        network.delete_cluster_netns(info["netns"])
    with network.locked():
        network.cleanup_stale()
