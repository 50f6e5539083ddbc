"""A simulated kubelet: registers a Node, heartbeats, and runs the pods bound to it as local processes.

One agent process per node, authenticated as `system:node:<name>` (so the Node authorizer and
NodeRestriction hold it to what a kubelet may do). Each pod gets its own network namespace
(veth on the cluster bridge, its own IP) and each container a private mount and UTS namespace
(see launcher.py). Images do not exist: a container runs its `command`/`args` with the project
venv first on PATH; a container without `command` uses the configured image->entrypoint map.

Run: python -m e2e.localcluster.node_agent <node-dir>/config.json
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from . import network

LOG = logging.getLogger("node-agent")
REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(__file__).with_name("launcher.py")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# A kubelet renews every leaseDurationSeconds/4 = 10 s, half the operator's default 20 s node-loss timeout.
# The tests run with a 4 s timeout, so a node here renews every second: at most half that timeout, as on
# a real cluster, with room for a heartbeat thread delayed by a busy 2-core machine.
LEASE_RENEW_S = 1.0
STATUS_EVERY_S = 5.0


def now() -> str:
    """RFC 3339 timestamp (seconds), as the API stores Time."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro(skew_file: Path | None = None) -> str:
    """RFC 3339 timestamp with microseconds, as the API stores MicroTime. A test skews this node's clock
    by writing seconds (e.g. -60) to `skew_file` (<node dir>/clock_skew_s); it is read on every call."""
    skew = 0.0
    if skew_file is not None and skew_file.exists():
        skew = float(skew_file.read_text() or 0)
    return (datetime.now(UTC) + timedelta(seconds=skew)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class Api:
    """A minimal apiserver client (TLS client cert): raw dicts, no generated models."""

    def __init__(self, host: str, port: int, ca: str, cert: str, key: str) -> None:
        self.host, self.port = host, port
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(cert, key)

    def _conn(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                content_type: str = "application/json", timeout: float = 30) -> Any:
        """One request; returns the decoded JSON answer."""
        if query:
            path += "?" + urllib.parse.urlencode(query)
        conn = self._conn(timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": content_type,
                                                           "Accept": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode()
        except http.client.HTTPException as exc:
            # The server went away mid-answer (a restart): callers treat it like a refused connection.
            raise ConnectionError(f"{method} {path}: {exc!r}") from exc
        finally:
            conn.close()
        if resp.status >= 300:
            raise ApiError(resp.status, text)
        return json.loads(text) if text else None

    def patch(self, path: str, body: Any, strategic: bool = True) -> Any:
        """Strategic-merge (or JSON-merge) patch."""
        ct = "application/strategic-merge-patch+json" if strategic else "application/merge-patch+json"
        return self.request("PATCH", path, body, content_type=ct)

    def watch(self, path: str, query: dict[str, Any], timeout_s: int = 60) -> Iterator[dict[str, Any]]:
        """Stream watch events until the server closes the watch."""
        q = {**query, "watch": "true", "timeoutSeconds": timeout_s, "allowWatchBookmarks": "true"}
        conn = self._conn(timeout_s + 15)
        try:
            conn.request("GET", path + "?" + urllib.parse.urlencode(q), headers={"Accept": "application/json"})
            resp = conn.getresponse()
            if resp.status >= 300:
                raise ApiError(resp.status, resp.read().decode())
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


class Informer(threading.Thread):
    """List+watch one resource into a dict keyed by uid; calls `changed()` on every update."""

    def __init__(self, api: Api, path: str, changed: Any, query: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True, name=f"informer {path}")
        self.api, self.path, self.changed, self.query = api, path, changed, query or {}
        self.items: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy of the current items."""
        with self.lock:
            return list(self.items.values())

    def run(self) -> None:
        """Relist after any error or expired resourceVersion, forever."""
        while True:
            try:
                lst = self.api.request("GET", self.path, query=self.query)
                with self.lock:
                    self.items = {o["metadata"]["uid"]: o for o in lst.get("items") or []}
                rv = lst["metadata"]["resourceVersion"]
                self.synced.set()
                self.changed()
                while True:
                    for ev in self.api.watch(self.path, {**self.query, "resourceVersion": rv}):
                        obj = ev["object"]
                        if ev["type"] == "ERROR":
                            raise ApiError(obj.get("code", 500), json.dumps(obj))
                        rv = obj["metadata"]["resourceVersion"]
                        if ev["type"] == "BOOKMARK":
                            continue
                        with self.lock:
                            if ev["type"] == "DELETED":
                                self.items.pop(obj["metadata"]["uid"], None)
                            else:
                                self.items[obj["metadata"]["uid"]] = obj
                        self.changed()
            except Exception as exc:
                LOG.warning("informer %s: %s; relisting", self.path, exc)
                time.sleep(0.5)


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

    def __init__(self, agent: NodeAgent, pod: dict[str, Any], ip: str, rebooted: bool) -> None:
        meta = pod["metadata"]
        super().__init__(daemon=True, name=f"pod {meta['namespace']}/{meta['name']}")
        self.agent, self.pod, self.ip = agent, pod, ip
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.dir = agent.dir / "pods" / f"{self.ns}_{self.pod_name}_{self.uid[:8]}"
        self.netns = f"{agent.netns_prefix}{self.uid[:8]}"
        self.veth = f"v{agent.cfg['subnet']}{self.uid[:8]}"
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

    # ------------------------------------------------------------ sandbox
    def setup(self) -> None:
        """Network namespace, files for volumes, token, hosts; the pod 'sandbox'."""
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.agent.cfg
        network.setup_pod_netns(self.netns, self.veth, cfg["bridge"], self.ip, cfg["gateway"])
        self.write_hosts()
        spec = self.pod["spec"]
        search = f"{self.ns}.svc.cluster.local svc.cluster.local cluster.local"
        # No DNS server: names resolve from /etc/hosts; other lookups fail fast on the netns' lo.
        (self.dir / "resolv.conf").write_text(
            f"search {search}\nnameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n")
        self.volume_dirs: dict[str, tuple[str, bool]] = {}
        for vol in spec.get("volumes") or []:
            self.volume_dirs[vol["name"]] = self.materialize_volume(vol)

    def hostname(self) -> str:
        """The pod's hostname (spec.hostname or its name)."""
        return (self.pod["spec"].get("hostname") or self.pod_name)[:63]

    def write_hosts(self) -> None:
        """(Re)write the pod's /etc/hosts in place (a bind mount pins the inode)."""
        spec = self.pod["spec"]
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        names = [self.hostname()]
        if spec.get("subdomain"):
            sub = spec["subdomain"]
            names.insert(0, f"{self.hostname()}.{sub}.{self.ns}.svc.cluster.local")
        lines.append(f"{self.ip}\t{' '.join(names)}")
        cfg = self.agent.cfg
        lines.append(f"{cfg['api_host']}\tkubernetes kubernetes.default kubernetes.default.svc "
                     "kubernetes.default.svc.cluster.local")
        lines += self.agent.dns_records(self.ns)
        content = "\n".join(lines) + "\n"
        path = self.dir / "hosts"
        if path.exists() and path.read_text() == content:
            return
        with open(path, "a+") as f:
            f.seek(0)
            f.truncate()
            f.write(content)

    def materialize_volume(self, vol: dict[str, Any]) -> tuple[str, bool]:
        """Return (host directory or file, read-only) standing for a pod volume."""
        name = vol["name"]
        vdir = self.dir / "volumes" / name
        if "emptyDir" in vol:
            vdir.mkdir(parents=True, exist_ok=True)
            vdir.chmod(0o777)  # the kubelet creates emptyDir world-writable
            return str(vdir), False
        if "hostPath" in vol:
            return str(self.agent.host_path(vol["hostPath"]["path"])), False
        if "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            pvc = self.agent.api.request("GET", f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}")
            pv_name = pvc["spec"].get("volumeName")
            if not pv_name:
                raise RuntimeError(f"PVC {claim} is not bound")
            pv = self.agent.api.request("GET", f"/api/v1/persistentvolumes/{pv_name}")
            path = (pv["spec"].get("hostPath") or pv["spec"].get("local") or {}).get("path")
            if not path:
                raise RuntimeError(f"PV {pv_name} has no hostPath/local path")
            return str(self.agent.host_path(path)), bool(vol["persistentVolumeClaim"].get("readOnly"))
        vdir.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes | str] = {}
        if "configMap" in vol or "secret" in vol:
            files = self.source_files(vol)
        elif "downwardAPI" in vol:
            for item in vol["downwardAPI"].get("items") or []:
                files[item["path"]] = self.field_value(item.get("fieldRef", {}).get("fieldPath", ""))
        elif "projected" in vol:
            for src in vol["projected"].get("sources") or []:
                if "serviceAccountToken" in src:
                    sat = src["serviceAccountToken"]
                    files[sat["path"]] = self.token(sat.get("audience"), sat.get("expirationSeconds", 3607))
                elif "downwardAPI" in src:
                    for item in src["downwardAPI"].get("items") or []:
                        files[item["path"]] = self.field_value(item.get("fieldRef", {}).get("fieldPath", ""))
                else:
                    files.update(self.source_files(src))
        else:
            raise RuntimeError(f"volume {name}: unsupported source {sorted(vol)}")
        for rel, data in files.items():
            p = vdir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(vdir), True

    def source_files(self, src: dict[str, Any]) -> dict[str, bytes | str]:
        """Files of a configMap/secret volume source (honouring items and optional)."""
        import base64

        kind = "configMap" if "configMap" in src else "secret"
        ref = src[kind]
        name = ref.get("name") or ref.get("secretName")
        res = "configmaps" if kind == "configMap" else "secrets"
        try:
            obj = self.agent.api.request("GET", f"/api/v1/namespaces/{self.ns}/{res}/{name}")
        except ApiError as exc:
            if exc.status == 404 and ref.get("optional"):
                return {}
            raise
        data: dict[str, bytes | str] = dict(obj.get("data") or {})
        if kind == "secret":
            data = {k: base64.b64decode(v) for k, v in data.items()}
        if ref.get("items"):
            return {i["path"]: data[i["key"]] for i in ref["items"] if i["key"] in data}
        return data

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
        return tr["status"]["token"]

    def field_value(self, path: str) -> str:
        """Downward API fieldRef values."""
        meta, spec = self.pod["metadata"], self.pod["spec"]
        simple = {
            "metadata.name": self.pod_name, "metadata.namespace": self.ns, "metadata.uid": self.uid,
            "spec.nodeName": self.agent.node, "spec.serviceAccountName": spec.get("serviceAccountName", ""),
            "status.podIP": self.ip, "status.podIPs": self.ip, "status.hostIP": self.agent.cfg["address"],
            "status.hostIPs": self.agent.cfg["address"],
        }
        if path in simple:
            return simple[path]
        for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
            if path == prefix:
                return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get(key) or {}).items()))
            if path.startswith(prefix + "['"):
                return (meta.get(key) or {}).get(path[len(prefix) + 2:-2], "")
        raise RuntimeError(f"unsupported fieldRef {path}")

    # ------------------------------------------------------------ containers
    def env_for(self, c: dict[str, Any]) -> dict[str, str]:
        """The container's environment as the kubelet builds it."""
        import base64

        cfg = self.agent.cfg
        env = {
            "PATH": f"{cfg['python_bin_dir']}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "HOSTNAME": self.hostname(),
            "KUBERNETES_SERVICE_HOST": cfg["api_host"], "KUBERNETES_SERVICE_PORT": str(cfg["api_port"]),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(cfg["api_port"]),
            "KUBERNETES_PORT": f"tcp://{cfg['api_host']}:{cfg['api_port']}",
        }
        for src in c.get("envFrom") or []:
            prefix = src.get("prefix", "")
            for key, data in self.source_files(
                    {"configMap": src["configMapRef"]} if "configMapRef" in src
                    else {"secret": {"secretName": src["secretRef"]["name"],
                                     "optional": src["secretRef"].get("optional")}}).items():
                env[prefix + key] = data.decode() if isinstance(data, bytes) else data
        for e in c.get("env") or []:
            if "value" in e or "valueFrom" not in e:
                env[e["name"]] = self.expand(e.get("value", ""), env)
                continue
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                env[e["name"]] = self.field_value(vf["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in vf:
                res = vf["resourceFieldRef"]["resource"]
                kind, _, rname = res.partition(".")
                env[e["name"]] = str((c.get("resources") or {}).get(kind, {}).get(rname, "0"))
            else:
                kind = "configMapKeyRef" if "configMapKeyRef" in vf else "secretKeyRef"
                ref = vf[kind]
                res = "configmaps" if kind == "configMapKeyRef" else "secrets"
                try:
                    obj = self.agent.api.request("GET", f"/api/v1/namespaces/{self.ns}/{res}/{ref['name']}")
                    val = (obj.get("data") or {})[ref["key"]]
                    env[e["name"]] = base64.b64decode(val).decode() if res == "secrets" else val
                except (ApiError, KeyError):
                    if not ref.get("optional"):
                        raise
        return env

    @staticmethod
    def expand(value: str, env: dict[str, str]) -> str:
        """Kubernetes $(VAR) expansion ($$ escapes)."""
        out, i = [], 0
        while i < len(value):
            if value.startswith("$$", i):
                out.append("$")
                i += 2
            elif value.startswith("$(", i) and ")" in value[i:]:
                j = value.index(")", i)
                name = value[i + 2:j]
                out.append(env.get(name, value[i:j + 1]))
                i = j + 1
            else:
                out.append(value[i])
                i += 1
        return "".join(out)

    def image(self, c: dict[str, Any]) -> dict[str, Any] | None:
        """What the container's image would supply (longest matching name substring), or None."""
        image = c.get("image", "")
        table = self.agent.cfg["image_entrypoints"]
        matches = [k for k in table if k in image]
        if not matches:
            return None
        value = table[max(matches, key=len)]
        return {"command": value} if isinstance(value, list) else value

    def argv_for(self, c: dict[str, Any], env: dict[str, str]) -> list[str]:
        """Kubernetes' rule: `command` replaces ENTRYPOINT (and drops CMD); `args` replaces CMD."""
        command, args = c.get("command"), c.get("args")
        if command:
            argv = [*command, *(args or [])]
        else:
            img = self.image(c)
            if not img or not img.get("command"):
                raise RuntimeError(f"image {c.get('image')!r} has no local entrypoint mapping and no command")
            argv = [*img["command"], *(args if args is not None else img.get("args") or [])]
        return [self.expand(a, env) for a in argv]

    def start_container(self, ctr: Container) -> None:
        """Launch one container process in the pod's namespaces."""
        c = ctr.spec
        env = self.env_for(c)
        argv = self.argv_for(c, env)
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
        psc = self.pod["spec"].get("securityContext") or {}
        csc = c.get("securityContext") or {}
        out: dict[str, Any] = {"readOnlyRootFilesystem": bool(csc.get("readOnlyRootFilesystem")),
                               # the project and its venv stand in for the image's filesystem: a pod volume
                               # mounted over an ancestor (an emptyDir on /tmp) must not hide them
                               "keep": sorted({str(REPO_ROOT), sys.prefix})}
        img = self.image(c) or {}
        # Unset means the image's USER (from the image map; root for unmapped images).
        uid = csc.get("runAsUser", psc.get("runAsUser", img.get("user", 0)))
        if uid:
            groups = [*(psc.get("supplementalGroups") or []), *([psc["fsGroup"]] if "fsGroup" in psc else [])]
            gid = csc.get("runAsGroup", psc.get("runAsGroup", img.get("group", 0)))
            out["user"] = {"uid": int(uid), "gid": int(gid), "groups": sorted({int(g) for g in groups})}
            out["expose"] = [sys.base_prefix]
            if "HOME" not in {e["name"] for e in c.get("env") or []}:
                env["HOME"] = "/"  # what runtimes set for a uid without a passwd entry
        return out

    def reap(self, ctr: Container) -> bool:
        """Record the container's exit if it exited; returns True when it did."""
        if ctr.proc is None or ctr.proc.poll() is None:
            return False
        code = ctr.proc.returncode
        if code < 0:
            code = 128 - code  # killed by signal N -> 128+N, as runtimes report it
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
        policy = self.pod["spec"].get("restartPolicy", "Always")
        return policy == "Always" or (policy == "OnFailure" and code != 0)

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
        port = (p.get("httpGet") or p.get("tcpSocket") or {}).get("port")
        if isinstance(port, str):
            port = next((cp["containerPort"] for cp in ctr.spec.get("ports") or [] if cp.get("name") == port), 0)
        try:
            if "httpGet" in p:
                conn = http.client.HTTPConnection(self.ip, int(port), timeout=timeout)
                conn.request("GET", p["httpGet"].get("path", "/"))
                ok = 200 <= conn.getresponse().status < 400
                conn.close()
                return ok
            if "tcpSocket" in p:
                import socket

                with socket.create_connection((self.ip, int(port)), timeout=timeout):
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
            self.agent.pod_finished(self)

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
            try:
                self.setup()
            except Exception as exc:
                LOG.exception("sandbox %s/%s", self.ns, self.pod_name)
                for ctr in self.containers:
                    ctr.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)[:1000]}}
                self.send_status()
                while not (self.deleting or self.removed.is_set()):
                    self.wake.wait(1)
                    self.wake.clear()
            self.main_loop()
        self.terminate()

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
        reason = "ErrImagePull" if "entrypoint mapping" in str(exc) else "CreateContainerConfigError"
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
            network.teardown_pod_netns(self.netns, self.veth)
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


