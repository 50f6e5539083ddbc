"""The Docker engine and tools for kind on a machine with neither Docker nor a registry (this one, CI here).

`LocalEngine` starts Debian's dockerd inside a network namespace of its own (hack/kind/docker.sh: bridges,
iptables and ip_forward live there, never on the host), builds kind, kubeadm and crictl (hack/kind/build.sh)
and the node image from our own binaries (hack/kind/node-image.sh). kind runs inside the netns; kubectl,
helm and the Python client reach the API server through a `relay.NetnsRelay` on the host's loopback.
On a laptop with Docker and a registry none of this is used: KindCluster runs the stock kindest/node.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from e2e import images as project_images
from e2e.kindcluster.egress import EgressProxy

ROOT = Path(__file__).resolve().parents[2]
HACK = ROOT / "hack" / "kind"


def _sh(*argv: str, timeout: float = 3600) -> str:
    """Run a hack script; its last stdout line is its answer (a path, a tag)."""
    out = subprocess.run(["bash", *argv], capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


@dataclass
class LocalEngine:
    """dockerd in netns `netns`, with the tools kind needs on PATH."""

    netns: str = "rtj-docker"
    docker_host: str = ""
    path: str = ""
    build_seconds: dict[str, float] = field(default_factory=dict)  # image name -> its last `docker build`
    lock: IO[str] | None = field(default=None, repr=False)  # held from start to stop: one user per engine

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @classmethod
    def start(cls, netns: str | None = None) -> LocalEngine:
        """Build (or reuse) kind/kubeadm/crictl and the control-plane tools, start the engine.

        One user at a time: `stop` removes every container of the engine, so a second user (the demo beside
        the tests, or `make test`'s prepare step still building when the kind lane starts) waits here for
        the first to stop (a file lock, released with the process if it dies)."""
        netns = netns or os.environ.get("RTJ_DOCKER_NETNS", "rtj-docker")
        lock = _engine_lock(netns)
        try:
            env = {**os.environ, "RTJ_DOCKER_NETNS": netns}
            kind_bin = _sh(str(HACK / "build.sh"))
            k8s_bin = _sh(str(ROOT / "hack" / "k8s" / "build.sh"))
            out = subprocess.run(["bash", str(HACK / "docker.sh"), "start"], capture_output=True, text=True,
                                 env=env, timeout=120, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"hack/kind/docker.sh start failed: {out.stderr[-3000:]}")
            host = next(line.split("=", 1)[1] for line in out.stdout.splitlines() if "DOCKER_HOST=" in line)
        except BaseException:
            lock.close()
            raise
        return cls(netns, host, f"{kind_bin}:{k8s_bin}:{os.environ.get('PATH', '')}", lock=lock)

    def env(self) -> dict[str, str]:
        """The environment docker, kind, kubectl and helm run with."""
        return {**os.environ, "DOCKER_HOST": self.docker_host, "PATH": self.path, "RTJ_DOCKER_NETNS": self.netns}

    def in_netns(self, argv: list[str]) -> list[str]:
        """argv run inside the engine's netns (kind: its checks dial the nodes' and the API's addresses)."""
        return ["nsenter", f"--net={self.netns_path}", *argv]

    def node_image(self) -> str:
        """The locally built kindest/node equivalent (built once per inputs, kept in the engine)."""
        out = subprocess.run(["bash", str(HACK / "node-image.sh")], capture_output=True, text=True, env=self.env(),
                             timeout=3600, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"hack/kind/node-image.sh failed: {out.stderr[-3000:]}")
        return out.stdout.strip().splitlines()[-1]

    def docker(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """A docker command against this engine (the client on the host, through the engine's socket), with
        Docker 20.10's classic builder (BuildKit would pull its `# syntax=` frontend from a registry)."""
        out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False,
                             env={**self.env(), "DOCKER_BUILDKIT": "0"})
        if out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])} failed ({out.returncode}): {out.stderr[-3000:]}")
        return out

    def stand_in_base(self) -> None:
        """The Dockerfiles' FROM images in this engine, as a laptop's Docker would pull them: e2e/images.py's
        stand-in for python:3.11-slim (no registry serves the real one here) with this machine's CA bundle
        baked in, so pip trusts the package proxy as the real image's pip trusts PyPI. Kept while the base
        and the bundle are the same (the label), remade otherwise."""
        base_id = project_images.ensure_base()
        key = hashlib.sha256(base_id.encode() + Path(project_images.HOST_CA).read_bytes()).hexdigest()[:16]
        tags = project_images.base_tags()
        label = '{{ index .Config.Labels "rtj.stand-in" }}'
        try:
            if all(self.docker("image", "inspect", "--format", label, t).stdout.strip() == key for t in tags):
                return
        except RuntimeError:
            pass  # not in the engine yet
        with tempfile.TemporaryDirectory(dir=project_images.CACHE) as tmp:
            archive, context = Path(tmp) / "base.tar", Path(tmp) / "context"
            subprocess.run(["buildah", "push", "--quiet", base_id, f"docker-archive:{archive}:rtj-stand-in:{key}"],
                           check=True, capture_output=True, timeout=600)
            self.docker("load", "-i", str(archive))
            context.mkdir()
            shutil.copy(project_images.HOST_CA, context / "ca-certificates.crt")
            (context / "Dockerfile").write_text(f"FROM rtj-stand-in:{key}\n"
                                                "COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
                                                f"LABEL rtj.stand-in={key}\n")
            self.docker("build", *(f"--tag={t}" for t in tags), str(context))
            self.docker("rmi", f"rtj-stand-in:{key}")

    def build_images(self, names: Sequence[str]) -> dict[str, str]:
        """`docker build` of our Dockerfiles in this engine, as on a laptop (e2e/images.py's build args and
        refs); RUN steps reach PyPI through an `EgressProxy`. Docker's layer cache (in the engine's data root,
        under the cache) makes a rebuild of unchanged inputs take seconds. Returns name -> ref."""
        self.stand_in_base()
        refs: dict[str, str] = {}
        with EgressProxy(self.netns_path) as proxy:
            for name in names:
                spec = project_images.IMAGES[name]
                before = self.image_id(spec.ref)
                started = time.monotonic()
                try:
                    self.docker("build", "--network", "host", f"--build-arg=HTTPS_PROXY={proxy.url}",
                                *(f"--build-arg={k}={v}" for k, v in spec.build_args),
                                "-f", str(ROOT / spec.dockerfile), "-t", spec.ref, str(ROOT), timeout=3600)
                except RuntimeError as exc:
                    raise RuntimeError(f"{exc}\n(the proxy refused: {proxy.refused or 'nothing'})") from exc
                self.build_seconds[name] = round(time.monotonic() - started, 1)
                print(f"[kind] docker build {name}: {self.build_seconds[name]:.0f} s", file=sys.stderr)
                refs[name] = spec.ref
                if before and before != self.image_id(spec.ref):
                    self.docker("rmi", before)  # what the tag named before, and its layers no other image uses
        # Dangling: a multi-stage build's earlier stages. Recent ones are the layer cache of the next build.
        self.docker("image", "prune", "--force", "--filter", "until=168h")
        return refs

    def image_id(self, ref: str) -> str | None:
        """The id of the image `ref` names in this engine, None when there is none."""
        try:
            return self.docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
        except RuntimeError:
            return None

    def stop(self) -> None:
        """Stop the engine (its containers with it) and delete its netns; the next user may start it."""
        try:
            subprocess.run(["bash", str(HACK / "docker.sh"), "stop"], env=self.env(), capture_output=True,
                           timeout=180, check=False)
        finally:
            if self.lock is not None:
                self.lock.close()
                self.lock = None


