"""A real S3 server for the tests: SeaweedFS (`weed server -s3`), built by hack/seaweedfs/build.sh.

    with S3Server.start(tmp_path, identities=[Identity.for_bucket("tenant-a", "bucket-a")]) as s3:
        s3.create_bucket("bucket-a")
        env = s3.client_env(s3.admin)    # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for a process
        fs = s3.filesystem(s3.admin)     # an s3fs.S3FileSystem for the test's own checks

One server per use, with a data directory of its own, every port chosen free on one address (the
host's loopback by default; pass `preexec_fn` and `host` to run it inside a cluster's network namespace),
and identities from a static `s3.json`: an admin, plus whatever each test names (scoped to a bucket or
prefix, the way a platform hands out credentials). Never a mock: the trainer and the operator talk to it
through s3fs exactly as they would to AWS or MinIO.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE.parent / "hack" / "seaweedfs" / "build.sh"
REGION = "us-east-1"  # SeaweedFS ignores it; botocore wants one


def weed_binary() -> Path:
    """The cached `weed`, building it on first use (several minutes cold, instant when cached)."""
    override = os.environ.get("RTJ_WEED_BIN")
    if override:
        return Path(override)
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True, timeout=3600)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Identity:
    """An S3 identity: keys and SeaweedFS actions ("Read", "Write:bucket", "List:bucket/prefix", "Admin")."""

    name: str
    access_key: str
    secret_key: str
    actions: tuple[str, ...]

    @classmethod
    def new(cls, name: str, actions: Iterable[str]) -> Identity:
        return cls(name, "AK" + secrets.token_hex(8).upper(), secrets.token_hex(20), tuple(actions))

    @classmethod
    def for_bucket(cls, name: str, bucket: str, *, read_only: bool = False) -> Identity:
        verbs = ("Read", "List") if read_only else ("Read", "Write", "List", "Tagging")
        return cls.new(name, [f"{verb}:{bucket}" for verb in verbs])

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                "actions": list(self.actions)}


def _free_ports(host: str, count: int) -> list[int]:
    """Ports free on `host` now, and their +10000 gRPC twins free too (SeaweedFS' convention)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        try:
            with socket.socket() as s:
                s.bind((host, port + 10000))
        except OSError:
            continue
        ports.append(port)
    return ports


@dataclass
class S3Server:
    """A running SeaweedFS with the S3 gateway; `stop()` (or the context manager) ends it."""

    workdir: Path
    host: str
    port: int
    admin: Identity
    identities: list[Identity]
    process: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def start(cls, workdir: Path | str, *, identities: Iterable[Identity] = (), host: str = "127.0.0.1",
              ports: dict[str, int] | None = None, preexec_fn: Callable[[], None] | None = None,
              timeout: float = 90.0) -> S3Server:
        """Start SeaweedFS (master, volume, filer, S3) and wait until S3 answers a signed request.

        `ports`: fixed ports (inside a network namespace of its own, where nothing else listens); on the
        host's loopback they are picked free."""
        workdir = Path(workdir)
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        admin = Identity.new("admin", ["Admin", "Read", "Write", "List", "Tagging"])
        server = cls(workdir, host, 0, admin, [admin, *identities])
        (workdir / "s3.json").write_text(json.dumps({"identities": [i.config() for i in server.identities]}))
        if ports is None:
            names = ("master", "volume", "filer", "s3")
            ports = dict(zip(names, _free_ports(host, len(names)), strict=True))
        server.ports = dict(ports)
        server.port = ports["s3"]
        args = [
            str(weed_binary()), "server", f"-ip={host}", f"-ip.bind={host}", f"-dir={data}",
            "-volume.max=0", "-master.volumeSizeLimitMB=64",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master'] + 10000}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume'] + 10000}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer'] + 10000}",
            "-s3", f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3'] + 10000}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={workdir / 's3.json'}",
        ]
        log = open(workdir / "weed.log", "ab")  # noqa: SIM115 (the process holds it)
        server.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                                          preexec_fn=preexec_fn, start_new_session=True)  # noqa: PLW1509
        log.close()
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.workdir / 'weed.log'}")
            try:  # an unsigned request: 403 means the gateway (and its filer) is up and enforcing auth
                urllib.request.urlopen(f"{self.endpoint}/", timeout=2)
                return
            except urllib.error.HTTPError as exc:
                if exc.code in (403, 400):
                    return
                last = exc
            except OSError as exc:
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"SeaweedFS S3 at {self.endpoint} not ready after {timeout:.0f}s ({last}); "
                           f"see {self.workdir / 'weed.log'}")

    def client_env(self, identity: Identity) -> dict[str, str]:
        """The standard AWS variables a process (trainer, operator) reads to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": identity.access_key,
                "AWS_SECRET_ACCESS_KEY": identity.secret_key, "AWS_DEFAULT_REGION": REGION}

    def filesystem(self, identity: Identity | None = None) -> Any:
        """An s3fs filesystem for the test's own reads and writes (admin by default)."""
        import s3fs

        ident = identity or self.admin
        return s3fs.S3FileSystem(key=ident.access_key, secret=ident.secret_key, endpoint_url=self.endpoint,
                                 client_kwargs={"region_name": REGION}, skip_instance_cache=True)

    def create_bucket(self, bucket: str) -> None:
        fs = self.filesystem()
        fs.mkdir(bucket)
        deadline = time.monotonic() + 30
        while not fs.exists(bucket):  # the filer makes the bucket's directory asynchronously
            if time.monotonic() > deadline:
                raise TimeoutError(f"bucket {bucket} not visible after 30s")
            time.sleep(0.1)
            fs.invalidate_cache()

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (weed's graceful shutdown can take over 15 s)."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir / "data", ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
