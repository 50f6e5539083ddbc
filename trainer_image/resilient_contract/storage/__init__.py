"""Checkpoint storage: one `Store` seam (base), two independent backends (local, s3), one scheme dispatch
(roots), the completeness rule (completeness) and discovery's scan (scan) over it; names, errors and the
`Listing` in small modules the operator's core may import. Torch-free and kopf-free.

    store = open_store("s3://bucket/prefix")    # or "/mnt/ckpt", "file:///mnt/ckpt"
    listing = discover("/mnt/ckpt/job", area="/mnt/ckpt")
"""

from __future__ import annotations

from resilient_contract.storage.base import Entry, Kind, Store, StoreReader, StoreWriter
from resilient_contract.storage.completeness import check_step
from resilient_contract.storage.errors import RootMissing, StorageError, StoreUnavailable, UnsafeEntry
from resilient_contract.storage.listing import Listing, Verdict
from resilient_contract.storage.local import LocalStore
from resilient_contract.storage.names import METADATA_FILE, parse_step_dir, step_dir_attempt, step_dir_name
from resilient_contract.storage.roots import is_object_store, open_store, split
from resilient_contract.storage.scan import (
    DEFAULT_SCAN,
    UNBOUNDED_SCAN,
    ScanLimits,
    discover,
    read_lineage,
    scan,
    step_dirs,
)

__all__ = [
    "DEFAULT_SCAN", "METADATA_FILE", "UNBOUNDED_SCAN", "Entry", "Kind", "Listing", "LocalStore", "RootMissing",
    "ScanLimits", "StorageError", "Store", "StoreReader", "StoreUnavailable", "StoreWriter", "UnsafeEntry",
    "Verdict", "check_step", "discover", "is_object_store", "open_store", "parse_step_dir", "read_lineage",
    "scan", "split", "step_dir_attempt", "step_dir_name", "step_dirs"
]  # fmt: skip
