"""The shell's own logic that needs no cluster: status patches, the work queue, concurrent writes."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import threading
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from resilient_operator import constants as c
from resilient_operator import views
from resilient_operator.cache import ClusterCache, strip_pod
from resilient_operator.controller import apply, fan_out, merge_patch
from resilient_operator.core import Plan, render
from resilient_operator.workqueue import WorkQueue
from tests.operator import builders


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1}, {"a": 1}, None),
        ({}, {"phase": "Running"}, {"phase": "Running"}),
        ({"growBack": {"replicas": 4}, "phase": "Running"}, {"phase": "Restarting"},
         {"growBack": None, "phase": "Restarting"}),
        ({"restarts": {"infrastructure": 0, "application": 1}}, {"restarts": {"infrastructure": 1, "application": 1}},
         {"restarts": {"infrastructure": 1}}),
        ({"conditions": [{"type": "A"}]}, {"conditions": [{"type": "A"}, {"type": "B"}]},
         {"conditions": [{"type": "A"}, {"type": "B"}]}),
    ],
)
def test_merge_patch(old: dict, new: dict, patch: dict | None) -> None:
    assert merge_patch(old, new) == patch


def apply_merge(doc: dict, patch: dict) -> dict:
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply_merge(out[key], value)
        else:
            out[key] = value
    return out


def test_merge_patch_round_trips() -> None:
    old = {"phase": "Running", "resumedFrom": {"path": "/a", "step": 1}, "restarts": {"planned": 1}, "x": [1]}
    new = {"phase": "Starting", "restarts": {"planned": 2, "infrastructure": 1}, "x": [1, 2]}
    assert apply_merge(old, merge_patch(old, new)) == new


@pytest.mark.timeout(10)
def test_queue_dedupes_and_serialises_keys() -> None:
    async def scenario() -> list[str]:
        queue = WorkQueue()
        seen: list[str] = []
        queue.add("a")
        queue.add("a")
        queue.add("b", delay=0.05)
        first = await queue.get()
        queue.add(first)  # re-added while active: must wait until done()
        second = await asyncio.wait_for(queue.get(), 1)
        seen += [first, second]
        queue.done(first)
        third = await asyncio.wait_for(queue.get(), 1)
        seen.append(third)
        queue.done(second)
        queue.done(third)
        assert len(queue) == 0
        return seen

    assert asyncio.run(scenario()) == ["a", "b", "a"]


@pytest.mark.timeout(10)
def test_queue_keeps_the_earliest_due_time() -> None:
    async def scenario() -> float:
        queue = WorkQueue()
        loop = asyncio.get_running_loop()
        queue.add("job", delay=5)
        queue.add("job", delay=0.01)
        start = loop.time()
        await asyncio.wait_for(queue.get(), 2)
        return loop.time() - start

    assert asyncio.run(scenario()) < 1


def test_operator_config_from_the_charts_environment() -> None:
    from resilient_operator.core.drain import DEFAULT_TAINTS
    from resilient_operator.settings import operator_config

    assert operator_config({}).drain_taints == frozenset(DEFAULT_TAINTS) and operator_config({}).bad_node_taint is None
    cfg = operator_config({"RTJ_DRAIN_TAINTS": "a/b, c", "RTJ_SETTLE_SECONDS": "5", "RTJ_BAD_NODE_TAINT": "k/bad",
                           "RTJ_BAD_NODE_FAILURES": "2", "RTJ_BAD_NODE_MAX_FRACTION": "0.25"})
    assert cfg.drain_taints == {"a/b", "c"} and cfg.settle_seconds == 5 and cfg.bad_node_taint == "k/bad"
    assert cfg.bad_node_failures == 2 and cfg.bad_node_max_fraction == 0.25
    assert operator_config({"RTJ_DRAIN_TAINTS": ""}).drain_taints == frozenset()  # cordon only


def test_fan_out_runs_every_call_at_once_and_raises_the_first_failure() -> None:
    """A gang's pod writes overlap (8 calls meet at one barrier); a failure never skips the others."""
    barrier = threading.Barrier(8, timeout=10)
    ran: list[int] = []

    def call(i: int) -> None:
        barrier.wait()  # only passes when all 8 are in flight together
        ran.append(i)
        if i in (3, 5):
            raise ValueError(f"call {i}")

    with pytest.raises(ValueError, match="call 3"):
        fan_out([functools.partial(call, i) for i in range(8)])
    assert sorted(ran) == list(range(8))


