"""The checkpoint layout, and the one rule that says whether a checkpoint is complete.

Layout: `<root>/step-<10-digit step>/` holding DCP shard files and `.metadata`. DCP writes `.metadata`
last, but a reused directory, `sync_files=False` or an eventually consistent store can still leave a
`.metadata` beside missing shards, so completeness is checked, not trusted: `.metadata` must parse
(with the restricted unpickler) and every file it references must hold at least offset+length bytes.

Storage goes through `CheckpointStore`, so an object store (`s3://`) can be added without touching the
rule. Torch-free: the operator imports this module.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from resilient_contract import dcp_metadata

METADATA_FILE = ".metadata"
STEP_DIR_PREFIX = "step-"
STEP_DIGITS = 10
_STEP_DIR_RE = re.compile(rf"^{STEP_DIR_PREFIX}(\d{{{STEP_DIGITS}}})$")


def step_dir_name(step: int) -> str:
    """`step-0000001200`: fixed width so names sort in step order."""
    if step < 0 or step >= 10**STEP_DIGITS:
        raise ValueError(f"step {step} does not fit the {STEP_DIGITS}-digit layout")
    return f"{STEP_DIR_PREFIX}{step:0{STEP_DIGITS}d}"


def parse_step_dir(name: str) -> int | None:
    """The step a directory name stands for, or None if the name is not a checkpoint directory."""
    match = _STEP_DIR_RE.match(name)
    return int(match.group(1)) if match else None


class StorageError(OSError):
    """The checkpoint root cannot be read (permission denied, unsupported scheme, not a directory)."""


class RootMissing(StorageError):
    """The checkpoint root does not exist: normal before the first save, alarming after one."""


class CheckpointStore(Protocol):
    """The storage seam: the few reads discovery needs. Paths are relative to the checkpoint root."""

    uri: str

    def list_dirs(self) -> list[str]: ...

    def read_bytes(self, relpath: str, limit: int) -> bytes | None: ...

    def size(self, relpath: str) -> int | None: ...

    def join(self, relpath: str) -> str: ...


class LocalStore:
    """A checkpoint root on a mounted filesystem (an RWX volume shared by the workers)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.uri = root

    def list_dirs(self) -> list[str]:
        try:
            with os.scandir(self.root) as it:
                return [e.name for e in it if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            raise RootMissing(f"checkpoint root {self.root} does not exist") from None
        except PermissionError:
            raise StorageError(f"checkpoint root {self.root} is not readable (permission denied)") from None
        except NotADirectoryError:
            raise StorageError(f"checkpoint root {self.root} is not a directory") from None

    def read_bytes(self, relpath: str, limit: int) -> bytes | None:
        try:
            with open(os.path.join(self.root, relpath), "rb") as f:
                return f.read(limit + 1)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def size(self, relpath: str) -> int | None:
        try:
            st = os.stat(os.path.join(self.root, relpath))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_size if os.path.isfile(os.path.join(self.root, relpath)) else None

    def join(self, relpath: str) -> str:
        return os.path.join(self.root, relpath)


def open_store(uri: str) -> CheckpointStore:
    """Resolve a checkpoint root URI: a path or `file://` now; other schemes fail with a clear error."""
    if uri.startswith("file://"):
        return LocalStore(uri[len("file://") :])
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise StorageError(f"checkpoint storage scheme {scheme}:// is not supported yet (use a mounted path)")
    if not uri.startswith("/"):
        raise StorageError(f"checkpoint root {uri!r} must be an absolute path")
    return LocalStore(uri)


@dataclass(frozen=True)
class Verdict:
    """Whether one step directory is a complete checkpoint, and if not, why (for events and logs)."""

    step: int
    path: str
    complete: bool
    reason: str = ""


def check_step(store: CheckpointStore, name: str) -> Verdict:
    """The completeness rule, in one place."""
    step = parse_step_dir(name)
    if step is None:
        raise ValueError(f"{name!r} is not a step directory")
    path = store.join(name)

    def bad(reason: str) -> Verdict:
        return Verdict(step, path, False, reason)

    data = store.read_bytes(posixpath.join(name, METADATA_FILE), dcp_metadata.MAX_METADATA_BYTES)
    if data is None:
        return bad("no .metadata (save incomplete or in progress)")
    try:
        entries = dcp_metadata.storage_entries(data)
    except dcp_metadata.UnsafeMetadata as exc:
        return bad(f"unsafe .metadata rejected without running it: {exc}")
    except dcp_metadata.MalformedMetadata as exc:
        return bad(str(exc))
    needed: dict[str, int] = {}
    for entry in entries:
        rel = posixpath.normpath(entry.relative_path)
        if rel.startswith(("/", "..")) or rel == ".":
            return bad(f".metadata references {entry.relative_path!r} outside the checkpoint")
        needed[rel] = max(needed.get(rel, 0), entry.offset + entry.length)
    for rel, end in sorted(needed.items()):
        size = store.size(posixpath.join(name, rel))
        if size is None:
            return bad(f"shard {rel} is missing")
        if size < end:
            return bad(f"shard {rel} is truncated ({size} bytes, needs {end})")
    return Verdict(step, path, True)


def step_dirs(store: CheckpointStore) -> list[tuple[int, str]]:
    """(step, name) of every step directory, oldest first."""
    found = []
    for name in store.list_dirs():
        step = parse_step_dir(name)
        if step is not None:
            found.append((step, name))
    found.sort()
    return found


def scan_newest_first(store: CheckpointStore) -> Iterator[Verdict]:
    """Verdicts from the newest step directory back; stop consuming once you have what you need."""
    for _, name in reversed(step_dirs(store)):
        yield check_step(store, name)


def latest_complete(store: CheckpointStore) -> Verdict | None:
    """The newest complete checkpoint, skipping newer incomplete ones; None if there is none."""
    for verdict in scan_newest_first(store):
        if verdict.complete:
            return verdict
    return None


@dataclass(frozen=True)
class Listing:
    """What discovery reports to the operator's core: the newest complete checkpoint and what was skipped."""

    root: str
    latest: Verdict | None
    skipped: tuple[Verdict, ...] = ()
    error: str | None = None
    missing: bool = False


def discover(uri: str) -> Listing:
    """Find the latest complete checkpoint under a root; storage errors become `Listing.error`."""
    try:
        store = open_store(uri)
        skipped: list[Verdict] = []
        for verdict in scan_newest_first(store):
            if verdict.complete:
                return Listing(uri, verdict, tuple(skipped))
            skipped.append(verdict)
        return Listing(uri, None, tuple(skipped))
    except RootMissing as exc:
        return Listing(uri, None, (), str(exc), missing=True)
    except StorageError as exc:
        return Listing(uri, None, (), str(exc))
