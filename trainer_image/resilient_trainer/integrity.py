"""Content integrity of checkpoints: a checksum per item of every shard, computed while it is written, and
verified while it is read.

    writer = SummingWriter.wrap(FileSystemWriter(path))   # done by upload.GuardedWriter for every save
    reader = verifying_reader(FileSystemReader, path)      # done by storage.Root.reader for every load

Where the bytes are seen (no second pass over a shard, no copy of torch code):
- Writing: DCP's `FileSystemWriter` (and `FsspecWriter`, the same class over fsspec) opens each shard file
  through `self.fs.create_stream(path, "wb")` and writes every item into that stream, asking `stream.tell()`
  before and after each item (its offset and length in `.metadata`). The writer's `fs` is wrapped: the stream it
  hands out checksums each `write()` as the bytes pass, and closes a *segment* at each `tell()` that follows
  written bytes, so the segments are exactly the items DCP records. DCP's `_extensions` stream transforms were
  not used: their descriptor is fixed before the bytes are written (so it cannot carry a checksum), it is
  recorded in `.metadata` (which the operator's restricted reader parses), and a reader would need the extension.
- Reading: DCP's `FileSystemReader.read_data` opens each item as a slice of its shard (`_slice_file`). The
  verifying reader reads that slice once into memory, checks it against the manifest's segments, and hands
  DCP the verified bytes (so the check costs one item in memory at a time, not a second read).

The manifest (`names.MANIFEST_FILE`, JSON) is written by rank 0 right before `.metadata`, after every rank's
checksums reached it with its write results (they ride with them and are removed before DCP's own `finish`),
durably (fsync of the file and the directory on a filesystem; an object exists once its PUT returned):

    {"version": 1, "algorithm": "xxh3-64", "files": {"__0_0.distcp": [[offset, length, digest], ...], ...}}

Algorithm: XXH3-64 through `xxhash` (BSD-2-Clause, maintained): about 8 GB/s on one core of the dev machine,
the GIL released, and it takes the memoryviews `torch.save` writes without copying them. CRC-32C was the
issue's other suggestion: `google-crc32c` (Apache-2.0, ~4 GB/s) accepts only `bytes`, so every tensor would be
copied before it is summed, and `crc32c` is LGPL. Without `xxhash`, zlib's CRC-32 (`"crc32"`, ~1-2 GB/s, also
GIL-free) is used. The manifest names the algorithm; a reader knows both. A checkpoint without a
manifest (written before this existed) loads unverified. A mismatch raises `ChecksumMismatch`, which the
Checkpointer turns into a fallback to the previous complete checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from resilient_contract.storage.names import MANIFEST_FILE

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20  # a manifest holds one small triple per item: far below this

xxhash: Any
try:
    import xxhash
except ImportError:  # pragma: no cover - the trainer extra installs it
    xxhash = None


class _Crc32:
    """zlib's CRC-32 with xxhash's hasher interface (the fallback; GIL-free for large buffers too)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = zlib.crc32(data, self.value)

    def intdigest(self) -> int:
        return self.value


# name -> a new hasher (update(buffer), intdigest()); every one accepts memoryviews without copying them
ALGORITHMS: dict[str, Callable[[], Any]] = {"crc32": _Crc32}
if xxhash is not None:
    ALGORITHMS["xxh3-64"] = xxhash.xxh3_64
DEFAULT_ALGORITHM = "xxh3-64" if xxhash is not None else "crc32"


def digest(algorithm: str, data: Any) -> int:
    hasher = ALGORITHMS[algorithm]()
    hasher.update(data)
    return int(hasher.intdigest())


class ChecksumMismatch(RuntimeError):
    """Bytes read from a checkpoint do not match its manifest (or the manifest cannot vouch for them)."""

    def __init__(self, checkpoint: str, detail: str) -> None:
        super().__init__(f"checkpoint {checkpoint} is corrupt: {detail}")
        self.checkpoint, self.detail = checkpoint, detail

    def __reduce__(self) -> tuple[Any, ...]:  # crosses ranks inside DCP's CheckpointException (pickled)
        return (ChecksumMismatch, (self.checkpoint, self.detail))


def _bytes_view(data: Any) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 and view.contiguous else view.cast("B")


