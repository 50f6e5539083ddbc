"""Fixtures for the trainer tests: a launcher that always kills the process groups it started."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.s3server import Identity, S3Server
from tests.trainer.harness import Launcher


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    lw = Launcher(tmp_path)
    try:
        yield lw
    finally:
        lw.cleanup()


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    lw = Launcher(tmp_path_factory.mktemp("runs"))
    try:
        yield lw
    finally:
        lw.cleanup()


S3_BUCKET = "trainer-ckpt"


@dataclass(frozen=True)
class S3Root:
    """A fresh `s3://` checkpoint root for one test, and the environment a trainer process reaches it with."""

    server: S3Server
    identity: Identity
    uri: str

    @property
    def env(self) -> dict[str, str]:
        return self.server.client_env(self.identity)

    def fs(self) -> Any:
        return self.server.filesystem(self.identity)

    def keys(self, sub: str = "") -> list[str]:
        """Every key below the root (or below `sub`), relative to the root, sorted."""
        fs, base = self.fs(), self.uri[len("s3://"):]
        found = fs.find(f"{base}/{sub}".rstrip("/"))
        return sorted(k[len(base) + 1:] for k in found)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, Identity]]:
    """One real SeaweedFS S3 server for the trainer's tests, with one bucket and an identity limited to it
    (the way a platform hands out credentials). A start takes a few seconds."""
    identity = Identity.for_bucket("trainer", S3_BUCKET)
    server = S3Server.start(tmp_path_factory.mktemp("seaweedfs"), identities=[identity])
    try:
        server.create_bucket(S3_BUCKET)
        yield server, identity
    finally:
        if server.process is not None:  # a throwaway server: weed takes its 15 s grace on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
        server.remove()


@pytest.fixture
def s3_root(s3_server: tuple[S3Server, Identity], monkeypatch: pytest.MonkeyPatch) -> S3Root:
    """A fresh prefix per test; this process's AWS environment points at it (as a pod's would)."""
    server, identity = s3_server
    root = S3Root(server, identity, f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:12]}/ckpt")
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in root.env.items():
        monkeypatch.setenv(key, value)
    return root
