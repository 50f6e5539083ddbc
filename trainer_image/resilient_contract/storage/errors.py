"""Why a checkpoint root could not be read: the `Listing.reason` words and the errors every backend raises.

No imports from the rest of the package: the operator's core matches on the `REASON_*` words.
"""

from __future__ import annotations

import errno

# Listing.reason: why discovery could not say which checkpoint is the latest (for a condition's reason).
REASON_ROOT_MISSING = "CheckpointRootMissing"
REASON_STORAGE_UNREADABLE = "StorageUnreadable"
REASON_INVALID_ROOT = "InvalidCheckpointRoot"
REASON_ROOT_OUTSIDE_AREA = "RootOutsideNamespaceArea"
REASON_ROOT_SYMLINK = "CheckpointRootSymlink"
REASON_DISCOVERY_TIMED_OUT = "DiscoveryTimedOut"
REASON_DISCOVERY_FAILED = "DiscoveryFailed"
# The operator's discovery workers were all busy, or one was still starting: nothing is known about the root
# (it is not blamed, not held back), and discovery is simply tried again soon.
REASON_DISCOVERY_BUSY = "DiscoveryBusy"


class StorageError(OSError):
    """The checkpoint root cannot be read (permission denied, unsupported scheme, not a directory)."""

    reason = REASON_STORAGE_UNREADABLE

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason:
            self.reason = reason


class RootMissing(StorageError):
    """The checkpoint root does not exist: normal before the first save, alarming after one."""

    reason = REASON_ROOT_MISSING


class StoreUnavailable(StorageError):
    """The store itself failed (an object store's endpoint, bucket or keys), not one entry: the whole discovery
    is an error to retry, never a skipped checkpoint (that would resume from an older one)."""


class UnsafeEntry(StorageError):
    """An entry below the root that is not followed or read: a symlink, FIFO, socket, device, oversize file."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def errno_name(exc: OSError) -> str:
    """`ENOENT`-style words for an OSError (never its message, which may name a path outside the root)."""
    return errno.errorcode.get(exc.errno or 0, "error")
