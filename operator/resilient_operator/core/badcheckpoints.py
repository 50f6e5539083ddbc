"""Checkpoints a trainer refused as corrupt (issue #27): recorded in status.badCheckpoints, announced once, never
injected as RTJ_RESUME_FROM again.

The operator never reads a shard (it checks sizes only). It learns that a checkpoint's bytes did not match the
checksums written with it from the trainer, in two ways:
- the termination message of one of the job's own pods: `refused_checkpoint=step-...[,step-...]` (tenant-written:
  `completion.refused_checkpoints` parses it bounded, names only, never a path);
- discovery: the trainer left `.rtj-corrupt` in the directory, so the completeness rule refused it with a
  `corrupt` verdict (a stat of that file, no read).
A recorded name is passed back to discovery (`refused`), which never offers it as the latest, and the launch
step holds a launch whose listing still names one (a discovery that ran before it was recorded). Pure: no I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from resilient_contract import completion
from resilient_contract.storage.listing import Verdict
from resilient_contract.storage.names import parse_step_dir
from resilient_operator import constants as c
from resilient_operator.core.model import PodView
from resilient_operator.core.status import BadCheckpoint, JobStatus


def names(status: Mapping[str, Any]) -> list[str]:
    """The step directory names status.badCheckpoints records (well-formed ones only, at most the limit)."""
    entries = status.get("badCheckpoints")
    if not isinstance(entries, list):
        return []
    out: list[str] = []
    for entry in entries[-c.BAD_CHECKPOINTS_LIMIT:]:
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and len(path) <= 4096:
            name = posixpath.basename(path)
            if parse_step_dir(name) is not None and name not in out:
                out.append(name)
    return out


def reported(pods: Sequence[PodView], job_uid: str, verdicts: Iterable[Verdict] = ()) -> list[str]:
    """Names the trainer refused: in the termination messages of the job's own pods (by owner uid, never labels)
    and in discovery's corrupt verdicts; in that order, each once."""
    found: list[str] = []
    for pod in pods:
        if pod.owner_uid != job_uid:
            continue
        for term in pod.terminations:
            found.extend(completion.refused_checkpoints(completion.parse_message(term.message)))
    for verdict in verdicts:
        if verdict.corrupt:
            found.append(posixpath.basename(verdict.path))
    return [n for i, n in enumerate(found) if parse_step_dir(n) is not None and n not in found[:i]]


def record(status: JobStatus, root: str, found: Sequence[str], ts: str) -> list[BadCheckpoint]:
    """Add the names not recorded yet (newest last, the oldest dropped past the limit); the entries added."""
    known = set(names(status))
    entries = [e for e in (status.get("badCheckpoints") or []) if isinstance(e, dict)]
    added: list[BadCheckpoint] = []
    for name in found:
        step = parse_step_dir(name)
        if step is None or name in known:
            continue
        known.add(name)
        entry: BadCheckpoint = {"path": posixpath.join(root, name) if root else name, "step": step, "time": ts}
        entries.append(entry)
        added.append(entry)
    if added:
        status["badCheckpoints"] = entries[-c.BAD_CHECKPOINTS_LIMIT:]
    return added


def refused(status: Mapping[str, Any], path: str | None) -> bool:
    """Whether `path` (a resume candidate) names a checkpoint recorded as corrupt."""
    return path is not None and posixpath.basename(path.rstrip("/")) in names(status)


def announcement(entry: BadCheckpoint) -> str:
    """The event for a newly recorded corrupt checkpoint: what happened and what to do."""
    return (f"{entry.get('path')} is corrupt: a trainer found bytes that do not match the checksums written with "
            "it and resumed from the previous complete checkpoint; it is never injected as RTJ_RESUME_FROM again "
            "(status.badCheckpoints). Check the storage behind the checkpoint root for errors (disk, network, "
            "object store), then delete that directory")
