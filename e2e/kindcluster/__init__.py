"""The kind-backed cluster: `e2e.cluster.ClusterLike` for machines with Docker.

Selected with RTJ_CLUSTER=kind. One control plane + N workers (default 3, RTJ_KIND_WORKERS),
every node mounting the same host directory for each shared path (an RWX volume for checkpoints),
controller-manager flags through a kubeadm patch, project images built and `kind load`ed, and a node
"killed" with `docker pause` (its kubelet and pods freeze; the control plane sees a silent machine).

Differences from the local substrate, by construction: nodes exist from the start (`add_node` claims
a spare worker and labels it), their CPU/memory are the host's, and GPUs are advertised by patching
the node's status capacity with `nvidia.com/gpu` (as the device-plugin docs show for extended resources).

Two ways to run: with a machine's own Docker and a registry (a laptop, .github/workflows/e2e-kind.yml: the
stock kindest/node, images from `docker build`), or with `engine=LocalEngine.start()` (RTJ_KIND_ENGINE=netns,
or automatically when no Docker engine answers): Debian's dockerd in a netns of its own, the node image built
from our binaries, our images `docker build`-ed in that engine (its RUN steps reach PyPI through
e2e/kindcluster/egress.py) and `kind load docker-image`-ed, and the API reached through a relay on the host's
loopback (e2e/kindcluster/engine.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.cluster import ClusterTools
from e2e.kindcluster.engine import LocalEngine
from e2e.kindcluster.relay import NetnsRelay

KIND_VERSION = "v0.30.0"
NODE_IMAGE = os.environ.get("RTJ_KIND_NODE_IMAGE", "kindest/node:v1.34.0")
SHARED_PATHS = ("/rtj-checkpoints", "/rtj-shared")
REPO_ROOT = Path(__file__).resolve().parents[2]
# Image tag -> Dockerfile context, built and loaded into every node.
IMAGES = {
    "resilient-training-operator:e2e": ("operator/Dockerfile", "."),
    "resilient-training-trainer:e2e": ("trainer_image/Dockerfile", "."),
}

Runner = Callable[..., subprocess.CompletedProcess[str]]
# cgroup cpu.shares of the kind control plane's container on the netns engine; each worker keeps Docker's 1024.
CONTROL_PLANE_CPU_SHARES = 8192


def default_runner(argv: Sequence[str], *, input: str | None = None, timeout: float = 600,
                   check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (docker, kind, kubectl, helm) with a timeout."""
    res = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout,
                         check=False, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr[-3000:]}")
    return res


def kind_config(workers: int, shared_root: Path, node_monitor_grace_period: str = "8s",
                node_monitor_period: str = "1s", shared_paths: Sequence[str] = SHARED_PATHS,
                node_image: str = NODE_IMAGE) -> dict[str, Any]:
    """The kind Cluster config: one control plane, `workers` workers, shared mounts on every node."""
    mounts = [{"hostPath": str(shared_root / p.lstrip("/")), "containerPath": p} for p in shared_paths]
    # kind renders kubeadm v1beta3 for Kubernetes < 1.36, where extraArgs is a map.
    patch = (
        "kind: ClusterConfiguration\n"
        "controllerManager:\n"
        "  extraArgs:\n"
        f'    node-monitor-grace-period: "{node_monitor_grace_period}"\n'
        f'    node-monitor-period: "{node_monitor_period}"\n'
    )
    # The kubelet's lease as on the other substrates (e2e/realnodes/config.py): renewed every second, so a
    # node is judged by its silence within the job's nodeLossTimeoutSeconds, not by a 10 s renew period.
    kubelet = ("kind: KubeletConfiguration\n"
               "nodeLeaseDurationSeconds: 4\n"
               "nodeStatusUpdateFrequency: 1s\n"
               "nodeStatusReportFrequency: 10s\n")
    nodes = [{"role": "control-plane", "image": node_image, "extraMounts": mounts}]
    nodes += [{"role": "worker", "image": node_image, "extraMounts": mounts} for _ in range(workers)]
    return {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "nodes": nodes,
            "kubeadmConfigPatches": [patch, kubelet]}


def worker_container_names(cluster: str, workers: int) -> list[str]:
    """kind names workers <cluster>-worker, <cluster>-worker2, ..."""
    return [f"{cluster}-worker{'' if i == 1 else i}" for i in range(1, workers + 1)]