# ---- writing --------------------------------------------------------------------------------------------------
class SummingStream(io.RawIOBase):
    """A write stream that checksums what passes through it, one segment per item (closed at each `tell()`
    that follows written bytes: DCP asks for the offset at the start and the end of every item)."""

    def __init__(self, raw: Any, algorithm: str) -> None:
        super().__init__()
        self.raw, self._new = raw, ALGORITHMS[algorithm]
        self._start = self._pos = 0
        self._hasher = self._new()
        self.segments: list[list[int]] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = _bytes_view(b)
        self._hasher.update(view)
        written = self.raw.write(view)
        written = len(view) if written is None else written
        if written != len(view):  # a short write: the checksum would not describe the file
            raise OSError(f"short write ({written} of {len(view)} bytes)")
        self._pos += written
        return written

    def _cut(self) -> None:
        if self._pos > self._start:
            self.segments.append([self._start, self._pos - self._start, int(self._hasher.intdigest())])
            self._start, self._hasher = self._pos, self._new()

    def tell(self) -> int:
        self._cut()
        return self._pos

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def close(self) -> None:  # the shard's stream is closed by the context that opened it
        self._cut()
        super().close()

    def finish(self) -> list[list[int]]:
        self._cut()
        return self.segments


class SummingFileSystem:
    """A DCP `FileSystemBase` whose write streams checksum what they write; everything else is the inner one's."""

    def __init__(self, inner: Any, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self.inner, self.algorithm = inner, algorithm
        self.sums: dict[str, list[list[int]]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "algorithm": self.algorithm, "sums": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "_lock", "sums", "algorithm"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with self.inner.create_stream(path, mode) as stream:
                yield stream
            return
        with self.inner.create_stream(path, mode) as stream:
            summing = SummingStream(stream, self.algorithm)
            yield summing
            segments = summing.finish()
        with self._lock:
            self.sums[os.path.basename(os.fspath(path))] = segments

    def take(self, names: set[str]) -> dict[str, list[list[int]]]:
        """The segments of the files named (those a write_data reported), forgotten here."""
        with self._lock:
            return {name: self.sums.pop(name) for name in names if name in self.sums}


@dataclass
class ShardSums:
    """One rank's checksums, carried to rank 0 beside its write results (removed before DCP's `finish`)."""

    algorithm: str
    files: dict[str, list[list[int]]] = field(default_factory=dict)


def summing_fs(writer: Any) -> SummingFileSystem | None:
    """Install (once) and return the checksumming fs of a DCP FileSystemWriter/FsspecWriter; None for another
    kind of writer (a custom `writer_factory`): its saves then have no manifest."""
    fs = getattr(writer, "fs", None)
    if isinstance(fs, SummingFileSystem):
        return fs
    if fs is None or not callable(getattr(fs, "create_stream", None)) or not hasattr(writer, "path"):
        return None
    wrapped = SummingFileSystem(fs)
    writer.fs = wrapped
    return wrapped


def relative_paths(results: Any) -> set[str]:
    """The shard files a rank's write results name."""
    names = set()
    for result in results:
        path = getattr(getattr(result, "storage_data", None), "relative_path", None)
        if isinstance(path, str):
            names.add(path)
    return names


def split_results(results: list[list[Any]]) -> tuple[list[list[Any]], list[ShardSums | None]]:
    """Each rank's write results without its ShardSums, and the ShardSums (None where a rank sent none)."""
    clean, sums = [], []
    for rank_results in results:
        mine = [r for r in rank_results if isinstance(r, ShardSums)]
        clean.append([r for r in rank_results if not isinstance(r, ShardSums)])
        sums.append(mine[0] if mine else None)
    return clean, sums


def manifest_bytes(sums: list[ShardSums]) -> bytes:
    algorithms = {s.algorithm for s in sums}
    if len(algorithms) != 1:
        raise ValueError(f"ranks checksummed with different algorithms: {sorted(algorithms)}")
    files: dict[str, list[list[int]]] = {}
    for s in sums:
        for name, segments in s.files.items():
            if name in files:
                raise ValueError(f"two ranks wrote shard {name}")
            files[name] = segments
    doc = {"version": MANIFEST_VERSION, "algorithm": algorithms.pop(), "files": dict(sorted(files.items()))}
    return json.dumps(doc, separators=(",", ":")).encode()


def write_manifest(writer: Any, data: bytes) -> None:
    """Commit the manifest in the step directory, durably, before `.metadata` (the caller commits that next)."""
    fs = writer.fs.inner if isinstance(writer.fs, SummingFileSystem) else writer.fs
    target = fs.concat_path(writer.path, MANIFEST_FILE)
    with fs.create_stream(target, "wb") as stream:
        stream.write(data)
        if getattr(writer, "sync_files", False):
            stream.flush()
            os.fsync(stream.fileno())
    if getattr(writer, "sync_files", False) and os.path.isdir(os.fspath(writer.path)):
        fd = os.open(os.fspath(writer.path), os.O_RDONLY)  # the directory entry too: .metadata comes next
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---- reading --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Manifest:
    algorithm: str
    files: dict[str, dict[int, tuple[int, int]]]  # shard -> offset -> (length, crc)

    @classmethod
    def parse(cls, data: bytes, checkpoint: str) -> Manifest:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
                raise ValueError("not a version-1 manifest")
            algorithm = doc["algorithm"]
            if algorithm not in ALGORITHMS:
                raise ValueError(f"unknown algorithm {str(algorithm)[:40]!r}")
            files: dict[str, dict[int, tuple[int, int]]] = {}
            for name, segments in doc["files"].items():
                table: dict[int, tuple[int, int]] = {}
                for offset, length, crc in segments:
                    if not all(isinstance(v, int) and v >= 0 for v in (offset, length, crc)):
                        raise ValueError("a segment is not three non-negative integers")
                    table[offset] = (length, crc)
                files[str(name)] = table
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ChecksumMismatch(checkpoint, f"its checksum manifest {MANIFEST_FILE} is unreadable "
                                               f"({type(exc).__name__}: {str(exc)[:200]})") from None
        return cls(algorithm, files)

    def verify(self, checkpoint: str, name: str, offset: int, data: memoryview) -> None:
        """Check `data`, read at `offset` of shard `name`, against the segments that tile it exactly."""
        table = self.files.get(name)
        where = f"shard {name} bytes [{offset}, {offset + len(data)})"
        if table is None:
            raise ChecksumMismatch(checkpoint, f"{where}: the shard is not in its checksum manifest")
        pos = 0
        while pos < len(data):
            segment = table.get(offset + pos)
            if segment is None or pos + segment[0] > len(data):
                raise ChecksumMismatch(checkpoint, f"{where}: no checksummed segment starts at {offset + pos} "
                                                   "and ends inside the read (manifest or .metadata damaged)")
            length, expected = segment
            got = digest(self.algorithm, data[pos:pos + length])
            if got != expected:
                raise ChecksumMismatch(checkpoint, f"{where}: {self.algorithm} of [{offset + pos}, "
                                                   f"{offset + pos + length}) is {got:x}, the manifest says "
                                                   f"{expected:x}")
            pos += length


def read_manifest(fs: Any, path: Any, checkpoint: str) -> Manifest | None:
    """The step directory's manifest; None when it has none (a checkpoint older than checksums)."""
    try:
        with fs.create_stream(fs.concat_path(path, MANIFEST_FILE), "rb") as stream:
            data = stream.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ChecksumMismatch(checkpoint, f"its checksum manifest is larger than {MAX_MANIFEST_BYTES} bytes")
    return Manifest.parse(data, checkpoint)


def _read_exactly(stream: IO[bytes], length: int) -> bytes:
    chunks, left = [], length
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class VerifyingReaderMixin:
    """Mixed into DCP's FileSystemReader/FsspecReader: every item's bytes are checked before DCP decodes them."""

    _manifest: Manifest | None = None

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)  # type: ignore[misc]
        checkpoint = str(self.path)  # type: ignore[attr-defined]
        self._manifest = read_manifest(self.fs, self.path, checkpoint)  # type: ignore[attr-defined]
        if self._manifest is None:
            log.info("checkpoint %s has no checksum manifest (written before checksums): loading unverified",
                     checkpoint)

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        view = super()._slice_file(file, sinfo)  # type: ignore[misc]
        if self._manifest is None:
            return view
        data = _read_exactly(view, sinfo.length)
        checkpoint = str(self.path)  # type: ignore[attr-defined]
        if len(data) != sinfo.length:
            raise ChecksumMismatch(checkpoint, f"shard {sinfo.relative_path} ends at {sinfo.offset + len(data)}, "
                                               f"before the item at [{sinfo.offset}, {sinfo.offset + sinfo.length})")
        self._manifest.verify(checkpoint, sinfo.relative_path, sinfo.offset, memoryview(data))
        return io.BytesIO(data)


def verifying_reader(base: type, path: str, **kwargs: Any) -> Any:
    """An instance of DCP reader class `base` (FileSystemReader or FsspecReader) that verifies what it loads."""
    cls = _VERIFYING.get(base)
    if cls is None:
        cls = _VERIFYING[base] = type(f"Verifying{base.__name__}", (VerifyingReaderMixin, base), {})
    return cls(path, **kwargs)


_VERIFYING: dict[type, type] = {}


def find_mismatch(exc: BaseException) -> ChecksumMismatch | None:
    """The ChecksumMismatch behind a failed load: raised here, or on any rank inside DCP's CheckpointException."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ChecksumMismatch):
            return item
        if isinstance(item, tuple):
            todo.extend(item)
            continue
        if isinstance(item, BaseException):
            failures = getattr(item, "failures", None)
            if isinstance(failures, dict):
                todo.extend(failures.values())
            todo.extend((item.__cause__, item.__context__))
    return None
