"""Names in a checkpoint root: `step-<10-digit step>[.a<attempt>]/` directories holding DCP shards and `.metadata`.

No imports from the rest of the package: the operator's core reads these names, and every backend checks a
relative path with `unsafe_parts`, written once here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

METADATA_FILE = ".metadata"
# Per-shard checksums of a save (resilient_trainer.integrity): committed before `.metadata`, verified by the
# trainer while it loads. A step directory without one (written before checksums existed) still loads.
MANIFEST_FILE = ".rtj-checksums"
# Left in a step directory by the trainer that found its bytes do not match the manifest: the completeness rule
# refuses it from then on (a stat, never a read of a shard), so no resume is pointed at it again.
CORRUPT_FILE = ".rtj-corrupt"
STEP_DIR_PREFIX = "step-"
STEP_DIGITS = 10
# `step-<10 digits>`, or `step-<10 digits>.a<attempt>` when another attempt already held the plain name
# (see lineage.py: no directory is ever shared by two attempts).
_STEP_DIR_RE = re.compile(rf"^{STEP_DIR_PREFIX}([0-9]{{{STEP_DIGITS}}})(?:\.a([0-9]{{1,9}}))?$", re.ASCII)
TRASH_PREFIX = ".trash-"  # a step directory being deleted on a filesystem: out of the `step-*` namespace


def step_dir_name(step: int, attempt: int | None = None) -> str:
    """`step-0000001200` (fixed width so names sort in step order); `step-0000001200.a3` for attempt 3's save
    of a step whose plain name another attempt already holds."""
    if step < 0 or step >= 10**STEP_DIGITS:
        raise ValueError(f"step {step} does not fit the {STEP_DIGITS}-digit layout")
    base = f"{STEP_DIR_PREFIX}{step:0{STEP_DIGITS}d}"
    return base if attempt is None else f"{base}.a{attempt}"


def step_dir_attempt(name: str) -> int | None:
    """The attempt a `step-<digits>.a<attempt>` name is reserved for; None for a plain name."""
    match = _STEP_DIR_RE.match(name)
    return int(match.group(2)) if match and match.group(2) else None


def parse_step_dir(name: str) -> int | None:
    """The step a directory name stands for, or None if the name is not a checkpoint directory."""
    match = _STEP_DIR_RE.match(name)
    return int(match.group(1)) if match else None


def unsafe_parts(parts: Sequence[str]) -> bool:
    """Whether path segments could leave the root or mean something else: empty, `.`, `..` or a NUL byte."""
    return any(p in ("", ".", "..") or "\x00" in p for p in parts)