class _RefusingKube:
    """The API server's side of a template that admission refuses: every pod create is a 422."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.events: list[tuple[str, str]] = []

    def write_guard(self) -> None:  # the leader check before writes (a single writer here)
        pass

    def create(self, manifest: dict[str, Any]) -> bool:
        self.created.append(manifest["metadata"]["name"])
        raise ApiException(status=422, reason="Unprocessable Entity")

    def emit_event(self, job: dict[str, Any], etype: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


def test_a_refused_gang_is_reported_once_and_every_pod_was_tried() -> None:
    kube = _RefusingKube()
    cache = ClusterCache(client.ApiClient(), ("team",), notify=lambda *_: None)
    pods = [functools.partial(lambda i: {"kind": "Pod", "metadata": {"namespace": "team", "name": f"j-a1-{i}"}}, i)
            for i in range(4)]
    job = {"metadata": {"namespace": "team", "name": "j"}, "status": {}}
    with pytest.raises(ApiException):
        apply(kube, cache, job, Plan(status={}, create=pods))  # type: ignore[arg-type]
    assert sorted(kube.created) == [f"j-a1-{i}" for i in range(4)]
    assert [reason for reason, _ in kube.events] == ["CreateRejected"]
    assert kube.events[0][1].startswith("cannot create Pod j-a1-")


def test_the_pod_cache_keeps_everything_the_operator_reads_and_drops_the_rest() -> None:
    """A stored pod is a third of the object (16,000 pods in ~115 MiB), and reads the same as the whole."""
    pod = render.pod_manifest(builders.job(), 2, 1, 4, None, ["n9"])
    pod["metadata"].update(uid="u1", resourceVersion="7", deletionTimestamp="2026-01-01T00:00:00Z",
                           ownerReferences=[{"uid": "uid-1", "controller": True, "kind": c.KIND, "name": "demo"}])
    pod["spec"]["nodeName"] = "n3"
    pod["metadata"]["annotations"]["example.com/notes"] = "from the template, never read: " + "x" * 400
    pod["status"] = {
        "phase": "Failed", "reason": "Evicted", "message": "out of memory", "podIP": "10.0.0.7",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                       {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}],
        "containerStatuses": [{"name": "trainer", "state": {"terminated": {
            "exitCode": 137, "reason": "OOMKilled", "message": "rtj", "finishedAt": "2026-01-01T00:00:01Z"}}}],
    }
    whole = views.pod_view(copy.deepcopy(pod))
    stored = strip_pod(copy.deepcopy(pod))
    assert views.pod_view(stored) == whole
    assert "containers" not in stored["spec"] and "affinity" not in stored["spec"]
    assert "example.com/notes" not in stored["metadata"]["annotations"] and whole.ip == "10.0.0.7"
    assert len(json.dumps(stored)) < len(json.dumps(pod)) / 2


class _RefusingServices(_RefusingKube):
    """RBAC refuses Services (403); pods would be accepted."""

    def create(self, manifest: dict[str, Any]) -> bool:
        self.created.append(manifest["metadata"]["name"])
        if manifest["kind"] == "Service":
            raise ApiException(status=403, reason="Forbidden")
        return True


def test_a_refused_service_stops_the_pods_so_the_next_reconcile_creates_both() -> None:
    kube = _RefusingServices()
    cache = ClusterCache(client.ApiClient(), ("team",), notify=lambda *_: None)
    service = functools.partial(lambda: {"kind": "Service", "metadata": {"namespace": "team", "name": "j"}})
    pods = [functools.partial(lambda i: {"kind": "Pod", "metadata": {"namespace": "team", "name": f"j-a1-{i}"}}, i)
            for i in range(4)]
    job = {"metadata": {"namespace": "team", "name": "j"}, "status": {}}
    with pytest.raises(ApiException):
        apply(kube, cache, job, Plan(status={}, create=[service, *pods]))  # type: ignore[arg-type]
    assert kube.created == ["j"]  # no pod of a gang whose Service is missing
    assert [reason for reason, _ in kube.events] == ["CreateRejected"]
