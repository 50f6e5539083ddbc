"""Retention: keep the last K complete checkpoints, and never lose the one a restart needs.

Rules (checked with `completeness.check_step`, the one completeness rule):
- never delete the newest complete checkpoint, nor the one this attempt resumed from;
- delete nothing unless a newer complete checkpoint exists (so a crashed save never costs the last
  good one);
- incomplete directories are removed only when older than the newest complete one (a newer incomplete
  one may be a save still in flight, or the partial save that the next save of that step replaces).
Deletion never leaves a half-deleted checkpoint that looks complete (`Store.remove_step`: a filesystem
renames the directory out of the `step-*` namespace first; `s3://` deletes `.metadata` first). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from resilient_contract import lineage
from resilient_contract.storage import StoreReader, check_step, read_lineage, step_dirs
from resilient_contract.storage.names import TRASH_PREFIX
from resilient_trainer import storage

__all__ = ["TRASH_PREFIX", "Plan", "apply", "plan"]


@dataclass(frozen=True)
class Plan:
    keep: tuple[str, ...]
    delete: tuple[str, ...]


def plan(store: StoreReader, keep_last: int, protect: tuple[str, ...] = (),
         rule: lineage.Lineage | None = None) -> Plan:
    """Which step directories to delete; `protect` holds directory names (e.g. the resumed-from one).
    With `rule` (the job's lineage), a checkpoint a fenced gang committed does not count as complete."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1: the newest complete checkpoint is always kept")
    dirs = step_dirs(store)
    verdicts = {name: check_step(store, name, rule=rule) for _, name in dirs}
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


def apply(root: str | storage.Root, keep_last: int, protect: tuple[str, ...] = (), job: str | None = None) -> Plan:
    """Plan and delete on a mounted or `s3://` root (call on one rank only). `job`: judge by that job's lineage."""
    target = storage.open_root(root) if isinstance(root, str) else root
    store = target.store()
    rule = lineage.Lineage.merge(job, read_lineage(store, job)) if job else None
    result = plan(store, keep_last, protect, rule)
    for name in result.delete:
        target.remove_step(name)
    target.cleanup()
    return result