@dataclass
class KindCluster(ClusterTools):
    """A kind cluster behind the shared interface (apply/get/api_client/create_shared_pvc... come from
    ClusterTools; start/add_node/kill_node/restore_node/stop are kind's own)."""

    name: str
    dir: Path
    kubeconfig: Path
    node_monitor_grace_period: str
    workers: list[str]
    runner: Runner = default_runner
    claimed: dict[str, str] = field(default_factory=dict)  # requested name -> kind node name
    paused: set[str] = field(default_factory=set)  # requested names killed (docker pause) and not restored
    engine: LocalEngine | None = None  # the netns engine this cluster runs on, stopped with it
    relay: NetnsRelay | None = None
    kill_mode: str = "pause"  # "pause": a frozen machine; "kill": a dead one (docker kill, restored by start)
    images: dict[str, str] = field(default_factory=dict)  # image name (e2e/images.py) -> the ref pods request
    cut: set[str] = field(default_factory=set)  # requested names partitioned (off kind's network)

    @classmethod
    def create_commands(cls, name: str, config_path: Path, kubeconfig: Path) -> list[list[str]]:
        """The commands `start` runs, in order (images are built and loaded after creation)."""
        cmds = [["kind", "create", "cluster", "--name", name, "--config", str(config_path),
                 "--kubeconfig", str(kubeconfig), "--wait", "120s"]]
        for tag, (dockerfile, context) in IMAGES.items():
            cmds.append(["docker", "build", "-t", tag, "-f", str(REPO_ROOT / dockerfile), str(REPO_ROOT / context)])
            cmds.append(["kind", "load", "docker-image", tag, "--name", name])
        return cmds

    @classmethod
    def start(cls, name: str = "rtj", *, node_monitor_grace_period: str = "8s", workers: int | None = None,
              base_dir: Path | str | None = None, runner: Runner = default_runner,
              build_images: bool = True, engine: LocalEngine | None = None,
              image_names: Sequence[str] = ("operator", "trainer-cpu"), **_ignored: Any) -> KindCluster:
        """Create the kind cluster, build and load the project images. Extra local-only options are ignored.

        Without Docker of its own (or with RTJ_KIND_ENGINE=netns) the cluster runs on a LocalEngine it
        starts and stops; `image_names` are then e2e/images.py images (their Dockerfiles, build args and refs),
        `docker build`-ed in that engine and loaded into the nodes."""
        if engine is None and runner is default_runner and _wants_local_engine():
            engine = LocalEngine.start()
        if engine is not None:
            try:
                return cls._start_local(name, engine, node_monitor_grace_period, workers, base_dir,
                                        image_names if build_images else ())
            except BaseException:
                engine.stop()
                raise
        workers = workers or int(os.environ.get("RTJ_KIND_WORKERS", "3"))
        kind_name = f"{name}-{secrets.token_hex(2)}"
        base = Path(base_dir or tempfile.gettempdir()) / "rtj-kind"
        cdir = base / kind_name
        for p in SHARED_PATHS:
            (cdir / "hostpath" / p.lstrip("/")).mkdir(parents=True, exist_ok=True)
        config_path = cdir / "kind.json"
        config_path.write_text(json.dumps(kind_config(workers, cdir / "hostpath", node_monitor_grace_period),
                                          indent=2))
        kc = cdir / "kubeconfig"
        cluster = cls(kind_name, cdir, kc, node_monitor_grace_period,
                      worker_container_names(kind_name, workers), runner)
        try:
            for cmd in cls.create_commands(kind_name, config_path, kc):
                if build_images or cmd[:2] == ["kind", "create"]:
                    runner(cmd, timeout=1200)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @classmethod
    def _start_local(cls, name: str, engine: LocalEngine, grace: str, workers: int | None,
                     base_dir: Path | str | None, image_names: Sequence[str]) -> KindCluster:
        """kind on the netns engine with the locally built node image; our images `docker build`-ed in that
        engine and `kind load docker-image`-ed, as on a laptop (LocalEngine.build_images)."""
        workers = workers or int(os.environ.get("RTJ_KIND_WORKERS", "3"))
        env = engine.env()

        def runner(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
            kw.setdefault("env", env)
            return default_runner(engine.in_netns(list(argv)) if argv[0] == "kind" else argv, **kw)

        node_image = engine.node_image()
        refs = engine.build_images(image_names) if image_names else {}
        kind_name = f"{name}-{secrets.token_hex(2)}"
        cdir = Path(base_dir or tempfile.gettempdir()) / "rtj-kind" / kind_name
        for p in SHARED_PATHS:
            (cdir / "hostpath" / p.lstrip("/")).mkdir(parents=True, exist_ok=True)
        config_path = cdir / "kind.json"
        config_path.write_text(json.dumps(kind_config(workers, cdir / "hostpath", grace, node_image=node_image),
                                          indent=2))
        cluster = cls(kind_name, cdir, cdir / "kubeconfig", grace, worker_container_names(kind_name, workers),
                      runner, engine=engine, kill_mode=os.environ.get("RTJ_KIND_KILL", "pause"), images=refs)
        try:
            inner = cdir / "kind-kubeconfig"
            runner(["kind", "create", "cluster", "--name", kind_name, "--config", str(config_path),
                    "--kubeconfig", str(inner), "--wait", "180s"], timeout=1200)
            # The control plane first for CPU, as on its own machine: the engine's share of two cores is split
            # evenly between its containers, and four workers starting torch left the API server so little
            # that every kubelet's 1 s lease PUT timed out for 8 s at once (a spurious NodeLost, cold CI).
            runner(["docker", "update", "--cpu-shares", str(CONTROL_PLANE_CPU_SHARES), f"{kind_name}-control-plane"],
                   timeout=60)
            cluster.relay = relay_kubeconfig(inner, cluster.kubeconfig, engine.netns_path)
            for image, ref in refs.items():
                cluster.load_image(ref, [f"{kind_name}-control-plane"] if image == "operator" else cluster.workers)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def load_image(self, ref: str, nodes: Sequence[str]) -> None:
        """Load `ref` into `nodes` one node at a time from one `docker save` archive, dropping the layer blobs
        each node's containerd keeps beside the unpacked snapshots before the next node (kind's own
        discard_unpacked_layers covers pulls, not imports). `kind load docker-image --nodes a,b,c,d` held
        every node's blobs and snapshots at once: the CPU trainer is 3.3 GB unpacked, so four workers peaked
        near 27 GB and filled a CI disk (ENOSPC in `ctr images import`); node by node it peaks near 17 GB."""
        archive = self.dir / f"load-{secrets.token_hex(4)}.tar"
        try:
            self.runner(["docker", "save", "-o", str(archive), ref], timeout=1800)
            for node in nodes:
                self.runner(["kind", "load", "image-archive", str(archive), "--name", self.name, "--nodes", node],
                            timeout=1800)
                self._drop_layer_blobs(node, ref)
        finally:
            archive.unlink(missing_ok=True)

    def _drop_layer_blobs(self, node: str, ref: str) -> None:
        ctr = ["docker", "exec", node, "ctr", "--namespace=k8s.io"]
        listing = self.runner([*ctr, "images", "ls", f"name=={ref}"]).stdout.splitlines()
        digests = [line.split()[2] for line in listing[1:] if line.split()[:1] == [ref]]
        layers: list[str] = []
        while digests:
            blob = json.loads(self.runner([*ctr, "content", "get", digests.pop()]).stdout)
            digests += [m["digest"] for m in blob.get("manifests", [])]  # an index: its manifests
            layers += [layer["digest"] for layer in blob.get("layers", [])]
        if layers:
            self.runner([*ctr, "content", "rm", *layers], check=False)

    # ------------------------------------------------------------ nodes
    def node_name(self, name: str) -> str:
        """The kind node standing for a requested node name."""
        return self.claimed.get(name, name)

    def add_node(self, name: str, *, gpus: int = 0, labels: dict[str, str] | None = None,
                 **_ignored: Any) -> str:
        """Claim a spare worker for `name`: label it (incl. rtj.local/name) and advertise fake GPUs."""
        spare = [w for w in self.workers if w not in self.claimed.values()]
        if not spare:
            raise RuntimeError(f"no spare kind worker for {name}; raise RTJ_KIND_WORKERS")
        node = spare[0]
        self.claimed[name] = node
        pairs = [f"{k}={v}" for k, v in {**(labels or {}), "rtj.local/name": name}.items()]
        self.kubectl("label", "node", node, "--overwrite", *pairs)
        if gpus:
            patch = [{"op": "add", "path": f"/status/{field}/nvidia.com~1gpu", "value": str(gpus)}
                     for field in ("capacity", "allocatable")]
            self.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(patch))
        return node

    def kill_command(self, name: str) -> list[str]:
        """Freeze the node's container (kubelet, containerd and pods stop, nothing is cleaned up), or with
        kill_mode "kill" end it (SIGKILL to its systemd: every process on the machine gone at once)."""
        return ["docker", "kill" if self.kill_mode == "kill" else "pause", self.node_name(name)]

    def restore_command(self, name: str) -> list[str]:
        """Thaw the node (its kubelet resumes and reconciles with the API), or boot a killed one again."""
        return ["docker", "start" if self.kill_mode == "kill" else "unpause", self.node_name(name)]

    def kill_node(self, name: str) -> None:
        """See kill_command."""
        self.runner(self.kill_command(name))
        self.paused.add(name)

    def is_killed(self, name: str) -> bool:
        return name in self.paused

    def restore_node(self, name: str, *, wait: bool = True, timeout: float = 120) -> None:
        """See restore_command; waits for Ready."""
        self.runner(self.restore_command(name))
        self.paused.discard(name)
        if wait:
            self.kubectl("wait", "--for=condition=Ready", f"node/{self.node_name(name)}", f"--timeout={int(timeout)}s",
                         timeout=timeout + 10)

    def partition_node(self, name: str) -> None:
        """Take the node off kind's Docker network: kubelet, containers and the shared volume keep running,
        the API and the other nodes are out of reach (a partition, not a freeze)."""
        self.runner(["docker", "network", "disconnect", "kind", self.node_name(name)])
        self.cut.add(name)

    def heal_node(self, name: str) -> None:
        """Reconnect the node (Docker may give it another address than its kubelet registered)."""
        self.runner(["docker", "network", "connect", "kind", self.node_name(name)])
        self.cut.discard(name)

    def partitioned_nodes(self) -> list[str]:
        return sorted(self.cut)

    # ------------------------------------------------------------ volumes
    @property
    def hostpath_root(self) -> Path:
        """Host directory whose SHARED_PATHS subdirectories every node mounts."""
        return self.dir / "hostpath"

    def host_path(self, path: str) -> Path:
        """Host location of a pod-visible shared path (must be under one of SHARED_PATHS)."""
        if not any(path == p or path.startswith(p + "/") for p in SHARED_PATHS):
            raise ValueError(f"{path} is not shared across kind nodes; use a path under {SHARED_PATHS}")
        return self.hostpath_root / path.lstrip("/")

    # ------------------------------------------------------------ clients
    def tool_env(self) -> dict[str, str]:
        """kubectl/helm environment for this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """kubectl against this cluster."""
        return self.runner(["kubectl", f"--kubeconfig={self.kubeconfig}", *args], input=input, timeout=timeout,
                           check=check)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """helm against this cluster."""
        return self.runner(["helm", f"--kubeconfig={self.kubeconfig}", *args], timeout=timeout, check=check)

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """kubectl logs (kind has real kubelets)."""
        args = ["logs", "-n", namespace, pod] + (["-c", container] if container else [])
        return self.kubectl(*args, check=False).stdout

    def stop(self, *, remove: bool = False) -> None:
        """Delete the kind cluster (and the netns engine it runs on); keep the directory unless `remove`."""
        self.runner(["kind", "delete", "cluster", "--name", self.name], check=False, timeout=300)
        if self.relay is not None:
            self.relay.close()
        if self.engine is not None:
            self.engine.stop()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)


def _wants_local_engine() -> bool:
    """RTJ_KIND_ENGINE=netns asks for the netns engine, =host for the machine's Docker; unset: the netns
    engine when no Docker engine answers (no socket, no daemon)."""
    mode = os.environ.get("RTJ_KIND_ENGINE", "auto")
    if mode != "auto":
        return mode == "netns"
    if shutil.which("docker") is None:
        return True
    probe = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                           text=True, timeout=30, check=False)
    return probe.returncode != 0


def relay_kubeconfig(inner: Path, outer: Path, netns: Path) -> NetnsRelay:
    """Write `outer`: kind's kubeconfig `inner` with its server moved to a host-side relay into `netns`."""
    import yaml

    config = yaml.safe_load(inner.read_text())
    server = config["clusters"][0]["cluster"]["server"]  # https://127.0.0.1:<port>, published in the netns
    host, port = server.removeprefix("https://").rsplit(":", 1)
    relay = NetnsRelay(netns, (host, int(port)))
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    outer.write_text(yaml.safe_dump(config))
    outer.chmod(0o600)
    return relay
