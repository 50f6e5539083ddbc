"""Bound methods held weakly: a Checkpointer registers its `wait` with `dist.shutdown()` and with
`outcome.record_success()` without being kept alive by them. Torch-free."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable


class WeakHooks:
    """A thread-safe list of weakly held bound methods; dead ones are dropped."""

    def __init__(self) -> None:
        self._refs: list[weakref.WeakMethod] = []
        self._lock = threading.Lock()

    def add(self, method: Callable[[], object]) -> None:
        with self._lock:
            self._refs[:] = [ref for ref in self._refs if ref() is not None]
            self._refs.append(weakref.WeakMethod(method))

    def live(self, clear: bool = False) -> list[Callable[[], object]]:
        """The methods whose objects still exist (and forget all of them when `clear`)."""
        with self._lock:
            methods = [m for ref in self._refs if (m := ref()) is not None]
            if clear:
                self._refs.clear()
        return methods
