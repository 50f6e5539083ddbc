"""The project's images, built from our Dockerfiles without Docker, and served to real nodes.

No registry serves the official python base images here, so `hack/images/base.sh` makes a stand-in (Debian
bookworm + Debian's python3) tagged with the names the Dockerfiles' FROM lines use; `buildah bud` then builds
`operator/Dockerfile` and `trainer_image/Dockerfile` unchanged, with the torch index pointed at PyPI. Each
image is cached under `~/.cache/resilient-training/images/` by a hash of its inputs (Dockerfile, the files it
COPYs, base, build args) as an OCI archive, and rebuilt only when one changes.

    refs = ensure_images(["operator", "trainer-cpu"])     # {name: ImageRef(ref, archive, digest)}
    with Registry.start("10.100.0.1", 5000, netns_runner=["ip", "netns", "exec", "rtj-x"]) as reg:
        reg.push(refs["operator"])                          # then nodes pull refs["operator"].ref
        write_hosts_toml(certs_d, reg.address)              # containerd config_path: ghcr.io -> plain http

`ref` is the name pods request (the chart's default operator image, examples/job.yaml's trainer image).
Real nodes pull through containerd's `config_path` hosts.toml for `ghcr.io` mapped to the registry.
`python -m e2e.images build [NAME...]` builds from the command line; `run_container` runs a command in an
image with runc (read-only root, a user, no network but loopback) for checks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from e2e.processes import terminate

ROOT = Path(__file__).resolve().parents[1]
HACK = ROOT / "hack" / "images"
CACHE = Path(os.environ.get("RTJ_CACHE", Path.home() / ".cache" / "resilient-training")) / "images"
RUNTIME = "/usr/sbin/runc"  # crun refuses this machine's hybrid cgroups; runc works
KEEP_BUILDS = int(os.environ.get("RTJ_IMAGE_KEEP", "2"))  # builds kept per image (worktrees share the cache)
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"  # the package proxy's certificates; bind-mounted into builds
REGISTRY_HOST = "ghcr.io"  # where the chart and the example job pull from
PYPI = "https://pypi.org/simple"  # download.pytorch.org is not reachable here; PyPI's torch is the CUDA build


# What the CPU test image drops from PyPI's CUDA torch (globs under site-packages). libtorch_cuda.so, which
# `import torch` loads, links cudart, cublas(Lt), cufft, cufile, cupti, cusparse(Lt), nccl, nvrtc, nvshmem_host
# and cudnn's loader: those stay. Gone: triton (imported only by torch.compile), cudnn's engines and cusolver
# (dlopened on first use), static libraries, device bitcode, headers, nvshmem's transports. The build checks
# that torch still imports; the test runs gloo on it. Package metadata (*.dist-info) stays: the Dockerfile's
# next layer installs our package, and pip would reinstall a dependency of torch's whose metadata is gone.
CPU_PRUNE = (
    "triton", "nvidia/*/include", "nvidia/*/lib/*.a", "nvidia/*/lib/*.bc",
    "nvidia/cudnn/lib/libcudnn_*", "nvidia/cu13/lib/libcusolver*", "nvidia/cu13/lib/libnvJitLink*",
    "nvidia/cu13/lib/libnvperf*", "nvidia/cu13/lib/libnvblas*", "nvidia/cu13/lib/libcufftw*",
    "nvidia/cu13/lib/libcheckpoint.so", "nvidia/cu13/lib/libpcsamplingutil.so", "nvidia/cu13/lib/libnvrtc-builtins*",
    "nvidia/cu13/lib/libcufile_rdma*", "nvidia/nvshmem/lib/nvshmem_*",
)


def _app_version() -> str:
    chart = (ROOT / "charts" / "resilient-training-operator" / "Chart.yaml").read_text()
    match = re.search(r'^appVersion:\s*"?([^"\s]+)', chart, re.M)
    assert match, "Chart.yaml has no appVersion"
    return match.group(1)


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """How to build one image: its Dockerfile, the name pods request, build args, the bases it needs."""

    dockerfile: str
    ref: str
    build_args: tuple[tuple[str, str], ...] = ()


def _specs() -> dict[str, ImageSpec]:
    version = _app_version()
    operator = f"{REGISTRY_HOST}/resilient-training/resilient-training-operator:{version}"
    trainer = f"{REGISTRY_HOST}/resilient-training/resilient-training-trainer:{version}"
    return {
        "operator": ImageSpec("operator/Dockerfile", operator),
        # The production trainer (PyPI's CUDA torch, 5.9 GB); only built to measure it.
        "trainer": ImageSpec("trainer_image/Dockerfile", trainer + "-cuda", (("TORCH_INDEX_URL", PYPI),)),
        # The CPU test variant, under the name examples/job.yaml requests: the same install, less what torch
        # never loads on CPU (PRUNE_AFTER_INSTALL).
        "trainer-cpu": ImageSpec("trainer_image/Dockerfile", trainer,
                                 (("TORCH_INDEX_URL", PYPI), ("PRUNE_AFTER_INSTALL", " ".join(CPU_PRUNE)))),
    }


IMAGES = _specs()


@dataclasses.dataclass(frozen=True)
class ImageRef:
    """A built image: `ref` the name pods request, `archive` its OCI archive, `digest` its manifest digest,
    `image_id` its config digest (buildah's image id: the exact image, whatever another worktree tagged `ref`)."""

    name: str
    ref: str
    archive: Path
    digest: str
    image_id: str


def _run(cmd: Sequence[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


def _buildah(*args: str, timeout: float = 120) -> str:
    out: str = _run(["buildah", *args], timeout, capture_output=True).stdout
    return out.strip()


def _has_image(ref: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True,
                          timeout=60, check=False).returncode == 0


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One builder per image at a time (several worktrees share the cache); the loser reuses the build."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ---- the stand-in base -----------------------------------------------------------------------------------
def base_tags() -> list[str]:
    """Every FROM name (and PYTHON_IMAGE default) our Dockerfiles use, fully qualified as buildah resolves them."""
    names: set[str] = set()
    for spec in IMAGES.values():
        text = (ROOT / spec.dockerfile).read_text()
        names.update(re.findall(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M))
        names.update(n for n in re.findall(r"^FROM\s+(\S+)", text, re.M) if "$" not in n)
    return sorted(n if "/" in n else f"docker.io/library/{n}" for n in names)


def ensure_base() -> str:
    """The stand-in base's image id, made by hack/images/base.sh when its script changed or the image is gone."""
    key = hashlib.sha256((HACK / "base.sh").read_bytes()).hexdigest()[:16]
    stamp = CACHE / f"base-{key}.id"
    tags = base_tags()
    with _locked("base"):
        if stamp.exists() and all(_has_image(t) for t in tags):
            image_id = stamp.read_text().strip()
            if _buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", tags[0]) == image_id:
                return image_id
        started = time.monotonic()
        image_id = _run(["bash", str(HACK / "base.sh"), *tags], 1200, capture_output=True).stdout.split()[-1]
        print(f"[images] base built in {time.monotonic() - started:.0f} s: {image_id[:12]}", file=sys.stderr)
        stamp.write_text(image_id + "\n")
        return image_id


# ---- the builds --------------------------------------------------------------------------------------------
_IGNORED = re.compile(r"(^|/)(__pycache__|[^/]*\.pyc|[^/]*\.egg-info|\.pytest_cache|\.ruff_cache|build|dist)(/|$)")


def copied_files(dockerfile: Path) -> list[Path]:
    """The context files a Dockerfile's COPY lines take (not `COPY --from`), with .dockerignore's patterns."""
    files: set[Path] = set()
    for line in re.findall(r"^COPY\s+(.*)$", dockerfile.read_text(), re.M):
        words = shlex.split(line)
        if any(w.startswith("--from") for w in words):
            continue
        for source in (w for w in words[:-1] if not w.startswith("--")):
            path = ROOT / source
            found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            files.update(p for p in found if not _IGNORED.search(str(p.relative_to(ROOT))))
    return sorted(files)


def input_hash(name: str, base_id: str) -> str:
    """What a build depends on: Dockerfile, copied files (path and bytes), base image, build args, ref."""
    spec = IMAGES[name]
    digest = hashlib.sha256()
    dockerfile = ROOT / spec.dockerfile
    for part in (spec.ref, base_id, json.dumps(spec.build_args), dockerfile.read_text()):
        digest.update(part.encode() + b"\0")
    for path in copied_files(dockerfile):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def archive_digests(archive: Path) -> tuple[str, str]:
    """An OCI archive's manifest digest (index.json) and config digest (its manifest's config)."""
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        assert index is not None
        digest = str(json.load(index)["manifests"][0]["digest"])
        manifest = tar.extractfile("blobs/" + digest.replace(":", "/"))
        assert manifest is not None
        return digest, str(json.load(manifest)["config"]["digest"])


def ensure_image(name: str) -> ImageRef:
    """Build one image (or take it from the cache); its OCI archive is the output, the local tag a bonus."""
    spec = IMAGES[name]
    base_id = ensure_base()
    out = CACHE / f"{name}-{input_hash(name, base_id)}"
    archive = out / "image.oci.tar"
    with _locked(name):
        if not archive.exists():
            build_args = [f"--build-arg={k}={v}" for k, v in spec.build_args]
            started = time.monotonic()
            # --network host: RUN steps get the host's network as is; no CNI bridge touches the host's sysctls.
            _run(["buildah", "bud", "--pull=never", "--runtime", RUNTIME, "--network", "host", "--layers",
                  "-v", f"{HOST_CA}:/etc/ssl/certs/ca-certificates.crt:ro", *build_args,
                  "-f", str(ROOT / spec.dockerfile), "-t", spec.ref, str(ROOT)], 3600,
                 stdout=subprocess.DEVNULL if not os.environ.get("RTJ_IMAGES_VERBOSE") else None)
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            _buildah("push", "--quiet", spec.ref, f"oci-archive:{tmp / 'image.oci.tar'}:{spec.ref}", timeout=1200)
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            _prune(name, keep=KEEP_BUILDS)
            # The image this tag named before is dangling now; so are older bases.
            subprocess.run(["buildah", "rmi", "--prune"], capture_output=True, timeout=600, check=False)
            print(f"[images] {name} built in {time.monotonic() - started:.0f} s", file=sys.stderr)
        digest, config = archive_digests(archive)
        image_id = config.removeprefix("sha256:")
        if not _has_image(image_id):  # the archive outlived buildah's store: load it back under its ref
            _buildah("pull", "--quiet", f"oci-archive:{archive}", timeout=1200)
            _buildah("tag", image_id, spec.ref)
        os.utime(out)  # recently used: kept by _prune
        return ImageRef(name, spec.ref, archive, digest, image_id)


def _prune(name: str, keep: int) -> None:
    """Keep the `keep` most recently used builds of an image. Several worktrees (other inputs) share the cache,
    so the newest build alone would have them rebuild in turn."""
    builds = [p for p in CACHE.iterdir() if re.fullmatch(re.escape(name) + r"-[0-9a-f]{16}", p.name)]
    for stale in sorted(builds, key=lambda p: p.stat().st_mtime, reverse=True)[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


def ensure_images(names: Sequence[str]) -> dict[str, ImageRef]:
    """Build (or reuse) each named image: "operator", "trainer-cpu" (tests) or "trainer" (production)."""
    unknown = set(names) - set(IMAGES)
    if unknown:
        raise KeyError(f"unknown images {sorted(unknown)}; known: {sorted(IMAGES)}")
    return {name: ensure_image(name) for name in names}


def image_config(ref: str) -> dict[str, Any]:
    """The OCI image config (User, Env, Entrypoint, Cmd, WorkingDir, ...) of a local image."""
    config: dict[str, Any] = json.loads(_buildah("inspect", "--type", "image", ref)).get("OCIv1", {}).get("config", {})
    return config


# ---- running a command in an image -------------------------------------------------------------------------
def run_container(image: ImageRef | str, args: Sequence[str], *, user: str | None = None,
                  env: dict[str, str] | None = None, stdin: str = "", read_only: bool = True,
                  timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `args` in `image` (an ImageRef: that exact build; or a local name) with runc: read-only root (a tmpfs
    at /tmp), new namespaces (loopback only).

    `user` defaults to the image's USER. Returns the completed process (stdout and stderr captured); a
    container that outlives `timeout` is killed.
    """
    ref = image.image_id if isinstance(image, ImageRef) else image
    config = image_config(ref)
    container = _buildah("from", "--pull=never", "--quiet", ref)
    name = f"rtj-check-{container[-12:]}"
    try:
        rootfs = _buildah("mount", container)
        with tempfile.TemporaryDirectory(prefix="rtj-bundle-") as bundle:
            _run([RUNTIME, "spec", "--bundle", bundle], 30)
            spec = json.loads(Path(bundle, "config.json").read_text())
            uid, _, gid = (user or config.get("User") or "0:0").partition(":")
            process = spec["process"]
            process.update(terminal=False, args=list(args), cwd=config.get("WorkingDir") or "/",
                           env=[*config.get("Env", []), *(f"{k}={v}" for k, v in (env or {}).items())],
                           user={"uid": int(uid), "gid": int(gid or uid)})
            spec["root"] = {"path": rootfs, "readonly": read_only}
            spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                                   "options": ["nosuid", "nodev", "mode=1777", "size=1g"]})
            spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/dev/shm"] + [
                {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                 "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=1g"]}]
            spec["linux"].pop("resources", None)  # the default spec denies all devices; runc adds the basic ones
            Path(bundle, "config.json").write_text(json.dumps(spec))
            try:
                return subprocess.run([RUNTIME, "run", "--bundle", bundle, name], capture_output=True, text=True,
                                      timeout=timeout, check=False, input=stdin)
            finally:
                subprocess.run([RUNTIME, "delete", "--force", name], capture_output=True, timeout=30, check=False)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, timeout=60, check=False)


# ---- serving the images to nodes ---------------------------------------------------------------------------
def registry_binary() -> str:
    """The Distribution registry binary, built from the Go module proxy by hack/images/registry.sh."""
    return _run(["bash", str(HACK / "registry.sh")], 1800, capture_output=True).stdout.split()[-1]


def write_hosts_toml(certs_dir: Path, address: str, host: str = REGISTRY_HOST) -> Path:
    """containerd's `config_path` entry sending pulls of `host/...` to the plain-http registry at `address`."""
    path = certs_dir / host / "hosts.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'server = "http://{address}"\n\n[host."http://{address}"]\n'
                    '  capabilities = ["pull", "resolve"]\n')
    return path


class Registry:
    """A Distribution registry on `bind_host:port`, optionally inside a network namespace.

    `netns_runner` is a command prefix that enters the namespace (e.g. `["ip", "netns", "exec", "rtj-x"]`);
    the registry and every push run under it, so the address only needs to exist there. Blobs live in
    `storage` (default: the cache, so a warm push uploads nothing). Serves `REGISTRY_HOST`'s repositories:
    `ghcr.io/a/b:t` is pushed as `<address>/a/b:t`, which containerd reaches through `write_hosts_toml`.
    """

    def __init__(self, address: str, process: subprocess.Popen[bytes], prefix: list[str], workdir: Path):
        self.address, self.process, self.prefix, self.workdir = address, process, prefix, workdir

    @classmethod
    def start(cls, bind_host: str, port: int, netns_runner: Sequence[str] | None = None,
              storage: Path | None = None, timeout: float = 30) -> Registry:
        prefix = list(netns_runner or [])
        storage = storage or CACHE / "registry"
        storage.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="rtj-registry-"))
        address = f"{bind_host}:{port}"
        (workdir / "config.yml").write_text(json.dumps({
            "version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
            "http": {"addr": address}}))
        log = open(workdir / "registry.log", "wb")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen([*prefix, registry_binary(), "serve", str(workdir / "config.yml")],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        registry = cls(address, process, prefix, workdir)
        deadline = time.monotonic() + timeout
        while True:
            probe = subprocess.run([*prefix, "curl", "-sf", "-o", "/dev/null", f"http://{address}/v2/"],
                                   capture_output=True, timeout=10, check=False)
            if probe.returncode == 0:
                return registry
            if process.poll() is not None or time.monotonic() > deadline:
                registry.stop()
                raise RuntimeError(f"registry at {address} did not come up: {registry.log()[-2000:]}")
            time.sleep(0.2)

    def log(self) -> str:
        return (self.workdir / "registry.log").read_text(errors="replace")

    def repository(self, ref: str) -> str:
        """Where `ref` (ghcr.io/a/b:t) lives on this registry: `<address>/a/b:t`."""
        host, _, rest = ref.partition("/")
        assert host == REGISTRY_HOST, f"{ref}: only {REGISTRY_HOST} images are served"
        return f"{self.address}/{rest}"

    def push(self, image: ImageRef, timeout: float = 600) -> None:
        """Upload an image's OCI archive as is (blobs the registry has are skipped) under the name pods request.

        Runs `push_archive` under the namespace prefix: the archive's compressed blobs go up unchanged, so the
        registry serves the archive's digest and nothing is recompressed.
        """
        _run([*self.prefix, sys.executable, "-m", "e2e.images", "push-archive", str(image.archive),
              f"http://{self.repository(image.ref)}"], timeout, capture_output=True, cwd=ROOT)

    def stop(self) -> None:
        terminate(self.process)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ScratchContainerd:
    """A throwaway containerd (own root, state and socket) standing in for one node's: checks and measurements.

    `pull(ref, certs_dir)` goes through hosts.toml as a node's CRI does; `load(archive)` imports an OCI archive.
    """

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.socket = str(workdir / "containerd.sock")
        (workdir / "config.toml").write_text(
            f'version = 2\nroot = "{workdir}/root"\nstate = "{workdir}/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.socket}"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{workdir}/opt"\n')
        self.log = open(workdir / "containerd.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(["containerd", "--config", str(workdir / "config.toml")],
                                        stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"containerd did not start: {(workdir / 'containerd.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", self.socket, "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, check=check)

    def pull(self, ref: str, certs_dir: Path) -> None:
        self.ctr("images", "pull", "--hosts-dir", str(certs_dir), ref)

    def load(self, image: ImageRef) -> None:
        self.ctr("images", "import", "--base-name", image.ref.rpartition(":")[0], str(image.archive))

    def images(self) -> dict[str, str]:
        """ref -> manifest digest of what this containerd holds."""
        lines = self.ctr("images", "list").stdout.splitlines()[1:]
        return {cols[0]: cols[2] for cols in (line.split() for line in lines)}

    def disk_bytes(self) -> int:
        """Bytes under its root: content store + unpacked snapshots."""
        return disk_bytes(self.dir / "root")

    def stop(self) -> None:
        terminate(self.process, 15)
        self.log.close()
        for mount in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            target = mount.split()[1]
            if target.startswith(str(self.dir) + "/"):
                subprocess.run(["umount", "-l", target], capture_output=True, timeout=30, check=False)


@contextlib.contextmanager
def scratch_containerd() -> Iterator[ScratchContainerd]:
    workdir = Path(tempfile.mkdtemp(prefix="rtj-ctd-", dir="/var/tmp"))
    node = ScratchContainerd(workdir)
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def push_archive(archive: Path, target: str) -> None:
    """PUT an OCI archive's blobs and manifest to `http://host:port/repo:tag` (the registry API, plain http)."""
    import http.client
    import urllib.parse

    url = urllib.parse.urlsplit(target)
    repo, _, tag = url.path.lstrip("/").rpartition(":")
    conn = http.client.HTTPConnection(url.netloc, timeout=120)

    def call(method: str, path: str, body: object = None, headers: dict[str, str] | None = None) -> Any:
        conn.request(method, path, body=body, headers=headers or {})  # type: ignore[arg-type]
        response = conn.getresponse()
        response.read()
        if response.status >= 400:
            raise RuntimeError(f"{method} {path}: {response.status} {response.reason}")
        return response

    with tarfile.open(archive) as tar:
        def blob(digest: str) -> tuple[tarfile.TarInfo, Any]:
            member = tar.getmember("blobs/" + digest.replace(":", "/"))
            return member, tar.extractfile(member)

        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        descriptor = index["manifests"][0]
        _, manifest_file = blob(descriptor["digest"])
        manifest = manifest_file.read()
        for layer in [json.loads(manifest)["config"], *json.loads(manifest)["layers"]]:
            conn.request("HEAD", f"/v2/{repo}/blobs/{layer['digest']}")
            exists = conn.getresponse()
            exists.read()
            if exists.status == 200:
                continue
            location = call("POST", f"/v2/{repo}/blobs/uploads/").getheader("Location")
            upload = urllib.parse.urlsplit(location)
            query = upload.query + ("&" if upload.query else "") + "digest=" + urllib.parse.quote(layer["digest"])
            member, data = blob(layer["digest"])
            call("PUT", f"{upload.path}?{query}", data,
                 {"Content-Length": str(member.size), "Content-Type": "application/octet-stream"})
        call("PUT", f"/v2/{repo}/manifests/{tag}", manifest,
             {"Content-Type": descriptor.get("mediaType", "application/vnd.oci.image.manifest.v1+json")})
    conn.close()


def disk_bytes(path: Path) -> int:
    """Bytes under `path` (hard links counted once)."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, timeout=120, check=True).stdout
    return int(out.split()[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.images", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or reuse) images; prints name, ref, digest, archive")
    build.add_argument("names", nargs="*", default=["operator", "trainer-cpu"], help=", ".join(IMAGES))
    push = sub.add_parser("push-archive", help="upload an OCI archive to http://host:port/repo:tag")
    push.add_argument("archive", type=Path)
    push.add_argument("target")
    args = parser.parse_args(argv)
    if args.command == "push-archive":
        push_archive(args.archive, args.target)
        return 0
    for ref in ensure_images(args.names).values():
        print(ref.name, ref.ref, ref.digest, ref.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
