"""The checkpointer's root: the contract's `Store` (`resilient_contract.storage`) plus DCP's writer and reader.

    root = storage.open_root("s3://bucket/prefix")   # or "/mnt/ckpt", "file:///mnt/ckpt"
    root.claim_step("step-0000000010", token)         # True: the step directory is ours (exclusively)
    root.writer(root.join(name)) / root.reader(path)   # DCP storage (FileSystem* or Fsspec* over s3fs)

Every primitive and rule lives in the contract (local and s3 backends, the completeness rule); this module
only picks DCP's storage for a path. On `s3://`, credentials and endpoint come from the process's standard AWS
environment, read by botocore itself; DCP's `FsspecWriter`/`FsspecReader` pass their keyword arguments to
`fsspec.url_to_fs`, and we pass only the cache settings: a listing cache would make DCP's `exists(.metadata)`
answer from a stale listing. Torch is imported only by the writer/reader factories.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from resilient_contract import completion
from resilient_contract.storage import Store, StoreReader, open_store, roots, split

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageReader, StorageWriter

__all__ = ["Root", "open_root", "split", "write_completed_marker"]

# Storage options DCP passes to fsspec for an s3:// path: fresh listings (credentials and endpoint: the environment).
S3_STORAGE_OPTIONS: dict[str, Any] = {"use_listings_cache": False}


class Root:
    """One checkpoint root as the checkpointer uses it: the store's writes, fresh read views, DCP's storage."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.uri = store.uri
        self.object_store = roots.is_object_store(store.uri)

    def store(self) -> StoreReader:
        """A fresh read view (an object store remembers listings for a view's lifetime: one per decision)."""
        return self._store.fresh()

    def ensure(self) -> None:
        self._store.ensure()

    def join(self, name: str) -> str:
        return self._store.join(name)

    def create_exclusive(self, relpath: str, data: bytes) -> bool:
        return self._store.create_exclusive(relpath, data)

    def put(self, relpath: str, data: bytes) -> None:
        self._store.put(relpath, data)

    def claim_step(self, name: str, token: bytes | None) -> bool:
        return self._store.claim_step(name, token)

    def remove_step(self, name: str) -> None:
        self._store.remove_step(name)

    def cleanup(self) -> None:
        self._store.cleanup()

    def writer(self, path: str) -> StorageWriter:
        if self.object_store:
            from torch.distributed.checkpoint import FsspecWriter

            # sync_files: an object is durable once its PUT (or multipart completion) returned; s3fs streams
            # have no fsync (DCP would warn per shard). overwrite=False: DCP refuses a prefix holding .metadata.
            return FsspecWriter(path, sync_files=False, overwrite=False, **S3_STORAGE_OPTIONS)
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(path, sync_files=True, overwrite=False)

    def reader(self, path: str, local: str | None = None) -> StorageReader:
        """DCP's reader for the path, verifying every item it loads against the checksum manifest (if any);
        with `local` (this node's committed copy of the step, see `tiered`), shards are read from there first."""
        from resilient_trainer.integrity import verifying_reader

        base: type
        options: dict[str, Any] = {}
        if self.object_store:
            from torch.distributed.checkpoint import FsspecReader

            base, options = FsspecReader, S3_STORAGE_OPTIONS
        else:
            from torch.distributed.checkpoint import FileSystemReader

            base = FileSystemReader
        if local is not None:
            from resilient_trainer.tiered import tiered_reader

            return tiered_reader(base, path, local, **options)
        return verifying_reader(base, path, **options)


def open_root(uri: str) -> Root:
    """The root for a checkpoint URI: `s3://bucket/prefix`, `file://...` or an absolute path."""
    return Root(open_store(uri))


def write_completed_marker(checkpoint_root: str, **fields: object) -> str:
    """`completion.write_completed_marker` for either kind of root (the same JSON, one object on S3)."""
    if not roots.is_object_store(checkpoint_root):
        return completion.write_completed_marker(checkpoint_root, **fields)
    root = open_root(checkpoint_root)
    body = json.dumps({"kind": completion.SUCCEEDED, **{k: str(v) for k, v in fields.items()}}).encode()
    root.put(completion.COMPLETED_MARKER_FILE, body)
    return root.join(completion.COMPLETED_MARKER_FILE)
