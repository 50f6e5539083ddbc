"""DCP checkpoints that reshard on load and cost the training loop only the staging copy.

    ckpt = Checkpointer(root, model, optimizer, ctx=dist_ctx, scheduler=sched, train_state=ts)
    resumed = ckpt.resume()              # loads $RTJ_RESUME_FROM (any world size) or returns None
    ckpt.save(step)                      # async: stage to CPU, upload in a thread/process; <=1 in flight
    ckpt.save(step, blocking=True)       # e.g. on SIGTERM
    ckpt.close()                         # waits for the last upload

Design choices and the traps they avoid:
- Every save goes into a directory it created itself (`mkdir`, never reused across attempts; on `s3://`
  a prefix claimed by a conditional PUT of its writer token, see `storage`), with a writer token
  (`.rtj-writer`: attempt and job) before any shard. Under the operator, each attempt first
  leaves a fence mark in the root (`_RTJ_ATTEMPT-<job>-<attempt>`: where it started); a save finds a newer
  attempt's mark -> `FencedError`, checked when the directory is made and again just before `.metadata` is
  committed. When another attempt holds `step-<N>` (a cut-off gang of an older attempt, or the attempt
  before), the save goes to `step-<N>.a<attempt>`; a complete directory of this attempt for the same step
  is kept and the save skipped. The rule discovery applies is in `resilient_contract.lineage`.
- The root is a mounted path or `s3://bucket/prefix` (`storage.open_root`): DCP's FileSystemWriter/Reader
  or FsspecWriter/Reader over s3fs, with credentials and endpoint from the standard AWS environment.
- `upload_in="thread"` uploads in a thread of the training process; `upload_in="process"` in a
  per-rank writer process fed through shared memory (`upload`: DCP's PROCESS helper spawned with the entry
  module hidden, so a script without a `__main__` guard is not re-run; it dies with its trainer). The
  writer's guards (fence, group, all W results) are a picklable `upload.GuardedWriter`. The default,
  `"auto"`, is the process on CUDA and the thread on CPU (`upload_mode`): on an H200 the in-process upload
  cost the loop 1.6 s per 1 GB save against 0.045 s for the writer process; on a CPU-only host the writer
  competes with the training step for the same cores and was no cheaper (README, "What a save costs").
- Staging options are picked per device: on CPU, non-blocking copies assert on an accelerator and
  pinned/shared memory buys nothing, so only background staging is on; on CUDA, pinned memory +
  non-blocking copies on a side stream. Staging runs in the background, overlapping the next forward/
  backward; an optimizer step pre-hook waits for it, so parameters are never modified while being
  copied (anything else that mutates model/optimizer state must call `wait_staged()` first). The
  stager is kept across saves so its buffers are reused.
- `CheckpointException` derives from BaseException, so it is caught by name and re-raised as
  `CheckpointError` (an Exception) naming the directory.
- Resume loads the *sharded* state dict on every rank (DCP reshards N->M); it never uses
  `broadcast_from_rank0` with empty dicts on non-zero ranks, which deadlocks.
- Content integrity (`integrity`): every shard item is checksummed while it is written, rank 0 commits the
  manifest before `.metadata`, and every byte loaded is verified against it. A checkpoint whose bytes do not
  match is refused: `resume()` marks it corrupt (`names.CORRUPT_FILE`, so the completeness rule, discovery
  and the operator never offer it again), logs it, names it in the termination message
  (`RTJ_CHECKPOINT_REFUSED refused_checkpoint=<dir>`, then on every later message), and loads the previous
  complete checkpoint instead. Checkpoints without a manifest (older than checksums) load unverified.
- Save/load collectives run on `ctx.checkpoint_group`, a gloo group separate from training's.
- `upload_niceness` (off by default) renices the upload thread (Linux nice is per thread). Measured
  on 2 shared cores (bench/checkpoint_bench.py): it makes the loop's cost per save *worse* (0.83 ->
  3.46 s, the upload 1.5 -> 8.1 s): a niced thread that holds the GIL when it is preempted stalls the
  training thread (priority inversion), and the stretched upload slows every step it overlaps. Kept as
  an option for hosts where that measures differently.
- The constructor refuses a model that averages gradients across ranks (parallel.check_reductions):
  the constant-global-batch contract needs sums, and the error is otherwise silent.
- A resume whose checkpoint recorded another global batch than `train_state.global_batch` is refused
  unless `allow_global_batch_change=True`; then training continues from the recorded global sample
  position with the new batch size.
- A resume point was injected (`$RTJ_RESUME_FROM`: the operator, or the launcher's `--resume latest`) but
  never loaded: the first save is refused (`ResumeNotLoadedError`), since training from step 0 again over
  the same root silently forks the run. Call `ckpt.resume()` before the loop.
- `extra={"scaler": scaler, ...}`: any object with `state_dict()`/`load_state_dict()` (a GradScaler, an
  object holding the best validation loss) is saved and loaded with the checkpoint. Its state must be the
  same on every rank (DCP keeps one copy of a replicated value); tensors in it may be DTensors, which
  reshard like the model.
- No save runs without its process group: `rdist.shutdown()` finishes the save in flight first (every
  Checkpointer registers with it), and the writer refuses to start when W > 1 but torch.distributed is
  gone (DCP would otherwise fall back to one process per rank, each writing the same file names into one
  directory), and rank 0 refuses to commit `.metadata` unless all W ranks' write results reached it.
  `outcome.record_success` waits for the save in flight, so the success marker never precedes it.
- Retention (listing the root, deleting old checkpoints) starts on rank 0 as soon as an async save's
  `.metadata` is committed (a done-callback of the upload), on a one-thread executor (one pass at a time),
  never on the training thread and never at the next `save()`; `close()` waits for it. After a blocking
  save it runs inline (the loop waits anyway).
- Staging copies with `Tensor.copy_` (the GIL released) into buffers reused across saves
  (`staging.ReusingStager`): DCP's DefaultStager's `UntypedStorage.copy_` holds the GIL for the memcpy.
- Two tiers (`tiered`), when `$RTJ_LOCAL_CHECKPOINT_DIR` (or `local_dir=`) names a node-local directory: the
  shards are written there first and uploaded to the root by the upload (thread or writer process), and
  `.metadata` is committed on the root only after every rank's shards landed there. Once committed, each rank
  keeps that local copy (and removes its older one), so a recovery in place loads shards from it, each
  verified against the root's manifest (a local copy that does not verify is re-read from the root).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import StorageWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from resilient_contract import environment, lineage
from resilient_contract.storage import StorageError, check_step, parse_step_dir, read_lineage, step_dir_name, step_dirs
from resilient_contract.storage.names import CORRUPT_FILE
from resilient_trainer import dist as rdist
from resilient_trainer import integrity, outcome, parallel, retention, staging, storage, tiered, upload
from resilient_trainer.dist import DistContext
from resilient_trainer.state import TrainState

log = logging.getLogger(__name__)
# Test-only: rank 0 waits before committing `.metadata` until this file exists (reproduces a partition that
# catches rank 0 between its peers' shards and the commit). Never set in production.
TEST_HOLD_METADATA_ENV = "RTJ_TEST_HOLD_METADATA"

WriterFactory = Callable[[str], StorageWriter]
DEFAULT_UPLOAD_NICENESS = 0  # off: renicing a GIL-holding thread measured worse (see the module docstring)


class CheckpointError(RuntimeError):
    """A save or load failed; the message names the checkpoint directory."""


class FencedError(CheckpointError):
    """A newer attempt of this job started: this (cut-off) gang must not save anything any more."""

    def __init__(self, path: str, attempt: int, newer: int) -> None:
        super().__init__(f"not saving {path}: attempt {newer} of this job has started, so attempt {attempt} "
                         "was fenced (its node was lost or cut off); this gang should stop")
        self.attempt, self.newer = attempt, newer


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's bytes do not match its checksum manifest (or it was marked corrupt before)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"cannot resume from checkpoint {path}: its content is corrupt: {detail}")
        self.path, self.detail = path, detail


MAX_FALLBACKS = 8  # corrupt checkpoints one resume refuses before it gives up


class ResumeNotLoadedError(CheckpointError):
    """A resume point was injected ($RTJ_RESUME_FROM) but the script saved without loading it."""


FENCED_PREFIX = "fenced:"  # a rank-0 decision broadcast to every rank: "fenced:<newer attempt>"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CheckpointException):
        failures = {r: (e[0] if isinstance(e, tuple) and e else e) for r, e in exc.failures.items()}
        parts = [f"rank {r}: {type(e).__name__}: {e}" for r, e in sorted(failures.items())]
        return "; ".join(parts) or str(exc)
    return f"{type(exc).__name__}: {exc}"


def upload_mode(upload_in: str, device: torch.device) -> str:
    """'thread' or 'process' for `Checkpointer(upload_in=...)`; "auto" picks the process on CUDA only."""
    if upload_in == "auto":
        return "process" if device.type == "cuda" else "thread"
    if upload_in not in ("thread", "process"):
        raise ValueError(f"Checkpointer(upload_in={upload_in!r}): 'auto', 'thread' or 'process'")
    return upload_in


class Checkpointer:
    """Save/resume model, optimizer, scheduler and TrainState under one checkpoint root."""

    def __init__(
        self,
        root: str,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        ctx: DistContext,
        scheduler: Any | None = None,
        train_state: TrainState | None = None,
        keep_last: int | None = None,
        async_save: bool = True,
        writer_factory: WriterFactory | None = None,
        upload_niceness: int = DEFAULT_UPLOAD_NICENESS,
        check_reductions: bool = True,
        allow_global_batch_change: bool = False,
        extra: dict[str, Any] | None = None,
        upload_in: str = "auto",
        local_dir: str | None = None,
    ) -> None:
        rdist.require_context(ctx, "Checkpointer")
        upload_in = upload_mode(upload_in, ctx.device)
        for name, obj in (extra or {}).items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"Checkpointer(extra={{{name!r}: ...}}): {type(obj).__qualname__} has no "
                                "state_dict()/load_state_dict()")
        if check_reductions:
            parallel.check_reductions(model)
        try:
            self.storage = storage.open_root(root)
        except StorageError as exc:
            raise CheckpointError(f"checkpoint root {root[:200]}: {exc}") from None
        self.root = self.storage.uri
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_state = train_state if train_state is not None else TrainState()
        self.ctx = ctx
        # None: the job's spec.checkpoint.keep, which the operator injects (RTJ_CHECKPOINT_KEEP).
        self.keep_last = environment.checkpoint_keep() if keep_last is None else keep_last
        self.async_save = async_save
        self.upload_niceness = upload_niceness
        self.allow_global_batch_change = allow_global_batch_change
        self.writer_factory = writer_factory or self.storage.writer
        # None: the node-local tier the operator mounted ($RTJ_LOCAL_CHECKPOINT_DIR), if any (see `tiered`)
        self.local_dir = local_dir or environment.local_checkpoint_dir()
        if self.local_dir and tiered.overlap(self.local_dir, self.root):
            raise CheckpointError(f"the local checkpoint directory {self.local_dir} overlaps the checkpoint root "
                                  f"{self.root}: it must be a node-local directory of its own "
                                  f"(${environment.LOCAL_CHECKPOINT_DIR})")
        self.extra = dict(extra or {})
        self.resumed_from: str | None = None
        # What the launcher or the operator asked this run to resume from; a save before loading it is refused.
        self.injected_resume = environment.resume_from()
        identity = environment.attempt_and_job()
        # Fencing tokens only under the operator (RTJ_ATTEMPT); a local run has no newer attempt to yield to.
        self.attempt = identity[0] if identity else None
        self.job = lineage.job_id(identity[1] if identity else None)
        self._fence = upload.Fence(self.root, self.job, self.attempt) if self.attempt is not None else None
        self.upload_in = upload_in
        self.last_blocked_s = 0.0
        # Where the last save() call's time went, in seconds: "wait" (the previous upload), "dir" (the step
        # directory's claim, the fence check and the broadcast of rank 0's decision), "state_dict"
        # (get_state_dict) and "dcp" (DCP's async_save call). Read by bench/checkpoint_bench.py.
        self.last_save_phases: dict[str, float] = {}
        self.last_saved: str | None = None
        self._stager = (staging.ReusingStager(staging.options(ctx.device, share=upload_in == "process"))
                        if async_save else None)
        self._inflight: tuple[str, Future] | None = None
        self._staging: tuple[str, Future] | None = None
        self.staging_wait_s = 0.0  # time the loop waited for background staging (last save)
        self._lock = threading.Lock()
        self._callback_ran = threading.Event()
        # One retention pass at a time, off the training thread (rank 0 only).
        self._retention = ThreadPoolExecutor(1, thread_name_prefix="rtj-retention") if ctx.rank == 0 else None
        # Parameters must not change while they are being copied: the optimizer waits for staging; and an
        # optimizer step after a micro-step that reduced wrongly is refused (see parallel.guard_reductions).
        self._hook = optimizer.register_step_pre_hook(lambda *_: self.wait_staged())
        self._reduction_guard = parallel.guard_reductions(model, optimizer) if check_reductions else None
        rdist.on_shutdown(self.wait)  # rdist.shutdown() finishes an in-flight save before the group goes
        outcome.register_pending(self.wait)  # record_success() waits for it too
        if ctx.rank == 0:
            self.storage.ensure()
            self._mark_attempt()

    # ---- fencing (see resilient_contract.lineage) ------------------------------------------------
    def _mark_attempt(self) -> None:
        """Say, before saving anything, which attempt runs now and where it started (the operator's choice)."""
        if self.attempt is None:
            return
        source = environment.resume_from()
        resumed = parse_step_dir(storage.split(source)[1]) if source else None
        # False: this attempt's rank 0 ran before (the mark says the same)
        self.storage.create_exclusive(lineage.marker_name(self.job, self.attempt),
                                      lineage.format_marker(self.job, self.attempt, resumed))

    def newer_attempt(self) -> int | None:
        """The newest attempt of this job that marked the root after ours, or None (never fenced locally)."""
        return self._fence.newer_attempt() if self._fence is not None else None

    def _own(self, name: str) -> bool:
        """Whether this attempt wrote that step directory (its writer token is ours)."""
        try:
            data = self.storage.store().read_bytes(f"{name}/{lineage.WRITER_FILE}", lineage.MAX_TOKEN_BYTES)
        except OSError:
            return False
        return lineage.parse_writer(data) == (self.job, self.attempt)

    def _refuse(self, path: str, newer: int) -> FencedError:
        assert self._fence is not None and self.attempt is not None
        self._fence.refuse(path, newer)
        return FencedError(path, self.attempt, newer)

    # ---- state ----------------------------------------------------------------------------------
    def _state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "train": self.train_state.state_dict()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.extra:
            state["extra"] = {name: obj.state_dict() for name, obj in self.extra.items()}
        return state

    def _broadcast(self, value: Any) -> Any:
        """Rank 0's value on every rank (also a barrier on the checkpoint group)."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.ctx.checkpoint_group)
        return box[0]

    # ---- save -----------------------------------------------------------------------------------
    def _prepare_dir(self, step: int) -> str | None:
        """Rank 0 makes a fresh step directory of its own; None (on all ranks) if this attempt already has a
        complete one for the step; FencedError (on all ranks) if a newer attempt has started."""
        decision: str | None = None
        if self.ctx.rank == 0:
            decision = self._make_dir(step)
        decision = self._broadcast(decision)
        if decision is not None and decision.startswith(FENCED_PREFIX):
            assert self.attempt is not None
            raise FencedError(step_dir_name(step), self.attempt, int(decision[len(FENCED_PREFIX):]))
        return decision

    def _make_dir(self, step: int) -> str | None:
        names = [step_dir_name(step)]
        if self.attempt is not None:
            names.append(step_dir_name(step, self.attempt))
        token = lineage.format_writer(self.job, self.attempt) if self.attempt is not None else None
        for name in names:
            path = self.storage.join(name)
            if not self.storage.claim_step(name, token):
                if self.attempt is None or self._own(name):
                    verdict = check_step(self.storage.store(), name)
                    if verdict.complete:
                        return None  # deterministic training would write the same bytes
                    if self.attempt is None or name == names[-1]:  # ours (or a local run's) partial: redo it
                        log.warning("replacing partial checkpoint %s (%s)", path, verdict.reason)
                        self.storage.remove_step(name)
                        if not self.storage.claim_step(name, token):
                            raise CheckpointError(f"{path} reappeared while it was being replaced")
                    else:
                        continue
                else:
                    continue  # another attempt's: never shared
            if self.attempt is not None and (newer := self.newer_attempt()) is not None:
                self._refuse(path, newer)
                return f"{FENCED_PREFIX}{newer}"
            return path
        raise CheckpointError(f"no directory of its own left for step {step} under {self.root}")

    def save(self, step: int, *, blocking: bool | None = None) -> str | None:
        """Checkpoint `step`; returns the directory (None if a complete one existed). Time blocked is
        in `last_blocked_s` (async: waiting for the previous upload + staging)."""
        t0 = time.perf_counter()
        phases = self.last_save_phases = {}
        if self.injected_resume and self.resumed_from is None:
            raise ResumeNotLoadedError(
                f"not saving step {step}: this run was asked to resume from {self.injected_resume} "
                f"(${environment.RESUME_FROM}, set by the operator or by the launcher's --resume) but never "
                "loaded it, so it would train from scratch over the same checkpoint root; call ckpt.resume() "
                "after building the Checkpointer and before the training loop")
        self.wait()  # at most one save in flight
        self.staging_wait_s = 0.0
        t1 = phases["wait"] = time.perf_counter() - t0
        path = self._prepare_dir(step)
        t2 = time.perf_counter() - t0
        phases["dir"] = t2 - t1
        if path is None:
            log.info("checkpoint for step %d already complete; not rewritten", step)
            self.last_blocked_s = time.perf_counter() - t0
            return None
        state = self._state_dict()
        t3 = time.perf_counter() - t0
        phases["state_dict"] = t3 - t2
        # the test hold is read here, not in the upload (a race with the test's own delenv)
        hold = os.environ.get(TEST_HOLD_METADATA_ENV) if self.attempt is not None else None
        writer: StorageWriter = upload.GuardedWriter(self._storage_writer(path), path, self.ctx.world_size,
                                                     self._fence, hold)
        use_async = self.async_save if blocking is None else not blocking
        try:
            if use_async and self._stager is not None:
                kind = AsyncCheckpointerType.THREAD
                if self.upload_in == "process":
                    upload.writer_process(self.ctx.checkpoint_group, self.upload_niceness)
                    kind = AsyncCheckpointerType.PROCESS
                else:
                    _lower_priority_of_upload(writer, self.upload_niceness)
                if self.ctx.device.type == "cuda":  # the side-stream copy must see the finished step
                    torch.cuda.synchronize(self.ctx.device)
                future = dcp.async_save(
                    state,
                    storage_writer=writer,
                    process_group=self.ctx.checkpoint_group,
                    async_checkpointer_type=kind,
                    async_stager=self._stager,
                )
                staging = None
                if not isinstance(future, Future):  # AsyncSaveResponse: staging still running
                    staging, future = future.staging_completion, future.upload_completion
                self._callback_ran = threading.Event()  # wait() returns only after _committed ran
                future.add_done_callback(functools.partial(self._committed, path, self._callback_ran))
                with self._lock:
                    self._inflight = (path, future)
                    self._staging = (path, staging) if staging is not None else None
                self.last_blocked_s = time.perf_counter() - t0
                phases["dcp"] = self.last_blocked_s - t3
                return path
            dcp.save(state, storage_writer=writer, process_group=self.ctx.checkpoint_group)
        except (Exception, CheckpointException) as exc:
            self._raise_fenced(path, exc)
            raise CheckpointError(f"saving checkpoint {path} failed: {_describe(exc)}") from exc
        self._after_save(path)
        self.last_blocked_s = time.perf_counter() - t0
        return path

    def _storage_writer(self, path: str) -> StorageWriter:
        inner = self.writer_factory(path)
        if not self.local_dir:
            return inner
        if not tiered.supports(inner):
            log.warning("writer %s cannot take a local tier: saving straight to the root", type(inner).__name__)
            return inner
        return tiered.TieredWriter(tiered.local_step_dir(self.local_dir, path), inner)  # type: ignore[arg-type]

    def pending(self) -> bool:
        """Whether a save is still in flight (not yet waited for)."""
        with self._lock:
            return self._inflight is not None

    def wait_staged(self) -> None:
        """Block until the in-flight save has copied the state (called by the optimizer step pre-hook)."""
        with self._lock:
            staging, self._staging = self._staging, None
        if staging is None:
            return
        path, future = staging
        t0 = time.perf_counter()
        try:
            future.result()
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"staging checkpoint {path} failed: {_describe(exc)}") from exc
        finally:
            self.staging_wait_s += time.perf_counter() - t0

    def wait(self) -> str | None:
        """Wait for the in-flight upload; raises CheckpointError if it failed. Returns its directory."""
        self.wait_staged()
        with self._lock:
            inflight, self._inflight = self._inflight, None
        if inflight is None:
            return None
        path, future = inflight
        try:
            future.result()
        except (Exception, CheckpointException) as exc:
            self._raise_fenced(path, exc)
            raise CheckpointError(f"saving checkpoint {path} failed: {_describe(exc)}") from exc
        self._callback_ran.wait()  # a Future runs its callbacks after result() may already return
        self.last_saved = path  # retention started when it was committed (_committed)
        return path

    def _raise_fenced(self, path: str, exc: BaseException) -> None:
        """A failed save of a fenced gang is a FencedError (the reason to stop), whatever DCP wrapped it in."""
        if self.attempt is not None and (newer := self.newer_attempt()) is not None:
            raise FencedError(path, self.attempt, newer) from exc

    def _committed(self, path: str, ran: threading.Event, done: Future) -> None:
        """In the upload thread, right after `.metadata` was committed: start retention (rank 0)."""
        try:
            if not done.cancelled() and done.exception() is None:
                self._after_save(path, background=True)
        finally:
            ran.set()

    def _after_save(self, path: str, background: bool = False) -> None:
        self.last_saved = path
        if self.local_dir:  # every rank: keep this save's local copy, drop the older one
            try:
                tiered.commit_local(self.local_dir, path)
            except OSError as exc:  # the local tier is a cache: never fail training over it
                log.warning("cannot keep the local copy of %s: %s", path, exc)
        if self._retention is None:
            return
        protect = (storage.split(self.resumed_from)[1],) if self.resumed_from else ()
        job = self.job if self.attempt else None
        if not background:  # a blocking save: the loop waits anyway
            self.join_retention()
            self._apply_retention(protect, job)
            return
        with contextlib.suppress(RuntimeError):  # closed: the run is ending, the next run's pass will do it
            self._retention.submit(self._apply_retention, protect, job)

    def _apply_retention(self, protect: tuple[str, ...], job: str | None) -> None:
        """Off the training thread: it lists and checks every step directory, and deletes whole checkpoints.
        It never deletes the newest complete checkpoint nor anything newer, so it cannot race the next save."""
        try:
            result = retention.apply(self.storage, self.keep_last, protect, job)
            if result.delete:
                log.info("retention removed %s", ", ".join(result.delete))
        except Exception as exc:  # retention must never fail training
            log.warning("retention failed: %s", exc)

    def join_retention(self) -> None:
        """Wait for the background retention passes submitted so far (if any)."""
        if self._retention is not None:
            with contextlib.suppress(RuntimeError):  # already shut down: nothing left to wait for
                self._retention.submit(lambda: None).result()

    def close(self) -> None:
        try:
            self.wait()
            self.join_retention()
        finally:
            if self._retention is not None:
                self._retention.shutdown(wait=True)
            self._hook.remove()
            if self._reduction_guard is not None:
                self._reduction_guard.remove()
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    # ---- load -----------------------------------------------------------------------------------
    def load(self, path: str) -> int:
        """Load a checkpoint written at any world size; returns its step. Fails loudly, naming it."""
        parent, name = storage.split(path)
        source = self.storage if parent == self.root else None
        try:
            source = source or storage.open_root(parent)
        except StorageError as exc:
            raise CheckpointError(f"cannot resume from checkpoint {path}: {exc}") from None
        path = source.join(name)
        self.wait()  # never load under a save that is still reading the same tensors
        problem, corrupt = None, False
        if self.ctx.rank == 0:
            if parse_step_dir(name) is None:
                problem = "not a step-<10 digits> checkpoint directory"
            else:
                verdict = check_step(source.store(), name)
                problem, corrupt = (None if verdict.complete else verdict.reason), verdict.corrupt
        problem, corrupt = self._broadcast((problem, corrupt))
        if corrupt:
            raise CorruptCheckpointError(path, problem)
        if problem:
            raise CheckpointError(f"cannot resume from checkpoint {path}: {problem}")
        state = self._state_dict()
        configured_batch = self.train_state.global_batch
        try:
            reader = source.reader(path, local=tiered.marked_step(self.local_dir, path))
            dcp.load(state, storage_reader=reader, process_group=self.ctx.checkpoint_group)
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
            if self.scheduler is not None:
                self.scheduler.load_state_dict(state["scheduler"])
            for name, obj in self.extra.items():
                obj.load_state_dict(state["extra"][name])
            self.train_state.load_state_dict(state["train"])
        except (Exception, CheckpointException) as exc:
            if (mismatch := integrity.find_mismatch(exc)) is not None:
                raise CorruptCheckpointError(path, mismatch.detail) from None
            raise CheckpointError(f"cannot resume from checkpoint {path}: {_describe(exc)}") from exc
        recorded = self.train_state.global_batch
        if configured_batch and recorded != configured_batch:
            if not self.allow_global_batch_change:
                raise CheckpointError(
                    f"cannot resume from checkpoint {path}: it was trained with global batch {recorded}, "
                    f"this run is configured for {configured_batch}; a different global batch changes the "
                    "training run (pass allow_global_batch_change=True to continue from the same sample "
                    "position with the new batch)"
                )
            log.warning("global batch changed on resume: %d -> %d at sample %d (allowed)",
                        recorded, configured_batch, self.train_state.samples_seen)
            self.train_state.global_batch = configured_batch
        self.resumed_from = path
        return self.train_state.step

    def resume(self, resume_from: str | None = None) -> str | None:
        """Load `resume_from` or the operator's `$RTJ_RESUME_FROM`; None on a fresh start.

        Falls back only from a checkpoint whose content is proven corrupt (its bytes do not match its checksum
        manifest): that one is marked corrupt, logged and named in the termination message, and the previous
        complete checkpoint of the same root is loaded instead (up to MAX_FALLBACKS times). Any other failure
        raises: the operator chose (and checked) the checkpoint, and silently starting elsewhere would fork
        the run."""
        target = resume_from or environment.resume_from()
        if target is None:
            return None
        for _ in range(MAX_FALLBACKS):
            try:
                self.load(target)
                return self.resumed_from
            except CorruptCheckpointError as exc:
                target = self._fall_back(exc)
        raise CheckpointError(f"cannot resume: {MAX_FALLBACKS} checkpoints in a row were corrupt, the last "
                              f"{target}; giving up")

    def _fall_back(self, exc: CorruptCheckpointError) -> str:
        """Mark a corrupt checkpoint, say so, and pick the previous complete one (rank 0 decides for all)."""
        parent, name = storage.split(exc.path)
        decision: str | None = None
        if self.ctx.rank == 0:
            source = self.storage if parent == self.root else storage.open_root(parent)
            try:  # evidence, and the completeness rule refuses the directory from now on
                source.put(f"{name}/{CORRUPT_FILE}", f"{exc.detail}\n".encode()[:4096])
            except OSError as err:
                log.warning("cannot mark %s corrupt: %s", exc.path, err)
            decision = self._previous_complete(source, parse_step_dir(name) or 0, name)
        decision = self._broadcast(decision)
        if self.ctx.rank == 0:
            log.error("checkpoint %s is corrupt (%s); %s", exc.path, exc.detail,
                      f"falling back to {decision}" if decision else "no older complete checkpoint to fall back to")
        outcome.record_refused_checkpoint(self.ctx, name, storage.split(decision)[1] if decision else None)
        if decision is None:
            raise CheckpointError(f"{exc}; and no older complete checkpoint is left under {parent} to fall "
                                  "back to") from None
        return decision

    def _previous_complete(self, source: storage.Root, step: int, refused: str) -> str | None:
        """The newest complete checkpoint at or below `step` other than `refused`, by the same rule (and this
        job's lineage) that discovery applies; None if there is none."""
        store = source.store()
        rule = lineage.Lineage.merge(self.job, read_lineage(store, self.job)) if self.attempt is not None else None
        for found, name in reversed(step_dirs(store)):
            if found <= step and name != refused and check_step(store, name, rule=rule).complete:
                return source.join(name)
        return None


def _lower_priority_of_upload(writer: StorageWriter, niceness: int) -> None:
    """Make the thread that writes the shards (DCP's async executor) nice itself first; Linux nice
    values are per thread, so the training threads keep theirs."""
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return
    write_data = writer.write_data

    def niced_write_data(*args: Any, **kwargs: Any) -> Any:
        tid = threading.get_native_id()
        try:
            current = os.getpriority(os.PRIO_PROCESS, tid)
            if current < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError as exc:  # priority is an optimisation, never a failure
            log.debug("cannot lower the upload thread's priority: %s", exc)
        return write_data(*args, **kwargs)

    writer.write_data = niced_write_data  # type: ignore[method-assign]