class KubeletServer(threading.Thread):
    """The slice of the kubelet API the apiserver proxies to: container logs (`kubectl logs [-f]`).

    HTTPS on the node's InternalIP:10250 with a CA-signed serving cert; only CA-signed clients
    (the apiserver's kubelet-client cert) are accepted, as a kubelet with x509 authn would.
    """

    def __init__(self, agent: NodeAgent) -> None:
        super().__init__(daemon=True, name="kubelet-api")
        import http.server

        cfg = agent.cfg
        handler = self._handler(agent)
        self.httpd = http.server.ThreadingHTTPServer((cfg["address"], 10250), handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=cfg["ca_crt"])
        ctx.load_cert_chain(cfg["serving_cert"], cfg["serving_key"])
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)

    @staticmethod
    def _handler(agent: NodeAgent) -> Any:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                LOG.debug("kubelet api: " + fmt, *args)

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(url.query)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404, "only /containerLogs/{namespace}/{pod}/{container} is served")
                    return
                _, ns, pod, container = parts
                rt = agent.runtime_for(ns, pod)
                path = rt.dir / f"{container}.log" if rt else None
                if path is None or not path.exists():
                    self.send_error(404, f"no logs for {ns}/{pod}/{container} on this node")
                    return
                data = path.read_bytes()
                if "tailLines" in q:
                    n = int(q["tailLines"][0])
                    data = b"".join(data.splitlines(keepends=True)[-n:]) if n else b""
                if "limitBytes" in q:
                    data = data[: int(q["limitBytes"][0])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(data)
                if q.get("follow", ["false"])[0] != "true":
                    return
                pos = path.stat().st_size
                with path.open("rb") as f:
                    f.seek(pos)
                    while agent.runtime_for(ns, pod) is rt and not rt.removed.is_set():
                        chunk = f.read(65536)
                        if chunk:
                            self.wfile.write(chunk)
                            self.wfile.flush()
                        elif all(c.proc is None or c.proc.poll() is not None for c in rt.containers
                                 if c.name == container):
                            return
                        else:
                            time.sleep(0.2)

        return Handler

    def run(self) -> None:
        """Serve until the process ends."""
        self.httpd.serve_forever()


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
        self.netns_prefix = f"{cfg['netns_prefix']}{cfg['index']}-"
        self.lock = threading.RLock()
        self.wake = threading.Event()
        self.hosts_dirty = True
        # Like a kubelet, the agent sees only the pods bound to its node...
        self.pods = Informer(self.api, "/api/v1/pods", self.changed,
                             {"fieldSelector": f"spec.nodeName={self.node}"})
        # ...while DNS data comes from a cluster-wide reader with CoreDNS-like rights (its own identity).
        dkc = json.loads(Path(cfg["dns_kubeconfig"]).read_text())["users"][0]["user"]
        self.dns_api = Api(cfg["api_host"], cfg["api_port"], cfg["ca_crt"], dkc["client-certificate"],
                           dkc["client-key"])
        self.all_pods = Informer(self.dns_api, "/api/v1/pods", self.changed)
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
        skew = Path(self.cfg["dir"]) / "clock_skew_s"
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
        """/etc/hosts lines for headless-Service pod names (`<hostname>.<subdomain>...`), as CoreDNS serves them."""
        headless = {}
        for svc in self.services.snapshot():
            spec = svc.get("spec") or {}
            if spec.get("clusterIP") == "None":
                headless[(svc["metadata"]["namespace"], svc["metadata"]["name"])] = spec
        lines = []
        for pod in self.all_pods.snapshot():
            meta, spec, st = pod["metadata"], pod["spec"], pod.get("status") or {}
            sub = spec.get("subdomain")
            if not sub or not st.get("podIP") or (meta["namespace"], sub) not in headless:
                continue
            svc = headless[(meta["namespace"], sub)]
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
            if meta.get("deletionTimestamp") or not (ready or svc.get("publishNotReadyAddresses")):
                continue
            host = spec.get("hostname") or meta["name"]
            pns = meta["namespace"]
            names = [f"{host}.{sub}.{pns}.svc.cluster.local", f"{host}.{sub}.{pns}.svc", f"{host}.{sub}.{pns}"]
            if pns == ns:
                names.append(f"{host}.{sub}")
            lines.append(f"{st['podIP']}\t{' '.join(names)}")
        return lines

    # ------------------------------------------------------------ pods
    def allocate_ip(self, pod: dict[str, Any]) -> str:
        """Reuse the pod's reported IP (after a reboot) or take a free one from this node's /24."""
        mine = network.node_ip_range(self.cfg["subnet"], self.cfg["index"])
        prev = (pod.get("status") or {}).get("podIP")
        if prev in mine:
            return prev
        used = {r.ip for r in self.runtimes.values()}
        used |= {(p.get("status") or {}).get("podIP") for p in self.pods.snapshot()
                 if p["spec"].get("nodeName") == self.node and (p.get("status") or {}).get("phase")
                 not in ("Succeeded", "Failed")}
        for candidate in mine:
            if candidate not in used:
                return candidate
        raise RuntimeError("node out of pod IPs")

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
            if self.hosts_dirty:
                self.hosts_dirty = False
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

    def pod_finished(self, rt: PodRuntime) -> None:
        """A pod worker ended: forget it (a new pod with the same name has a new uid)."""
        with self.lock:
            self.runtimes.pop(rt.uid, None)
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
