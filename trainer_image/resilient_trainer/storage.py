"""Where the checkpointer's own filesystem operations go: a mounted path (`LocalRoot`) or `s3://` (`S3Root`).

    root = storage.open_root("s3://bucket/prefix")   # or "/mnt/ckpt", "file:///mnt/ckpt"
    root.claim_step("step-0000000010", token)         # True: the step directory is ours (exclusively)
    root.create_exclusive(mark_name, data)             # False: it existed (a fence mark of this attempt)
    root.writer(root.join(name)) / root.reader(path)   # DCP storage (FileSystem* or Fsspec* over s3fs)
    root.remove_step(name)                             # retention and the replacement of our own partial

The rules (`resilient_contract.lineage`, `layout.check_step`) are the same on both; only the primitives differ:
- "Make a step directory exclusively": `mkdir` on a filesystem. An object store has no directories and no
  O_EXCL: a prefix is ours when we wrote its `.rtj-writer` first, with a conditional PUT (`If-None-Match: *`,
  which S3, MinIO and SeaweedFS evaluate under the object's write lock), after a LIST found the prefix empty
  (a tokenless writer, e.g. a run outside the operator, never shares a prefix with us). Without a token (a
  local run) an empty prefix is claimed by the LIST alone: nothing else writes there.
- Fence marks are created with the same conditional PUT (O_EXCL on a filesystem).
- Deletion: a filesystem renames the directory out of the `step-*` namespace first; an object store cannot
  rename a prefix, so `.metadata` is deleted first (the checkpoint stops being complete at once), then the
  shards in batches, then the writer token. An interrupted deletion leaves an incomplete step, which the
  completeness rule refuses and the next retention pass removes.
- Credentials and endpoint come only from the process's standard AWS environment (`AWS_ACCESS_KEY_ID`,
  `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, `AWS_DEFAULT_REGION`), read by botocore itself, never from the
  job's spec. DCP's `FsspecWriter`/`FsspecReader` pass their keyword arguments to `fsspec.url_to_fs`; we pass
  only the cache settings: a listing cache would make DCP's `exists(.metadata)` answer from a stale listing.

Torch is imported only by the writer/reader factories: retention uses this module torch-free.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from resilient_contract import completion, layout, lineage

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageReader, StorageWriter

S3_SCHEME = "s3://"
TRASH_PREFIX = ".trash-"
DELETE_BATCH = 1000  # keys per DeleteObjects request (the S3 maximum)
# Storage options DCP passes to fsspec for an s3:// path: fresh listings (credentials and endpoint: the environment).
S3_STORAGE_OPTIONS: dict[str, Any] = {"use_listings_cache": False}


class Root(Protocol):
    """The checkpointer's side of a checkpoint root: the writes (the reads go through `store()`)."""

    uri: str

    def store(self) -> layout.CheckpointStore:
        """A fresh read view (an S3Store caches listings for its lifetime: one per decision)."""

    def ensure(self) -> None:
        """Make the root exist (a no-op on an object store: prefixes exist once an object is under them)."""

    def join(self, name: str) -> str: ...

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

    def writer(self, path: str) -> StorageWriter: ...

    def reader(self, path: str) -> StorageReader: ...


def is_s3(uri: str) -> bool:
    return uri.startswith(S3_SCHEME)


def open_root(uri: str) -> Root:
    """The root for a checkpoint URI: `s3://bucket/prefix`, `file://...` or an absolute path."""
    if is_s3(uri):
        return S3Root(uri)
    store = layout.open_store(uri)  # validates the path (absolute, no NUL, known scheme)
    assert isinstance(store, layout.LocalStore)
    return LocalRoot(store.root)


def split(path: str) -> tuple[str, str]:
    """(root URI, step directory name) of a checkpoint path, for either kind of root."""
    if is_s3(path):
        parent, _, name = path.rstrip("/").rpartition("/")
        return parent, name
    path = path[len("file://") :] if path.startswith("file://") else path
    path = os.path.normpath(path)
    return os.path.dirname(path), os.path.basename(path)


