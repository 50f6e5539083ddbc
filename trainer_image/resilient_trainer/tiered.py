"""Two-tier checkpoints: a save's shards land in a node-local directory first, are then uploaded to the shared
root, and `.metadata` is committed on the root only after every rank's shards have landed there.

    writer = TieredWriter(local_step_dir(local, path), root_writer)  # Checkpointer.save, $RTJ_LOCAL_CHECKPOINT_DIR
    commit_local(local, path)                                         # every rank, once `path` is committed
    reader = root.reader(path, local=marked_step(local, path))       # Checkpointer.load

Why this shape:
- `write_data` writes this rank's shards with DCP's own `FileSystemWriter` into the local step directory (the
  checksumming stream of `integrity` sums them there, while they are written), then copies each finished file
  to the root before it returns its write results. DCP calls `finish` (rank 0: the manifest, then `.metadata`)
  only after every rank's `write_data` returned, so the commit follows the last shard's landing on the root; a
  failed copy fails that rank's write, DCP never calls `finish`, and the root keeps no `.metadata`. The
  completeness rule does not change: the root alone is the checkpoint.
- The copy runs where `write_data` runs: the upload thread or the writer process (`upload`), never the loop.
- The local tier is a cache, not a record: no fsync there (the root copy is fsynced, or a finished PUT), and
  every byte loaded from it is verified against the root's checksum manifest.
- Layout `<local>/<step dir name>/<shard files>`, shared by the ranks of a pod (DCP's shard names carry the
  rank). Once a save is committed, each rank marks its local step (`LOCAL_MARK`, holding the root path) and
  removes every other local step directory; a write first removes the unmarked ones (failed saves). So the
  local directory holds at most the newest committed step plus the one being written. Only names that parse
  as step directories are ever removed.
- Loading (`LocalFirstMixin`): `.metadata` and the manifest are read from the root; a shard is read from the
  local step directory when that directory carries the mark for the same root path and the checkpoint has a
  manifest, else from the root. An item whose local bytes do not match the manifest is read again from the
  root and verified there: a damaged local copy costs one re-read, never a wrong state and never the refusal
  of a checkpoint whose root copy is sound. A resharded load (another world size) finds only some files
  locally. Without a manifest (a checkpoint older than checksums) the local tier is not used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter, StorageWriter

from resilient_contract.storage import parse_step_dir, roots
from resilient_trainer import integrity

log = logging.getLogger(__name__)

LOCAL_MARK = ".rtj-local-committed"  # in a local step directory: its save was committed on this root path
# Test-only: a rank waits before uploading its shards until this file exists. Never set in production.
TEST_HOLD_UPLOAD_ENV = "RTJ_TEST_HOLD_UPLOAD"


def _name(path: str) -> str:
    return os.path.basename(os.fspath(path).rstrip("/"))


def overlap(local: str, root_uri: str) -> bool:
    """Whether the local tier and a files root are the same directory or nest: the local tier removes step
    directories of its own, which must never be the root's checkpoints."""
    if roots.is_object_store(root_uri):
        return False
    a, b = os.path.realpath(local), os.path.realpath(roots.local_path(root_uri))
    return a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep)


def local_step_dir(local: str, path: str) -> str:
    """The local directory of the root step directory `path`."""
    return os.path.join(local, _name(path))


def _step_dirs(local: str) -> list[str]:
    try:
        entries = os.listdir(local)
    except FileNotFoundError:
        return []
    return [e for e in entries if parse_step_dir(e) is not None and os.path.isdir(os.path.join(local, e))]


def _marked_for(step: str) -> str | None:
    try:
        with open(os.path.join(step, LOCAL_MARK), encoding="utf-8") as f:
            return f.read(4096)
    except OSError:
        return None


def commit_local(local: str, path: str) -> None:
    """After `path` was committed on the root: mark its local copy, remove every other local step."""
    name = _name(path)
    step = os.path.join(local, name)
    if os.path.isdir(step):
        with open(os.path.join(step, LOCAL_MARK), "w", encoding="utf-8") as f:
            f.write(os.fspath(path))
    for other in _step_dirs(local):
        if other != name:
            shutil.rmtree(os.path.join(local, other), ignore_errors=True)


def marked_step(local: str | None, path: str) -> str | None:
    """The local copy of the committed checkpoint `path`, if this node has one; None otherwise."""
    if not local:
        return None
    step = local_step_dir(local, path)
    return step if _marked_for(step) == os.fspath(path) else None


def _tidy(local: str, name: str) -> None:
    """Before writing step `name`: remove unmarked local steps (failed saves), and the target's old mark."""
    for other in _step_dirs(local):
        if other != name and _marked_for(os.path.join(local, other)) is None:
            shutil.rmtree(os.path.join(local, other), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(local, name, LOCAL_MARK))


