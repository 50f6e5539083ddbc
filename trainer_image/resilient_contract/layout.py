"""The names the operator's core and older callers import from here; the code lives in `resilient_contract.storage`.

New code imports the storage modules directly: `storage.names` (step directory names), `storage.errors`
(`REASON_*`, the errors), `storage.listing` (`Listing`, `Verdict`), `storage.completeness` (the rule),
`storage.scan` (discovery) and `storage.roots` (the scheme dispatch).
"""

from __future__ import annotations

from resilient_contract.storage.base import StoreReader
from resilient_contract.storage.completeness import _PARSED, MAX_SHARD_FILES, check_step
from resilient_contract.storage.errors import (
    REASON_DISCOVERY_BUSY,
    REASON_DISCOVERY_FAILED,
    REASON_DISCOVERY_TIMED_OUT,
    REASON_INVALID_ROOT,
    REASON_ROOT_MISSING,
    REASON_ROOT_OUTSIDE_AREA,
    REASON_ROOT_SYMLINK,
    REASON_STORAGE_UNREADABLE,
    RootMissing,
    StorageError,
    StoreUnavailable,
    UnsafeEntry,
)
from resilient_contract.storage.listing import Listing, Verdict
from resilient_contract.storage.local import LocalStore
from resilient_contract.storage.names import (
    METADATA_FILE,
    STEP_DIGITS,
    STEP_DIR_PREFIX,
    parse_step_dir,
    step_dir_attempt,
    step_dir_name,
)
from resilient_contract.storage.roots import object_area, open_store, within_area
from resilient_contract.storage.scan import (
    DEFAULT_SCAN,
    UNBOUNDED_SCAN,
    ScanLimits,
    discover,
    newest_step_entries,
    read_lineage,
    scan,
    step_dirs,
)

CheckpointStore = StoreReader  # the read half's former name

__all__ = [
    "DEFAULT_SCAN", "MAX_SHARD_FILES", "METADATA_FILE", "REASON_DISCOVERY_BUSY", "REASON_DISCOVERY_FAILED",
    "REASON_DISCOVERY_TIMED_OUT", "REASON_INVALID_ROOT", "REASON_ROOT_MISSING", "REASON_ROOT_OUTSIDE_AREA",
    "REASON_ROOT_SYMLINK", "REASON_STORAGE_UNREADABLE", "STEP_DIGITS", "STEP_DIR_PREFIX", "UNBOUNDED_SCAN",
    "_PARSED", "CheckpointStore", "Listing", "LocalStore", "RootMissing", "ScanLimits", "StorageError",
    "StoreUnavailable", "UnsafeEntry", "Verdict", "check_step", "discover", "latest_complete", "newest_step_entries",
    "object_area", "open_root", "open_store", "parse_step_dir", "read_lineage", "scan", "scan_newest_first",
    "step_dir_attempt", "step_dir_name", "step_dirs", "within_area",
]  # fmt: skip


def open_root(uri: str, area: str) -> StoreReader:
    """A local root opened inside its namespace's area (see `storage.roots.open_store`)."""
    return open_store(uri, area=area)


def latest_complete(store: StoreReader) -> Verdict | None:
    """The newest complete checkpoint (no scan limit). Kept for tests and e2e helpers not yet switched to
    `storage.scan.scan(store, UNBOUNDED_SCAN).latest`; product code does not use it."""
    return scan(store, UNBOUNDED_SCAN).latest


def scan_newest_first(store: StoreReader) -> list[Verdict]:
    """Every step directory's verdict, newest first. Kept for e2e's retention check only (see above)."""
    entries, _ = newest_step_entries(store, None)
    return [check_step(store, name) if kind != "symlink" else
            Verdict(step, store.join(name), False, "the step directory is a symlink (not followed)")
            for step, name, kind in entries]  # fmt: skip
