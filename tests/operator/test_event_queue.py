"""Events leave the reconcile: emit_event returns at once, one job's events keep their order, and an API server
that stops answering costs a bounded queue, not the operator's memory or its reconciles."""

from __future__ import annotations

import threading
import time
from typing import Any

from resilient_operator import kube as kube_module
from resilient_operator.kube import Kube
from resilient_operator.metrics import EVENTS_DROPPED


class _Core:
    """Records created events; blocks every create until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.posted: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def create_namespaced_event(self, namespace: str, event: Any, **_: Any) -> _Answer:
        self.release.wait(10)
        with self.lock:
            self.posted.append((event.involved_object.name, event.reason))
        return _Answer()


class _Answer:
    """The raw answer (`_preload_content=False`) the operator reads to the end and hands back to the pool."""

    def read(self) -> bytes:
        return b"{}"

    def release_conn(self) -> None:
        pass


def job(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "resourceVersion": "1"}}


def kube_with(core: _Core) -> Kube:
    k = Kube(api_client=object())  # type: ignore[arg-type]
    k.core = core  # type: ignore[assignment]
    return k


def test_emit_returns_while_the_api_server_is_slow_and_keeps_each_jobs_order() -> None:
    core = _Core()
    k = kube_with(core)
    t0 = time.monotonic()
    for i in range(5):
        for name in ("a", "b", "c"):
            k.emit_event(job(name), "Normal", f"R{i}", "m")
    assert time.monotonic() - t0 < 1.0  # nothing was posted yet: the creates block
    core.release.set()
    assert k.flush_events(10)
    assert len(core.posted) == 15
    for name in ("a", "b", "c"):
        assert [r for n, r in core.posted if n == name] == [f"R{i}" for i in range(5)]


def test_past_the_bound_new_events_are_dropped_and_counted(monkeypatch: Any) -> None:
    monkeypatch.setattr(kube_module, "MAX_PENDING_EVENTS", 3)
    core = _Core()
    k = kube_with(core)
    before = EVENTS_DROPPED._value.get()
    for i in range(6):
        k.emit_event(job("a"), "Normal", f"R{i}", "m")
    assert EVENTS_DROPPED._value.get() - before == 3
    core.release.set()
    assert k.flush_events(10)
    assert [r for _, r in core.posted] == ["R0", "R1", "R2"]
    k.emit_event(job("a"), "Normal", "R6", "m")  # room again once they were posted
    assert k.flush_events(10) and core.posted[-1] == ("a", "R6")
