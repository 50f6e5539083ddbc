"""The pod runtime: drives one pod's processes and namespaces from sandbox to final delete, like a kubelet's pod worker.

Each pod gets its own network namespace (a veth on the cluster bridge, its own IP) and each container a
private mount and UTS namespace (see launcher.py). What to run and with which environment and files
comes from podspec.py; this module does the side effects: directories, namespaces, processes, probes,
and the PodStatus it reports.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2e.controlplane import network

from . import podspec
from .kubeapi import ApiError, now

if TYPE_CHECKING:
    from .node_context import NodeContext

LOG = logging.getLogger("node-agent")
REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(__file__).with_name("launcher.py")
# A sandbox or volume that cannot be set up yet is retried with backoff, as the kubelet retries
# FailedCreatePodSandBox and FailedMount, while the pod stays ContainerCreating.
SETUP_RETRY_FIRST, SETUP_RETRY_MAX = 0.5, 4.0


class ProbeState:
    """Consecutive results of one probe, as the kubelet's prober keeps them."""

    def __init__(self) -> None:
        self.last = 0.0
        self.ok: bool | None = None  # None: no verdict yet
        self.fails = 0
        self.successes = 0


class Container:
    """One container's process and the status a kubelet would report for it."""

    def __init__(self, spec: dict[str, Any], restart_count: int = 0) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_count = restart_count
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.ready = False
        self.next_start = 0.0
        self.backoff = 1.0
        self.started_mono = 0.0
        self.launch_spec: dict[str, Any] = {}
        self.probes: dict[str, ProbeState] = {}

    def status(self) -> dict[str, Any]:
        """containerStatuses[] entry."""
        running = "running" in self.state
        return {"name": self.name, "image": self.spec.get("image", ""),
                "imageID": f"rtj-local://{self.spec.get('image', '')}",
                "containerID": f"rtj-process://{self.proc.pid}" if self.proc else "",
                "ready": self.ready and running, "started": running, "restartCount": self.restart_count,
                "state": self.state, "lastState": self.last_state}