def _engine_lock(netns: str) -> IO[str]:
    """The engine's lock, taken (waiting, and saying so, while another process holds it)."""
    path = Path(os.environ.get("RTJ_CACHE", Path.home() / ".cache" / "resilient-training")) / "docker"
    path.mkdir(parents=True, exist_ok=True)
    lock = open(path / f".engine-{netns}.lock", "a+")  # noqa: SIM115 (held until stop)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        print(f"[kind] the engine in netns {netns} is in use ({holder}): waiting for it to stop", file=sys.stderr)
        started = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        print(f"[kind] engine free after {time.monotonic() - started:.0f} s", file=sys.stderr)
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
    lock.flush()
    return lock


def prepare(images: Sequence[str] = ("operator", "trainer-cpu")) -> dict[str, float]:
    """Build (or find cached) everything a kind cluster here needs before it is created: kind's tools, the
    node image, our images `docker build`-ed in the engine; then stop the engine. `make test` runs this
    beside the unit tests, so a cold machine's builds are off the kind lane's path. Returns seconds by step."""
    timings: dict[str, float] = {}
    t = time.monotonic()
    engine = LocalEngine.start()
    timings["tools + engine start"] = round(time.monotonic() - t, 1)
    try:
        t = time.monotonic()
        engine.node_image()
        timings["node image"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        engine.build_images(images)
        timings["docker build " + " ".join(images)] = round(time.monotonic() - t, 1)
    finally:
        engine.stop()
    return timings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kindcluster",
                                     description="the netns Docker engine's builds, ahead of a kind cluster")
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args(argv)
    for step, seconds in prepare().items():
        print(f"[kind] prepare: {step}: {seconds:.1f} s")
    return 0