def upload_file(src: str, root: Any, name: str) -> None:
    """Copy one finished shard to the root writer's directory: a PUT through fsspec (s3fs: multipart for large
    files) or a file copy, fsynced when the root writer syncs its files."""
    dst = os.fspath(root.fs.concat_path(root.path, name))
    remote = getattr(root.fs, "fs", None)  # fsspec's filesystem behind DCP's FsspecWriter
    if remote is not None:
        remote.put_file(src, dst)
        return
    shutil.copyfile(src, dst)  # copy_file_range/sendfile: in the kernel, the GIL released
    if getattr(root, "sync_files", False):
        fd = os.open(dst, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def supports(writer: Any) -> bool:
    """Whether a root writer can take uploads: DCP's FileSystemWriter or FsspecWriter (a path and an fs)."""
    return isinstance(writer, FileSystemWriter) and callable(getattr(writer.fs, "concat_path", None))


class TieredWriter(StorageWriter):
    """Writes shards to the local tier, uploads them to the root, commits on the root; picklable (the writer
    process) when the root writer is. `fs` is the local writer's (checksummed by `integrity.summing_fs`),
    `path` the root's (the checkpoint's name), `commit_writer` the root writer (the manifest goes there)."""

    def __init__(self, local_path: str, root: FileSystemWriter) -> None:
        super().__init__()
        self.local = FileSystemWriter(local_path, sync_files=False, overwrite=True)
        self.root = root
        self.path = root.path
        self.hold = os.environ.get(TEST_HOLD_UPLOAD_ENV)

    @property
    def fs(self) -> Any:
        return self.local.fs

    @fs.setter
    def fs(self, value: Any) -> None:
        self.local.fs = value

    @property
    def commit_writer(self) -> FileSystemWriter:
        return self.root

    @property
    def checkpoint_id(self) -> Any:
        return self.root.checkpoint_id

    def reset(self, checkpoint_id: Any = None) -> None:
        self.local.reset()
        self.root.reset(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # never picked by DCP's writer auto-detection

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.local.set_up_storage_writer(is_coordinator, *args, **kwargs)
        self.root.set_up_storage_writer(is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: Any) -> Any:
        local = os.path.dirname(os.fspath(self.local.path))
        _tidy(local, _name(os.fspath(self.local.path)))
        plan = self.local.prepare_local_plan(plan)  # makes the local step directory
        return self.root.prepare_local_plan(plan)  # makes the root's; refuses one holding .metadata

    def prepare_global_plan(self, plans: Any) -> Any:
        return self.root.prepare_global_plan(plans)

    def write_data(self, plan: Any, planner: Any) -> Any:
        written = self.local.write_data(plan, planner)  # DCP's FileSystemWriter writes before it returns
        names = integrity.relative_paths(written.value())
        while self.hold and not os.path.exists(self.hold):  # test-only: stalled between the tiers
            time.sleep(0.05)
        self._upload(names)
        return written

    def _upload(self, names: Iterable[str]) -> None:
        t0, size = time.perf_counter(), 0
        for name in sorted(names):
            src = os.path.join(os.fspath(self.local.path), name)
            size += os.path.getsize(src)
            upload_file(src, self.root, name)
        log.debug("uploaded %d bytes to %s in %.3f s", size, self.path, time.perf_counter() - t0)

    def finish(self, metadata: Any, results: Any) -> None:
        self.root.finish(metadata, results)

    def storage_meta(self) -> Any:
        return self.root.storage_meta()


# ---- reading --------------------------------------------------------------------------------------------------
class _LocalFirst:
    """The reader's fs: shard files open from the local step directory where they are, all else from the root."""

    def __init__(self, inner: Any, local: str) -> None:
        self.inner, self.local = inner, local
        self.origin: dict[int, Any] = {}  # id(open local stream) -> the root path of the same shard
        self.local_files = self.root_files = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "local", "origin"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        local = os.path.join(self.local, _name(os.fspath(path)))
        if "r" in mode and local.endswith(".distcp") and os.path.isfile(local):
            with open(local, "rb") as stream:
                self.origin[id(stream)] = path
                self.local_files += 1
                try:
                    yield stream
                finally:
                    self.origin.pop(id(stream), None)
            return
        if "r" in mode:
            self.root_files += 1
        with self.inner.create_stream(path, mode) as stream:
            yield stream


class LocalFirstMixin:
    """Mixed in before `integrity.VerifyingReaderMixin`: shards from the local tier when there, verified."""

    _local: str | None = None
    refetched = 0  # items whose local copy did not verify and were read from the root

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)  # type: ignore[misc]
        fs = getattr(self, "fs", None)
        if self._local is not None and getattr(self, "_manifest", None) is not None and not isinstance(fs, _LocalFirst):
            self.fs = _LocalFirst(fs, self._local)

    def read_data(self, plan: Any, planner: Any) -> Any:
        done = super().read_data(plan, planner)  # type: ignore[misc]
        fs = getattr(self, "fs", None)
        if isinstance(fs, _LocalFirst):
            log.info("loaded %s: %d shard file(s) from the local tier %s, %d from the root, %d item(s) re-read "
                     "from the root", self.path, fs.local_files, fs.local, fs.root_files,  # type: ignore[attr-defined]
                     self.refetched)
        return done

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        try:
            return super()._slice_file(file, sinfo)  # type: ignore[misc]
        except integrity.ChecksumMismatch as exc:
            fs = getattr(self, "fs", None)
            origin = fs.origin.get(id(file)) if isinstance(fs, _LocalFirst) else None
            if origin is None:
                raise
            log.warning("the local copy of %s does not match the checksum manifest (%s): reading the root's copy",
                        sinfo.relative_path, exc.detail)
            self.refetched += 1
            with fs.inner.create_stream(origin, "rb") as stream:  # type: ignore[union-attr]
                return super()._slice_file(stream, sinfo)  # type: ignore[misc]


def tiered_reader(base: type, path: str, local: str, **kwargs: Any) -> Any:
    """A verifying DCP reader (`base`: FileSystemReader or FsspecReader) that reads shards from `local` first."""
    cls = _TIERED.get(base)
    if cls is None:
        cls = _TIERED[base] = type(f"Tiered{base.__name__}", (LocalFirstMixin, integrity.VerifyingReaderMixin, base),
                                   {})
    reader = cls(path, **kwargs)
    reader._local = local
    return reader


_TIERED: dict[type, type] = {}