class LocalRoot:
    """A mounted filesystem (an RWX volume shared by the workers)."""

    def __init__(self, root: str) -> None:
        self.uri = root
        self.root = root

    def store(self) -> layout.CheckpointStore:
        return layout.LocalStore(self.root)

    def ensure(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def join(self, name: str) -> str:
        return os.path.join(self.root, name)

    def create_exclusive(self, relpath: str, data: bytes) -> bool:
        try:
            fd = os.open(self.join(relpath), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    def put(self, relpath: str, data: bytes) -> None:
        with open(self.join(relpath), "wb") as f:
            f.write(data)

    def claim_step(self, name: str, token: bytes | None) -> bool:
        try:
            os.mkdir(self.join(name))
        except FileExistsError:
            return False
        if token is not None:
            with open(os.path.join(self.join(name), lineage.WRITER_FILE), "xb") as f:
                f.write(token)
        return True

    def remove_step(self, name: str) -> None:
        """Rename out of the step namespace (atomic), then delete the contents."""
        trash = self.join(f"{TRASH_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.join(name), trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def cleanup(self) -> None:
        for entry in os.listdir(self.root):
            if entry.startswith(TRASH_PREFIX):  # leftovers of a deletion interrupted by a crash
                shutil.rmtree(self.join(entry), ignore_errors=True)

    def writer(self, path: str) -> StorageWriter:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(path, sync_files=True, overwrite=False)

    def reader(self, path: str) -> StorageReader:
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(path)


class S3Root:
    """`s3://bucket/prefix` through s3fs, with the standard AWS environment's credentials and endpoint."""

    def __init__(self, uri: str, fs: Any = None) -> None:
        from resilient_contract import s3store  # deferred: s3fs is needed for s3:// roots only

        try:
            self.loc = s3store.parse_uri(uri)
        except ValueError as exc:
            raise layout.StorageError(str(exc), layout.REASON_INVALID_ROOT) from None
        self.uri = self.loc.uri
        self._fs = fs if fs is not None else s3store.filesystem()

    def store(self) -> layout.CheckpointStore:
        from resilient_contract import s3store

        return s3store.S3Store(self.uri, fs=self._fs)

    def ensure(self) -> None:
        pass

    def join(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def _key(self, relpath: str) -> str:
        return self.loc.key(relpath)

    def _path(self, relpath: str) -> str:
        return f"{self.loc.bucket}/{self._key(relpath)}"

    def _call(self, op: str, **kwargs: Any) -> Any:
        from resilient_contract import s3store

        try:
            return self._fs.call_s3(op, Bucket=self.loc.bucket, **kwargs)
        except Exception as exc:
            raise s3store.S3Error(f"{op} in {self.uri} failed: {s3store.describe_error(exc)}") from exc

    def create_exclusive(self, relpath: str, data: bytes) -> bool:
        try:
            self._fs.call_s3("put_object", Bucket=self.loc.bucket, Key=self._key(relpath), Body=data,
                             IfNoneMatch="*")
        except Exception as exc:
            if _precondition_failed(exc):
                return False
            from resilient_contract import s3store

            raise s3store.S3Error(f"writing {self.join(relpath)} failed: {s3store.describe_error(exc)}") from exc
        return True

    def put(self, relpath: str, data: bytes) -> None:
        self._call("put_object", Key=self._key(relpath), Body=data)

    def _keys(self, name: str) -> list[str]:
        """Every key under a step prefix (bounded like discovery's listing)."""
        from resilient_contract import s3store

        return [self._key(name) + "/" + rel for rel in s3store.S3Store(self.uri, fs=self._fs).step_listing(name)]

    def claim_step(self, name: str, token: bytes | None) -> bool:
        if self._keys(name):
            return False  # something is there already: a prefix is never shared
        if token is None:
            return True
        return self.create_exclusive(posixpath.join(name, lineage.WRITER_FILE), token)

    def remove_step(self, name: str) -> None:
        """`.metadata` first (no longer complete), then the rest in batches, the writer token last."""
        keys = self._keys(name)
        first = [k for k in keys if posixpath.basename(k) == layout.METADATA_FILE]
        last = [k for k in keys if posixpath.basename(k) == lineage.WRITER_FILE]
        rest = [k for k in keys if k not in first and k not in last]
        for group in (first, rest, last):
            for i in range(0, len(group), DELETE_BATCH):
                batch = group[i : i + DELETE_BATCH]
                answer = self._call("delete_objects", Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
                if answer.get("Errors"):
                    err = answer["Errors"][0]
                    raise layout.StorageError(f"deleting {self.join(name)} failed: {err.get('Code')} "
                                              f"{str(err.get('Message'))[:200]}")

    def cleanup(self) -> None:
        pass

    def writer(self, path: str) -> StorageWriter:
        from torch.distributed.checkpoint import FsspecWriter

        # sync_files: an object is durable once its PUT (or multipart completion) returned; s3fs streams
        # have no fsync (DCP would warn per shard). overwrite=False: DCP refuses a prefix holding .metadata.
        return FsspecWriter(path, sync_files=False, overwrite=False, **S3_STORAGE_OPTIONS)

    def reader(self, path: str) -> StorageReader:
        from torch.distributed.checkpoint import FsspecReader

        return FsspecReader(path, **S3_STORAGE_OPTIONS)


def _precondition_failed(exc: BaseException) -> bool:
    """Whether a conditional PUT lost: 412 (the key exists) or 409 (a concurrent conditional write won)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        if "PreconditionFailed" in str(exc) or "ConditionalRequestConflict" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def write_completed_marker(checkpoint_root: str, **fields: object) -> str:
    """`completion.write_completed_marker` for either kind of root (the same JSON, one object on S3)."""
    if not is_s3(checkpoint_root):
        return completion.write_completed_marker(checkpoint_root, **fields)
    root = S3Root(checkpoint_root)
    body = json.dumps({"kind": completion.SUCCEEDED, **{k: str(v) for k, v in fields.items()}}).encode()
    root.put(completion.COMPLETED_MARKER_FILE, body)
    return root.join(completion.COMPLETED_MARKER_FILE)
