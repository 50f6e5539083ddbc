"""SIGTERM handling: finish the current step, agree across ranks, save, exit within the grace period.

Kubernetes sends SIGTERM to the pod (torchrun's agent forwards it to the workers and SIGKILLs them after
its shutdown timeout, 30 s by default), so the handler only sets a flag. Ranks may see the signal at
different steps; `should_stop` all-reduces the flag so every rank stops after the *same* step and the
final save's collectives match. Piggy-back the flag on an existing per-step all-reduce when you have
one (the example does) to avoid an extra collective.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import torch
import torch.distributed as dist


class PreemptionHandler:
    """Install with `PreemptionHandler.install()`; poll `requested` / `should_stop()` once per step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None

    @classmethod
    def install(cls, signals: tuple[int, ...] = (signal.SIGTERM,)) -> PreemptionHandler:
        handler = cls()
        for sig in signals:
            signal.signal(sig, handler._on_signal)
        return handler

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        self._event.set()

    def should_stop(self, group: dist.ProcessGroup | None = None) -> bool:
        """True on every rank if any rank was signalled (one tiny all-reduce)."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0])
        if dist.get_backend(group) == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, group=group)
        return bool(flag.item() > 0)
