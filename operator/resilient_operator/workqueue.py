"""A deduplicating, delayed work queue of job keys (the controller-runtime pattern, in asyncio).

A key is processed by at most one worker at a time; adding a key that is queued keeps the earlier
due time, and adding one that is being processed queues it to run again right after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Hashable


class WorkQueue:
    def __init__(self) -> None:
        self._due: dict[Hashable, float] = {}
        self._active: set[Hashable] = set()
        self._changed = asyncio.Event()

    def add(self, key: Hashable, delay: float = 0.0) -> None:
        due = time.monotonic() + max(delay, 0.0)
        if key not in self._due or due < self._due[key]:
            self._due[key] = due
            self._changed.set()

    def forget(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def __len__(self) -> int:
        return len(self._due)

    async def get(self) -> Hashable:
        """Wait for the earliest due key that no other worker holds, and take it."""
        while True:
            now = time.monotonic()
            ready = [(due, k) for k, due in self._due.items() if k not in self._active]
            if ready:
                due, key = min(ready, key=lambda item: item[0])
                if due <= now:
                    del self._due[key]
                    self._active.add(key)
                    return key
                timeout: float | None = due - now
            else:
                timeout = None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def done(self, key: Hashable) -> None:
        self._active.discard(key)
        self._changed.set()
