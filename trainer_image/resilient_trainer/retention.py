"""Retention: keep the last K complete checkpoints, and never lose the one a restart needs.

Rules (checked with `layout.check_step`, the one completeness rule):
- never delete the newest complete checkpoint, nor the one this attempt resumed from;
- delete nothing unless a newer complete checkpoint exists (so a crashed save never costs the last
  good one);
- incomplete directories are removed only when older than the newest complete one (a newer incomplete
  one may be a save still in flight, or the partial save that the next save of that step replaces).
Deletion renames the directory out of the `step-*` namespace first, so a half-deleted checkpoint
never looks like one. Torch-free.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass

from resilient_contract import layout, lineage

TRASH_PREFIX = ".trash-"


@dataclass(frozen=True)
class Plan:
    keep: tuple[str, ...]
    delete: tuple[str, ...]


def plan(store: layout.CheckpointStore, keep_last: int, protect: tuple[str, ...] = (),
         rule: lineage.Lineage | None = None) -> Plan:
    """Which step directories to delete; `protect` holds directory names (e.g. the resumed-from one).
    With `rule` (the job's lineage), a checkpoint a fenced gang committed does not count as complete."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1: the newest complete checkpoint is always kept")
    dirs = layout.step_dirs(store)
    verdicts = {name: layout.check_step(store, name, rule=rule) for _, name in dirs}
    complete = [name for _, name in dirs if verdicts[name].complete]
    if not complete:
        return Plan(tuple(name for _, name in dirs), ())
    newest_step = verdicts[complete[-1]].step
    kept_complete = set(complete[-keep_last:])
    delete = []
    for step, name in dirs:
        if name in protect or name in kept_complete or step >= newest_step:
            continue
        delete.append(name)
    keep = tuple(name for _, name in dirs if name not in delete)
    return Plan(keep, tuple(delete))


def remove_step_dir(root: str, name: str) -> None:
    """Rename out of the step namespace (atomic), then delete the contents."""
    src = os.path.join(root, name)
    trash = os.path.join(root, f"{TRASH_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(src, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def apply(root: str, keep_last: int, protect: tuple[str, ...] = (), job: str | None = None) -> Plan:
    """Plan and delete on a local root (call on one rank only). `job`: judge by that job's lineage."""
    store = layout.open_store(root)
    if not isinstance(store, layout.LocalStore):
        raise layout.StorageError(f"retention supports mounted roots only, not {root}")
    rule = lineage.Lineage.merge(job, layout.read_lineage(store, job)) if job else None
    result = plan(store, keep_last, protect, rule)
    for name in result.delete:
        remove_step_dir(store.root, name)
    for entry in os.listdir(store.root):
        if entry.startswith(TRASH_PREFIX):  # leftovers of a deletion interrupted by a crash
            shutil.rmtree(os.path.join(store.root, entry), ignore_errors=True)
    return result