class PodRuntime(threading.Thread):
    """Drives one pod from sandbox setup to final deletion, like the kubelet's pod worker."""

    def __init__(self, agent: NodeContext, pod: dict[str, Any], ip: str, rebooted: bool) -> None:
        meta = pod["metadata"]
        super().__init__(daemon=True, name=f"pod {meta['namespace']}/{meta['name']}")
        self.agent, self.pod, self.ip = agent, pod, ip
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.dir = agent.dir / "pods" / f"{self.ns}_{self.pod_name}_{self.uid[:8]}"
        self.netns = f"{agent.netns_prefix}{self.uid[:8]}"
        self.veth = f"v{agent.cfg['index']}-{self.uid[:8]}"  # in the cluster's namespace, at most 15 characters
        self.removed = threading.Event()  # pod gone from the API (force delete)
        self.wake = threading.Event()
        self.lock = threading.Lock()
        prev = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        self.rebooted = rebooted
        self.containers = [Container(c, prev.get(c["name"], {}).get("restartCount", 0))
                           for c in pod["spec"]["containers"]]
        self.init_containers = [Container(c) for c in pod["spec"].get("initContainers") or []]
        self.start_time = (pod.get("status") or {}).get("startTime") or now()
        self.initialized = not self.init_containers
        self.phase = "Pending"
        self.last_sent: Any = None

    # ------------------------------------------------------------ API view
    def update(self, pod: dict[str, Any]) -> None:
        """New version of the pod from the watch."""
        with self.lock:
            self.pod = pod
        self.wake.set()

    @property
    def deleting(self) -> bool:
        """The API asked for graceful deletion."""
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    def stopped(self, container: str) -> bool:
        """True when no process of `container` runs (where a `kubectl logs -f` ends)."""
        return all(c.proc is None or c.proc.poll() is not None for c in self.containers if c.name == container)

    # ------------------------------------------------------------ sandbox
    def context(self) -> podspec.PodContext:
        """The pod with the node-side facts podspec needs."""
        cfg = self.agent.cfg
        return podspec.PodContext(pod=self.pod, node=self.agent.node, pod_ip=self.ip, host_ip=cfg["address"],
                                  api_host=cfg["api_host"], api_port=cfg["api_port"],
                                  python_bin_dir=cfg["python_bin_dir"], image_entrypoints=cfg["image_entrypoints"])

    def setup(self) -> None:
        """Network namespace, files for volumes, token, hosts; the pod 'sandbox'."""
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.agent.cfg
        network.setup_pod_netns(cfg["cluster_netns"], self.netns, self.veth, cfg["bridge"], self.ip, cfg["gateway"])
        self.write_hosts()
        (self.dir / "resolv.conf").write_text(podspec.resolv_conf(self.ns))
        self.volume_dirs: dict[str, tuple[str, bool]] = {}
        for vol in self.pod["spec"].get("volumes") or []:
            self.volume_dirs[vol["name"]] = self.materialize_volume(vol)

    def hostname(self) -> str:
        """The pod's hostname (spec.hostname or its name)."""
        return self.context().hostname

    def write_hosts(self) -> None:
        """(Re)write the pod's /etc/hosts in place (a bind mount pins the inode)."""
        content = podspec.hosts_file(self.context(), self.agent.dns_records(self.ns))
        path = self.dir / "hosts"
        if path.exists() and path.read_text() == content:
            return
        with open(path, "a+") as f:
            f.seek(0)
            f.truncate()
            f.write(content)

    def fetch(self, refs: set[podspec.ObjectRef]) -> dict[podspec.ObjectRef, dict[str, Any] | None]:
        """The ConfigMaps/Secrets the pod references, as the API has them now (None: not found)."""
        out: dict[podspec.ObjectRef, dict[str, Any] | None] = {}
        for res, name in refs:
            try:
                out[(res, name)] = self.agent.api.request("GET", f"/api/v1/namespaces/{self.ns}/{res}/{name}")
            except ApiError as exc:
                if exc.status != 404:
                    raise
                out[(res, name)] = None
        return out

    def materialize_volume(self, vol: dict[str, Any]) -> tuple[str, bool]:
        """Return (host directory or file, read-only) standing for a pod volume."""
        kind = podspec.volume_kind(vol)
        vdir = self.dir / "volumes" / vol["name"]
        if kind == "emptyDir":
            vdir.mkdir(parents=True, exist_ok=True)
            vdir.chmod(0o777)  # the kubelet creates emptyDir world-writable
            return str(vdir), False
        if kind == "hostPath":
            return str(self.agent.host_path(vol["hostPath"]["path"])), False
        if kind == "persistentVolumeClaim":
            claim = vol["persistentVolumeClaim"]["claimName"]
            pvc = self.agent.api.request("GET", f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}")
            pv_name = pvc["spec"].get("volumeName")
            if not pv_name:
                raise RuntimeError(f"PVC {claim} is not bound")
            pv = self.agent.api.request("GET", f"/api/v1/persistentvolumes/{pv_name}")
            return (str(self.agent.host_path(podspec.pv_host_path(pv))),
                    bool(vol["persistentVolumeClaim"].get("readOnly")))
        tokens = {key: self.token(*key) for key in podspec.token_requests(vol)}
        files = podspec.volume_files(self.context(), vol, self.fetch(podspec.volume_references(vol)), tokens)
        vdir.mkdir(parents=True, exist_ok=True)
        for rel, data in files.items():
            p = vdir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        return str(vdir), True

    def token(self, audience: str | None, expiration: int) -> str:
        """A bound ServiceAccount token from the TokenRequest API, as the kubelet fetches it."""
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {"expirationSeconds": max(int(expiration), 600),
                                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.pod_name,
                                                   "uid": self.uid}}
        if audience:
            spec["audiences"] = [audience]
        tr = self.agent.api.request("POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
                                    {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": spec})
        return str(tr["status"]["token"])

    # ------------------------------------------------------------ containers
    def start_container(self, ctr: Container) -> None:
        """Launch one container process in the pod's namespaces."""
        c = ctr.spec
        ctx = self.context()
        env = podspec.container_env(ctx, c, self.fetch(podspec.container_references(c)))
        argv = podspec.container_argv(c, env, ctx.image_entrypoints)
        mounts = [{"source": str(self.dir / "hosts"), "target": "/etc/hosts"},
                  {"source": str(self.dir / "resolv.conf"), "target": "/etc/resolv.conf"}]
        for vm in c.get("volumeMounts") or []:
            src, ro = self.volume_dirs[vm["name"]]
            if vm.get("subPath"):
                src = os.path.join(src, vm["subPath"])
                os.makedirs(src, exist_ok=True)
            mounts.append({"source": src, "target": vm["mountPath"], "readOnly": ro or vm.get("readOnly", False)})
        term = self.dir / f"{ctr.name}.termination-log"
        term.write_text("")
        term.chmod(0o666)  # as the kubelet creates it: writable by any container user
        mounts.append({"source": str(term), "target": c.get("terminationMessagePath") or "/dev/termination-log"})
        spec = {"mounts": mounts, "hostname": self.hostname(), "env": env, "argv": argv,
                "workingDir": c.get("workingDir"), "defaultDir": str(self.dir / "rootfs" / ctr.name),
                **self.security(c, env)}
        spec_path = self.dir / f"{ctr.name}.spec.json"
        spec_path.write_text(json.dumps(spec))
        ctr.launch_spec = spec
        ctr.probes = {}
        log = (self.dir / f"{ctr.name}.log").open("ab")
        ctr.proc = subprocess.Popen(self.launch_argv(spec_path), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        ctr.started_mono = time.monotonic()
        ctr.state = {"running": {"startedAt": now()}}
        LOG.info("started %s/%s container %s pid %d: %s", self.ns, self.pod_name, ctr.name, ctr.proc.pid, argv)

    def launch_argv(self, spec_path: Path) -> list[str]:
        """The command that enters the pod's network namespace and private mount/UTS namespaces."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation", "private",
                sys.executable, "-S", str(LAUNCHER), str(spec_path)]

    def security(self, c: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        """runAsUser/runAsGroup/supplementalGroups/fsGroup and readOnlyRootFilesystem for the launcher."""
        if not self.agent.cfg.get("honour_security_context", True):
            return {}
        out, env_extra = podspec.security_context(self.pod, c, self.agent.cfg["image_entrypoints"],
                                                  keep=(str(REPO_ROOT), sys.prefix), expose=(sys.base_prefix,))
        env.update(env_extra)
        return out

    def reap(self, ctr: Container) -> bool:
        """Record the container's exit if it exited; returns True when it did."""
        if ctr.proc is None or ctr.proc.poll() is None:
            return False
        code = podspec.exit_code(ctr.proc.returncode)
        c = ctr.spec
        msg = (self.dir / f"{ctr.name}.termination-log").read_text(errors="replace")[:4096]
        if not msg and code != 0 and c.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            msg = (self.dir / f"{ctr.name}.log").read_text(errors="replace")[-2048:]
        reason = "Completed" if code == 0 else ("StartError" if code == 128 else "Error")
        started = ctr.state.get("running", {}).get("startedAt", now())
        term = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now(),
                "containerID": f"rtj-process://{ctr.proc.pid}"}
        if msg:
            term["message"] = msg
        ctr.state = {"terminated": term}
        ctr.ready = False
        LOG.info("%s/%s container %s exited %d", self.ns, self.pod_name, ctr.name, code)
        return True

    def should_restart(self, code: int) -> bool:
        """restartPolicy decision for an exited regular container."""
        return podspec.should_restart(self.pod["spec"].get("restartPolicy", "Always"), code)

    def kill_container(self, ctr: Container) -> None:
        """SIGTERM the container's group, wait the pod's grace period, SIGKILL (the exit is reaped later)."""
        assert ctr.proc is not None
        grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ctr.proc.pid, signal.SIGTERM)
        try:
            ctr.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ctr.proc.pid, signal.SIGKILL)

    def kill_all(self, grace: float) -> None:
        """SIGTERM every container's process group, wait `grace`, then SIGKILL."""
        procs = [c for c in self.containers + self.init_containers if c.proc and c.proc.poll() is None]
        for ctr in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ctr.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(c.proc.poll() is None for c in procs):  # type: ignore[union-attr]
            time.sleep(0.05)
        for ctr in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ctr.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            ctr.proc.wait()  # type: ignore[union-attr]
            self.reap(ctr)

    # ------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """The PodStatus a kubelet would write now."""
        ctrs = self.containers
        all_running = all("running" in c.state for c in ctrs)
        all_ready = all_running and all(c.ready for c in ctrs)
        t = now()

        def cond(kind: str, ok: bool) -> dict[str, Any]:
            return {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None,
                    "lastTransitionTime": t}

        status: dict[str, Any] = {
            "phase": self.phase, "hostIP": self.agent.cfg["address"],
            "hostIPs": [{"ip": self.agent.cfg["address"]}], "podIP": self.ip, "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": [cond("PodReadyToStartContainers", self.phase in ("Pending", "Running")),
                           cond("Initialized", self.initialized),
                           cond("ContainersReady", all_ready and self.phase == "Running"),
                           cond("Ready", all_ready and self.phase == "Running")],
            "containerStatuses": [c.status() for c in ctrs],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        return status

    def send_status(self) -> None:
        """Patch pods/status when it changed (transition times are kept from the last write)."""
        st = self.status()
        cmp = json.dumps({**st, "conditions": [{**c, "lastTransitionTime": None} for c in st["conditions"]]},
                         sort_keys=True)
        if cmp == self.last_sent:
            return
        if self.last_sent is not None:
            old = {c["type"]: c for c in json.loads(self.last_sent_full)["conditions"]}
            for c in st["conditions"]:
                if c["type"] in old and old[c["type"]]["status"] == c["status"]:
                    c["lastTransitionTime"] = old[c["type"]]["lastTransitionTime"]
        try:
            self.agent.api.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}/status",
                                 {"metadata": {"uid": self.uid}, "status": st})
            self.last_sent, self.last_sent_full = cmp, json.dumps(st)
        except ApiError as exc:
            if exc.status == 404:
                self.removed.set()
            else:
                LOG.warning("status %s/%s: %s", self.ns, self.pod_name, exc)
        except OSError as exc:  # the API server is away (restarting): the next call retries, as a kubelet does
            LOG.warning("status %s/%s: %s", self.ns, self.pod_name, exc)

    # ------------------------------------------------------------ probes
    def probe(self, ctr: Container, kind: str) -> bool | None:
        """Run `kind` (readinessProbe/livenessProbe) when due; returns the verdict (None: none yet).

        httpGet and tcpSocket go from the node into the pod's IP; exec runs the command in a fresh
        launcher with the container's view (same namespaces' network, same mounts and user).
        """
        p = ctr.spec.get(kind)
        if not p:
            return True
        st = ctr.probes.setdefault(kind, ProbeState())
        t = time.monotonic()
        if t - ctr.started_mono < p.get("initialDelaySeconds", 0) or (st.last and t - st.last < p.get(
                "periodSeconds", 10)):
            return st.ok
        st.last = t
        if self.probe_once(ctr, p):
            st.successes, st.fails = st.successes + 1, 0
            if st.successes >= p.get("successThreshold", 1):
                st.ok = True
        else:
            st.successes, st.fails = 0, st.fails + 1
            if st.fails >= p.get("failureThreshold", 3):
                st.ok = False
        return st.ok

    def probe_once(self, ctr: Container, p: dict[str, Any]) -> bool:
        """One probe attempt."""
        timeout = p.get("timeoutSeconds", 1)
        if "exec" in p:
            spec = {**ctr.launch_spec, "argv": p["exec"].get("command") or ["true"]}
            spec["mounts"] = [m for m in spec["mounts"] if not m["source"].endswith(".termination-log")]
            spec_path = self.dir / f"{ctr.name}.probe.json"
            spec_path.write_text(json.dumps(spec))
            try:
                return subprocess.run(self.launch_argv(spec_path), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, timeout=timeout + 2, check=False).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        port = podspec.probe_port(p, ctr.spec)
        try:
            if "httpGet" in p:
                conn = http.client.HTTPConnection(self.ip, port, timeout=timeout)
                conn.request("GET", p["httpGet"].get("path", "/"))
                ok = 200 <= conn.getresponse().status < 400
                conn.close()
                return ok
            if "tcpSocket" in p:
                with socket.create_connection((self.ip, port), timeout=timeout):
                    return True
        except OSError:
            return False
        return True  # grpc probes are not supported: count as passing

    # ------------------------------------------------------------ lifecycle
    def run(self) -> None:
        """Pod worker: sandbox, init containers, containers, restarts, termination, final delete."""
        try:
            self._run()
        except Exception:
            LOG.exception("pod worker %s/%s crashed", self.ns, self.pod_name)
        finally:
            self.agent.pod_finished(self.uid)

    def _run(self) -> None:
        if self.rebooted and self.pod["spec"].get("restartPolicy", "Always") == "Never":
            # The node rebooted under a run-once pod: its container is gone, as after a real reboot.
            for ctr in self.containers:
                ctr.state = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                            "message": "The container could not be located when the pod "
                                                       "was terminated", "finishedAt": now()}}
            self.phase = "Failed"
            self.send_status()
        else:
            if self.rebooted:
                for ctr in self.containers:
                    ctr.restart_count += 1
            self.setup_until_ready()
            self.main_loop()
        self.terminate()

    def setup_until_ready(self) -> None:
        """Set the sandbox up, retrying until it works or the pod is deleted. Such failures are mostly
        transient: the node authorizer lets a node read a pod's claim only once it has seen the pod bound
        there (a 403 for a moment after scheduling), or the API server is restarting."""
        delay = SETUP_RETRY_FIRST
        while not (self.deleting or self.removed.is_set()):
            try:
                self.setup()
                return
            except Exception as exc:  # the kubelet's FailedMount / FailedCreatePodSandBox: an event, a retry
                LOG.warning("sandbox %s/%s not ready, retrying in %.1fs: %s", self.ns, self.pod_name, delay,
                            str(exc)[:300])
            deadline = time.monotonic() + delay
            while not (self.deleting or self.removed.is_set()) and (left := deadline - time.monotonic()) > 0:
                self.wake.wait(left)
                self.wake.clear()
            delay = min(delay * 2, SETUP_RETRY_MAX)

    def main_loop(self) -> None:
        """Run containers until the pod is terminal or deleted."""
        while not (self.deleting or self.removed.is_set()) and self.phase not in ("Succeeded", "Failed"):
            if not self.initialized:
                self.step_init()
            else:
                self.step_containers()
            self.send_status()
            self.wake.wait(0.2)
            self.wake.clear()

    def step_init(self) -> None:
        for ctr in self.init_containers:
            if "terminated" in ctr.state and ctr.state["terminated"]["exitCode"] == 0:
                continue
            if ctr.proc is None or "terminated" in ctr.state:
                if ctr.proc is not None and not self.should_restart(ctr.state["terminated"]["exitCode"]):
                    self.phase = "Failed"
                    return
                if time.monotonic() >= ctr.next_start:
                    try:
                        if ctr.proc is not None:
                            ctr.restart_count += 1
                        self.start_container(ctr)
                    except Exception as exc:
                        self.start_failed(ctr, exc)
            else:
                self.reap(ctr)
            return
        self.initialized = True

    def step_containers(self) -> None:
        for ctr in self.containers:
            if ctr.proc is None and "terminated" not in ctr.state:
                if time.monotonic() >= ctr.next_start:
                    try:
                        self.start_container(ctr)
                    except Exception as exc:
                        self.start_failed(ctr, exc)
                continue
            if "running" in ctr.state:
                if self.reap(ctr):
                    code = ctr.state["terminated"]["exitCode"]
                    if self.should_restart(code):
                        ctr.last_state = ctr.state
                        ctr.state = {"waiting": {"reason": "CrashLoopBackOff" if ctr.restart_count else
                                                 "ContainerCreating"}}
                        ctr.restart_count += 1
                        ctr.next_start = time.monotonic() + ctr.backoff
                        ctr.backoff = min(ctr.backoff * 2, 10.0)
                        ctr.proc = None
                else:
                    if self.probe(ctr, "livenessProbe") is False:
                        LOG.info("%s/%s container %s failed liveness probe, will be restarted",
                                 self.ns, self.pod_name, ctr.name)
                        self.kill_container(ctr)
                        continue
                    ctr.ready = bool(self.probe(ctr, "readinessProbe"))
        if any("running" in c.state or "waiting" in c.state for c in self.containers):
            # A pod whose containers once started stays Running through restarts and back-off.
            if any(c.proc for c in self.containers) or any(c.restart_count for c in self.containers):
                self.phase = "Running"
            return
        codes = [c.state["terminated"]["exitCode"] for c in self.containers]
        self.phase = "Succeeded" if all(x == 0 for x in codes) else "Failed"

    def start_failed(self, ctr: Container, exc: Exception) -> None:
        LOG.warning("start %s/%s %s: %s", self.ns, self.pod_name, ctr.name, exc)
        reason = "ErrImagePull" if isinstance(exc, podspec.NoEntrypoint) else "CreateContainerConfigError"
        ctr.state = {"waiting": {"reason": reason, "message": str(exc)[:1000]}}
        ctr.next_start = time.monotonic() + 2

    def terminate(self) -> None:
        """Stop processes (grace period from the deletion), report, finalize the deletion."""
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if self.removed.is_set():
            grace = min(grace, 2)
        self.kill_all(float(grace))
        for ctr in self.containers:
            if "terminated" not in ctr.state:
                ctr.state = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                            "message": "The container could not be located when the pod "
                                                       "was terminated", "finishedAt": now()}}
        if self.phase not in ("Succeeded", "Failed"):
            codes = [c.state["terminated"]["exitCode"] for c in self.containers]
            self.phase = "Succeeded" if all(x == 0 for x in codes) else "Failed"
        with contextlib.suppress(Exception):
            network.teardown_pod_netns(self.agent.cfg["cluster_netns"], self.netns, self.veth)
        if self.removed.is_set():
            return
        self.send_status()
        while self.deleting is False and not self.removed.is_set():
            # Terminal pods stay until someone deletes them (GC, the job's owner, a user).
            self.send_status()  # a no-op once written; retries a status lost to an API outage
            self.wake.wait(1)
            self.wake.clear()
        while not self.removed.is_set():  # the final delete, retried across API outages like a kubelet
            try:
                self.agent.api.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}",
                                       {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                                        "preconditions": {"uid": self.uid}})
                return
            except ApiError as exc:
                if exc.status in (404, 409):
                    return  # gone already, or another uid took the name
                LOG.warning("delete %s/%s: %s; retrying", self.ns, self.pod_name, exc)  # 403 while authz warms up
                self.wake.wait(1)
                self.wake.clear()
            except OSError as exc:
                LOG.warning("delete %s/%s: %s; retrying", self.ns, self.pod_name, exc)
                self.wake.wait(1)
                self.wake.clear()

