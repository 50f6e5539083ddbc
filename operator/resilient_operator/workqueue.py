"""A deduplicating, delayed work queue of job keys (the controller-runtime pattern, in asyncio).

A key is processed by at most one worker at a time; adding a key that is queued keeps the earlier
due time, and adding one that is being processed parks it to run again right after. Due times live in
a heap with lazy deletion, so every operation is O(log n) in the number of queued keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._due: dict[K, float] = {}  # queued keys and their due time; heap entries that disagree are stale
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()  # ties break by insertion order, never by comparing keys
        self._active: set[K] = set()
        self._parked: dict[K, float] = {}  # added while active: queued when done()
        self._changed = asyncio.Event()

    def add(self, key: K, delay: float = 0.0) -> None:
        due = time.monotonic() + max(delay, 0.0)
        if key in self._active:
            if key not in self._parked or due < self._parked[key]:
                self._parked[key] = due
            return
        if key not in self._due or due < self._due[key]:
            self._due[key] = due
            heapq.heappush(self._heap, (due, next(self._seq), key))
            self._changed.set()

    def forget(self, key: K) -> None:
        self._due.pop(key, None)
        self._parked.pop(key, None)

    def __len__(self) -> int:
        return len(self._due) + len(self._parked)

    def _top(self) -> tuple[float, K] | None:
        while self._heap:
            due, _, key = self._heap[0]
            if self._due.get(key) == due:
                return due, key
            heapq.heappop(self._heap)  # stale: re-added earlier, taken, or forgotten
        return None

    async def get(self) -> K:
        """Wait for the earliest due key, and take it."""
        while True:
            top = self._top()
            timeout: float | None = None
            if top is not None:
                due, key = top
                now = time.monotonic()
                if due <= now:
                    heapq.heappop(self._heap)
                    del self._due[key]
                    self._active.add(key)
                    return key
                timeout = due - now
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def done(self, key: K) -> None:
        self._active.discard(key)
        if (due := self._parked.pop(key, None)) is not None:
            self.add(key, due - time.monotonic())
        self._changed.set()
