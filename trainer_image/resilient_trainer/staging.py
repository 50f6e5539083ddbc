"""The staging copy of an async save: the only part of a save the training loop should pay for.

DCP's `DefaultStager` copies with `UntypedStorage.copy_`, which holds the GIL for the whole memcpy: on a
host whose step is Python-heavy the training thread got 0.2 % of its solo work while a save staged (issue
27). `Tensor.copy_` releases the GIL, so staging here views each cached buffer and each source storage as
a byte tensor and copies between those (94 % of the training thread's work kept, same bytes).
Buffers are cached per source storage (DCP's own weak-keyed cache) and reused across saves, so a save
after the first allocates nothing. On CUDA they are pinned and the copies are non-blocking on a side
stream; with `share=True` they live in shared memory, so a writer process receives them by handle.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.storage import UntypedStorage


def byte_view(storage: UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def copy_storage(dst: UntypedStorage, src: UntypedStorage, non_blocking: bool = False) -> None:
    """dst[:] = src, with the GIL released for the memcpy (Tensor.copy_, unlike UntypedStorage.copy_)."""
    if dst.nbytes() != src.nbytes():
        raise ValueError(f"staging buffer of {dst.nbytes()} bytes for a storage of {src.nbytes()} bytes")
    if src.nbytes():
        byte_view(dst).copy_(byte_view(src), non_blocking=non_blocking)


class _GilFreeStateDictStager(StateDictStager):
    """DCP's caching state-dict deep copy, with each storage copied by `copy_storage`.

    `close()` keeps it usable: torch 2.9-2.11's `DefaultStager._stage` closes its stager after every stage
    (to break a reference cycle), which drops the cached buffers and empties the copy table, so the next save
    failed with `KeyError: <class 'type'>` (seen on CUDA with torch 2.11). `release()` frees them for good.
    """

    def close(self) -> None:
        """Called by DCP after each stage on some versions: the buffers and the table stay for the next save."""

    def release(self) -> None:
        super().close()

    def _stage_untyped_storage(self, storage: UntypedStorage, non_blocking: bool = False) -> UntypedStorage:
        cached = self._cached_storage_mapping.get(storage)
        if cached is not None and cached.nbytes() == storage.nbytes():
            copy_storage(cached, storage, non_blocking)
            return cached
        if self.share_memory:
            new = UntypedStorage._new_shared(storage.nbytes(), device="cpu")
        else:
            new = UntypedStorage(storage.nbytes(), device="cpu")
        if self.pin_memory and new.nbytes() >= self.pin_memory_min_bytes:
            import torch.cuda._pin_memory_utils as pin_memory_utils

            pin_memory_utils.pin_memory(new.data_ptr(), new.nbytes())
            unpin = weakref.finalize(new, pin_memory_utils.unpin_memory, new.data_ptr())
            unpin.atexit = False  # never after the CUDA context is gone
        copy_storage(new, storage, non_blocking)
        self._cached_storage_mapping[storage] = new
        return new


def options(device: torch.device, share: bool = False) -> StagingOptions:
    """Per-device staging: pinned + non-blocking copies on CUDA; plain copies on CPU (non-blocking copies
    assert without an accelerator). Background staging on both; shared memory for a writer process."""
    cuda = device.type == "cuda"
    return StagingOptions(use_pinned_memory=cuda, use_shared_memory=share, use_async_staging=True,
                          use_non_blocking_copy=cuda)


class ReusingStager(DefaultStager):
    """`DefaultStager` (a background thread; a side stream on CUDA) staging through `_GilFreeStateDictStager`."""

    def __init__(self, config: StagingOptions) -> None:
        super().__init__(config)
        self._state_dict_stager.close()
        self._state_dict_stager = _GilFreeStateDictStager(
            pin_memory=config.use_pinned_memory, share_memory=config.use_shared_memory
        )

    def close(self) -> None:
        super().close()
        stager = self._state_dict_stager
        if isinstance(stager, _GilFreeStateDictStager):
            stager.release()

    def cached_bytes(self) -> int:
        """Bytes of staging buffers held for reuse."""
        return sum(s.nbytes() for s in self._state_dict_stager._cached_storage_mapping.values())


def stage(stager: DefaultStager, state: dict[str, Any]) -> Any:
    """Synchronous helper for tests and the benchmark: the staged copy."""
    out = stager.stage(state)
    return out.result() if hasattr(out, "result") else out
