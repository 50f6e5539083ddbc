"""The one scheme dispatch: which backend a checkpoint root URI names, and whether it lies in an area.

A root is an absolute path, `file://<path>` or `s3://bucket[/prefix]`; any other scheme is refused with a
reason. Area checks are lexical (no request, so no oracle) and happen before any storage is touched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from resilient_contract.storage import local, s3
from resilient_contract.storage.base import Store
from resilient_contract.storage.errors import REASON_INVALID_ROOT, REASON_ROOT_OUTSIDE_AREA, StorageError

FILE_SCHEME = "file://"


def is_object_store(uri: str) -> bool:
    """Whether `uri` names an object store (`s3://`) rather than a mounted path."""
    return uri.startswith(s3.SCHEME)


def local_path(uri: str) -> str:
    """The filesystem path of a local root (`/path` or `file:///path`); StorageError for anything else."""
    if "\x00" in uri:
        raise StorageError("checkpoint root contains a NUL byte", REASON_INVALID_ROOT)
    if uri.startswith(FILE_SCHEME):
        return uri[len(FILE_SCHEME) :]
    if "://" in uri:
        scheme = uri.split("://", 1)[0][:20]
        raise StorageError(f"checkpoint storage scheme {scheme}:// is not supported (use a mounted path or "
                           "s3://bucket/prefix)", REASON_INVALID_ROOT)  # fmt: skip
    return local.check_path(uri)


def s3_location(uri: str) -> s3.S3Location:
    """An `s3://` root parsed, or StorageError(InvalidCheckpointRoot) with the reason."""
    try:
        return s3.parse_uri(uri)
    except ValueError as exc:
        raise StorageError(str(exc), REASON_INVALID_ROOT) from None


def open_store(uri: str, creds: s3.S3Credentials | None = None, area: str | None = None) -> Store:
    """The store for a root URI. With `area` (the namespace's storage area) a root outside it is refused first;
    a local root is then opened as a directory fd with no symlink below the area. `creds` (an object store's
    keys) default to the standard AWS environment."""
    if is_object_store(uri):
        if area is not None:
            object_area(uri, [area])
        return s3.S3Store(s3_location(uri).uri, creds)
    path = local_path(uri)
    return local.LocalStore(path) if area is None else local.open_in_area(path, area)


def within_area(path: str, area: str) -> bool:
    """Lexically: is `path` the area or below it? (Decided before any filesystem access: no oracle.)"""
    area_parts = [p for p in area.split("/") if p]
    return [p for p in path.split("/") if p][: len(area_parts)] == area_parts


def object_area(uri: str, areas: Iterable[str]) -> str:
    """The object-store area (`s3://bucket[/prefix]`) of `areas` that holds the root `uri`, decided lexically
    (no request: no oracle); StorageError (invalid root, or outside every area) otherwise. The message names
    neither the areas nor anything that exists, so a tenant learns nothing about another's buckets."""
    loc = s3_location(uri)
    for area in areas:
        try:
            allowed = s3.parse_uri(area)
        except ValueError:
            continue
        if allowed.bucket == loc.bucket and within_area(loc.prefix, allowed.prefix):
            return area
    raise StorageError(f"checkpoint root {loc.uri} is not inside an object-store area this job's namespace may "
                       "use", REASON_ROOT_OUTSIDE_AREA)  # fmt: skip


def split(path: str) -> tuple[str, str]:
    """(root URI, step directory name) of a checkpoint path, for either kind of root."""
    if is_object_store(path):
        parent, _, name = path.rstrip("/").rpartition("/")
        return parent, name
    path = path[len(FILE_SCHEME) :] if path.startswith(FILE_SCHEME) else path
    path = os.path.normpath(path)
    return os.path.dirname(path), os.path.basename(path)
