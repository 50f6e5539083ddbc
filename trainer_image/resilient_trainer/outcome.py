"""Record how a worker ended, in the one form the launcher and the operator check.

    record_success(ctx, step=state.step, checkpoint_root=root)   # after the final save, on every rank
    record_preempted(ctx, step=state.step, checkpoint=path)      # after the SIGTERM save, on every rank

Only local rank 0 writes the pod's termination message (resilient_contract.completion), with
`attempt=$RTJ_ATTEMPT` (0 outside the operator): the launcher trusts a message only if its attempt is
the current one, so a stale message from an earlier container never turns a failure into a success.
Global rank 0 also leaves the `_RTJ_COMPLETED` marker in the checkpoint root on success. Outside a pod
with no `$RTJ_TERMINATION_LOG` nothing is written; a write error is a warning, never a failure.

`record_success` first waits for every save still in flight (each `Checkpointer` registers itself): success
is never claimed, and `_RTJ_COMPLETED` never written, before the last checkpoint is committed; a save
that failed raises instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from resilient_contract import completion, environment
from resilient_trainer import storage
from resilient_trainer.hooks import WeakHooks

if TYPE_CHECKING:  # torch-free at run time
    from resilient_trainer.dist import DistContext


_PENDING = WeakHooks()
# Fields every later message of this process carries (a corrupt checkpoint refused on resume: the operator
# reads `refused_checkpoint=` from whatever message the pod ends with).
_NOTES: dict[str, str] = {}


def register_pending(wait: Callable[[], object]) -> None:
    """A bound method that finishes (or raises for) work that must be done before success is claimed."""
    _PENDING.add(wait)


def finish_pending() -> None:
    """Wait for every registered save in flight; the first failure is raised."""
    for wait in _PENDING.live():
        wait()


def current_attempt() -> str:
    return os.environ.get(environment.ATTEMPT) or "0"


def _write(ctx: DistContext, kind: str, **fields: object) -> str | None:
    if ctx.local_rank != 0:
        return None
    fields = {**_NOTES, **fields}
    try:
        return completion.write_termination_message(kind, None, attempt=current_attempt(), **fields)
    except OSError as exc:
        print(f"warning: cannot write termination message: {exc}", file=sys.stderr, flush=True)
        return None


def record_refused_checkpoint(ctx: DistContext, refused: str, resumed_from: str | None) -> None:
    """A resume refused checkpoint directory `refused` (its bytes do not match its checksums) and fell back to
    `resumed_from` (None: nothing left to fall back to). Written at once (a later crash still names it), and
    every later message of this process names it too. Names only (`step-<digits>[.a<attempt>]`), no paths."""
    names = [n for n in _NOTES.get(completion.REFUSED_CHECKPOINT_FIELD, "").split(",") if n]
    if refused not in names:
        names.append(refused)
    _NOTES[completion.REFUSED_CHECKPOINT_FIELD] = ",".join(names[-completion.MAX_REFUSED_NAMED:])
    _write(ctx, completion.CHECKPOINT_REFUSED, resumed_from=resumed_from or "none")


def record_success(ctx: DistContext, *, step: int, checkpoint_root: str | None = None, **fields: object) -> None:
    """Call on every rank once all ranks finished (e.g. after a barrier) and the final save is done.
    A save still in flight is waited for first; if it failed, this raises and records nothing."""
    finish_pending()
    if ctx.rank == 0 and checkpoint_root:
        storage.write_completed_marker(checkpoint_root, step=step, world_size=ctx.world_size)
    _write(ctx, completion.SUCCEEDED, step=step, world_size=ctx.world_size, **fields)


def record_preempted(ctx: DistContext, *, step: int, checkpoint: str, **fields: object) -> None:
    """Call after the blocking save that SIGTERM asked for; then exit (143 is what the launcher uses).

    Further SIGTERMs are ignored from here on: the save is done, and CPython restores the default action of
    Python-handled signals while it shuts down, so a late SIGTERM (this rank's own, after a peer's stopped the
    gang) would turn the exit 143 into death by signal."""
    _write(ctx, completion.PREEMPTED, step=step, checkpoint=checkpoint, world_size=ctx.world_size, **fields)
    with contextlib.suppress(ValueError):  # signal.signal works on the main thread only
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
