"""Where a save's upload runs: a thread of the training process, or a per-rank checkpoint-writer process.

In a thread, the upload's Python work (planning, one serialisation per tensor, writes, fsync) competes
with the training thread for the GIL. In a writer process it does not: the training process only stages
into shared memory (`staging.ReusingStager(share=True)`) and hands the buffers over by handle.

The writer is DCP's PROCESS-mode helper (its own gloo group, one request at a time) with three changes:
- It is spawned with the entry module hidden (`hidden_main`): spawn would otherwise re-run the user's
  script in the helper (`python train.py` without an `if __name__ == "__main__":` guard trains again).
- It dies with its training process (PR_SET_PDEATHSIG, as the launcher's workers do), so it never finishes
  and commits a save for a rank that is gone; it is bounded in memory to the staged buffers (shared, not
  copied) plus one tensor's serialisation at a time.
- The first save does not wait for it to start: the spawn returns at once and its readiness is awaited
  in the upload thread. A dead writer fails that save and every later one (its gloo group is broken):
  the run exits and is restarted from the last complete checkpoint.
The storage writer crosses to it by pickle, so the guards (fence before `.metadata`, no save without its
process group, all W results before the commit) are a picklable `GuardedWriter`, not closures.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint import StorageWriter
from torch.distributed.checkpoint import _async_process_executor as dcp_process

from resilient_contract import lineage
from resilient_contract.storage import RootMissing, read_lineage
from resilient_trainer import integrity, storage

log = logging.getLogger(__name__)


class UploadError(RuntimeError):
    """The writer process is gone or refused; the message says why."""


class FenceRefused(RuntimeError):
    """A newer attempt started while this save was written (picklable: it may cross from the writer)."""

    def __init__(self, path: str, newer: int) -> None:
        super().__init__(f"not committing {path}: attempt {newer} of this job has started")
        self.path, self.newer = path, newer

    def __reduce__(self) -> tuple[Any, ...]:
        return (FenceRefused, (self.path, self.newer))


@dataclass
class Fence:
    """The fencing check a save repeats before `.metadata` (see resilient_contract.lineage); picklable."""

    root: str
    job: str
    attempt: int
    _storage: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "job": self.job, "attempt": self.attempt, "_storage": None}

    def storage(self) -> storage.Root:
        if self._storage is None:
            self._storage = storage.open_root(self.root)
        return self._storage

    def newer_attempt(self) -> int | None:
        """The newest attempt of this job that marked the root after ours, or None."""
        try:
            marks = read_lineage(self.storage().store(), self.job)
        except RootMissing:
            return None  # an object store before anything was written: no mark at all
        newest = max((attempt for attempt, _ in marks), default=0)
        return newest if newest > self.attempt else None

    def refuse(self, path: str, newer: int) -> FenceRefused:
        with contextlib.suppress(OSError):  # evidence only
            self.storage().put(f"{storage.split(path)[1]}/{lineage.REFUSED_FILE}",
                               lineage.format_writer(self.job, self.attempt))
        return FenceRefused(path, newer)


class GuardedWriter(StorageWriter):
    """A storage writer with the save's guards, delegating everything else; picklable when `inner` is."""

    def __init__(self, inner: StorageWriter, path: str, world: int, fence: Fence | None = None,
                 hold: str | None = None) -> None:
        self.inner, self.path, self.world, self.fence, self.hold = inner, path, world, fence, hold

    def __getattr__(self, name: str) -> Any:  # checkpoint_id, storage_meta, ... of the real writer
        if name.startswith("__") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _require_group(self) -> None:
        if self.world > 1 and not (dist.is_available() and dist.is_initialized()):
            raise UploadError(
                f"refusing to write {self.path}: the process group of this {self.world}-rank run is gone (shut "
                "down while the save was in flight?); finish saves first: ckpt.close() (rdist.shutdown() does "
                "it) before dist.destroy_process_group()")

    def reset(self, checkpoint_id: Any = None) -> None:
        self.inner.reset(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # never picked by DCP's writer auto-detection

    def set_up_storage_writer(self, *args: Any, **kwargs: Any) -> Any:
        self._require_group()
        return self.inner.set_up_storage_writer(*args, **kwargs)

    def prepare_local_plan(self, plan: Any) -> Any:
        return self.inner.prepare_local_plan(plan)

    def prepare_global_plan(self, plans: Any) -> Any:
        return self.inner.prepare_global_plan(plans)

    def write_data(self, plan: Any, planner: Any) -> Any:
        """The inner writer's write, with this rank's checksums (summed while written, see `integrity`) appended
        to its results for rank 0's manifest; `finish` takes them out again before DCP's own commit."""
        fs = integrity.summing_fs(self.inner)
        written = self.inner.write_data(plan, planner)
        if fs is None:
            return written

        def with_sums(done: Any) -> list[Any]:
            results = list(done.value())
            sums = integrity.ShardSums(fs.algorithm, fs.take(integrity.relative_paths(results)))
            return [*results, sums]

        return written.then(with_sums)

    def storage_meta(self) -> Any:
        return self.inner.storage_meta()

    def finish(self, metadata: Any, results: list[Any]) -> None:
        """Rank 0 commits the checksum manifest, then `.metadata`: only with its group, all W ranks' results
        (and checksums), and no newer attempt."""
        self._require_group()
        if len(results) != self.world:
            raise UploadError(f"refusing to commit {self.path}: write results from {len(results)} of "
                              f"{self.world} ranks")
        results, sums = integrity.split_results(results)
        present = [s for s in sums if s is not None]
        if present and len(present) != len(sums):
            raise UploadError(f"refusing to commit {self.path}: checksums from {len(present)} of {len(sums)} ranks")
        if present:  # durable before `.metadata` exists: a complete checkpoint always has its checksums
            # on the root, also when the shards were written to a local tier first (tiered.TieredWriter)
            target = getattr(self.inner, "commit_writer", self.inner)
            integrity.write_manifest(target, integrity.manifest_bytes(present))
        while self.hold and not os.path.exists(self.hold):  # test-only: a rank 0 stalled right here
            time.sleep(0.1)
        if self.fence is not None and (newer := self.fence.newer_attempt()) is not None:
            raise self.fence.refuse(self.path, newer)
        self.inner.finish(metadata, results)


@contextlib.contextmanager
def hidden_main() -> Iterator[None]:
    """Spawn without re-running the entry module: multiprocessing's spawn re-imports `__main__` by its
    `__spec__` name or `__file__` (runpy's module included); with neither, the child imports nothing."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {n: main.__dict__[n] for n in ("__file__", "__spec__") if n in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _writer_main(pg_init_info: Any, conn: Any, parent: int, niceness: int) -> None:
    """The writer process: die with the training process, lower its priority, then serve DCP's requests."""
    from resilient_trainer.worker import die_with_parent

    die_with_parent(parent)
    if niceness > 0:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
    dcp_process._AsyncCheckpointProcess._checkpointing_subprocess(pg_init_info, conn)


class WriterProcess(dcp_process._AsyncCheckpointProcess):
    """DCP's checkpoint helper process, spawned with the entry module hidden and without waiting for it."""

    def __init__(self, pg_init_info: Any, niceness: int = 0) -> None:  # deliberately not super().__init__
        self.ctx = mp.get_context("spawn")
        self._process_pipe, child_end = self.ctx.Pipe()
        self._save_process = self.ctx.Process(
            target=_writer_main, args=(pg_init_info, child_end, os.getpid(), niceness), daemon=True,
            name="rtj-checkpoint-writer")
        with hidden_main():
            self._save_process.start()
        child_end.close()  # the writer's recv() fails fast when we die
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self._save_process.pid

    def alive(self) -> bool:
        return self._save_process.is_alive()

    def save(self, staged_state_dict: Any, **kwargs: Any) -> Any:
        if not self._ready:  # in the upload thread: the loop never waits for the writer to start
            response = self._wait_for_response(timeout=1800)
            if response != dcp_process._CheckpointSaveProcessControlOpts.INIT_COMPLETE:
                raise UploadError(f"checkpoint writer process failed to start: {response!r}")
            self._ready = True
        return super().save(staged_state_dict, **kwargs)


def writer_process(group: dist.ProcessGroup | None, niceness: int = 0) -> WriterProcess:
    """This rank's writer process, started on first use (a collective over `group`: all ranks call it).
    UploadError once it died: its gloo group is broken, so this run cannot save any more."""
    current = dcp_process._CHECKPOINT_PROCESS
    if isinstance(current, WriterProcess):
        if not current.alive():
            raise UploadError(f"the checkpoint writer process (pid {current.pid}) died "
                              f"(exit code {current._save_process.exitcode}); this run cannot save any more")
        return current
    if current is not None:
        raise UploadError("a DCP checkpoint process not started by resilient_trainer is running")
    process = WriterProcess(dcp_process._ProcessGroupInitInfo(group), niceness)
    dcp_process._CHECKPOINT_PROCESS = process
    return process


def stop_writer_process() -> None:
    """Ask the writer to exit (tests, the benchmark); the next process save starts a new one."""
    current = dcp_process._CHECKPOINT_PROCESS
    dcp_process._CHECKPOINT_PROCESS = None
    if current is not None:
        current.__del__()
