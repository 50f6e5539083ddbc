"""The storage seam: one `Store` protocol, a read half and a write half, over a domain `Entry`.

Modelled on torchtitan's `CheckpointStorage(Protocol)`: a few primitives, and every rule (completeness,
lineage, retention) written once above them. Paths are relative to the checkpoint root. Two backends implement
it and know nothing of each other: `local` (a mounted path) and `s3` (`s3://bucket/prefix`); `roots.open_store`
picks one by the URI's scheme.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

Kind = Literal["file", "dir", "symlink", "other"]  # "other": a FIFO, socket or device (never opened)


@dataclass(frozen=True)
class Entry:
    """One entry below a root, as the rules need it: what it is, how big, and an identity that changes whenever
    its content may have (a file's device, inode, size and times; an object's ETag and time)."""

    kind: Kind
    size: int = 0
    identity: Hashable = None


class StoreReader(Protocol):
    """The reads discovery, retention and the checkpointer's claims need. Nothing below the root is followed."""

    uri: str

    def iter_entries(self) -> Iterator[tuple[str, Kind]]:
        """(name, kind) of every entry directly in the root, never following a link."""

    def list_dirs(self) -> list[str]: ...

    def entry(self, relpath: str) -> Entry | None:
        """What is at `relpath` (None if absent); raises `UnsafeEntry` for a link or non-directory on the way."""

    def read_bytes(self, relpath: str, limit: int) -> bytes | None:
        """A regular file's bytes (None if absent); `UnsafeEntry` for anything else, or over `limit` bytes."""

    def size(self, relpath: str) -> int | None:
        """A regular file's size; None if absent or not a regular file."""

    def join(self, relpath: str) -> str:
        """The URI or path of an entry, for messages and for DCP."""

    def close(self) -> None: ...


class StoreWriter(Protocol):
    """The writes the checkpointer needs: exclusive creation, replacement, and a deletion that never leaves a
    step directory looking complete while half deleted."""

    uri: str

    def join(self, relpath: str) -> str: ...

    def ensure(self) -> None:
        """Make the root exist (a no-op on an object store: prefixes exist once an object is under them)."""

    def create_exclusive(self, relpath: str, data: bytes) -> bool:
        """Create a small file that must not exist yet; False if it did (its content is left alone)."""

    def put(self, relpath: str, data: bytes) -> None:
        """Write a small file, replacing it (evidence such as `.rtj-refused`, the completed marker)."""

    def claim_step(self, name: str, token: bytes | None) -> bool:
        """Make step directory `name` ours: True if it did not exist and now holds `token` (if any)."""

    def remove_step(self, name: str) -> None:
        """Delete a step directory so that it never looks complete while half deleted."""

    def cleanup(self) -> None:
        """Finish deletions a crash interrupted (filesystem trash); nothing to do on an object store."""


class Store(StoreReader, StoreWriter, Protocol):
    """Both halves over one root."""

    def fresh(self) -> Store:
        """A new view of the same root that remembers no listing (an object store lists once per view)."""
