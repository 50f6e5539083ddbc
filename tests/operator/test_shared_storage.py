"""Storage that two tenants could share by mistake or on purpose (issue 25, item 5): overlapping areas are
refused at start-up, and a root an older live job already uses is refused (RootInUse) unless both opt in."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator import views
from resilient_operator.core import reconcile
from resilient_operator.core.conditions import get_condition
from resilient_operator.settings import DiscoverySettings, SettingsError
from tests.operator.builders import NOW, healthy, job_object, listing


def env(areas: dict[str, str] | None = None, objects: list[dict[str, Any]] | None = None) -> dict[str, str]:
    out = {"RTJ_CHECKPOINT_MOUNT": "/checkpoints"}
    if areas is not None:
        out["RTJ_STORAGE_AREAS"] = json.dumps(areas)
    if objects is not None:
        out["RTJ_OBJECT_STORE_AREAS"] = json.dumps(objects)
    return out


@pytest.mark.parametrize(
    ("name", "settings", "names"),
    [
        ("two namespaces mapped to one directory",
         env({"ml-a": "/checkpoints/_areas/x", "ml-b": "/checkpoints/_areas/x/"}),
         ["ml-a", "ml-b", "/checkpoints/_areas/x"]),
        ("one area nested in another", env({"ml-a": "/checkpoints/_areas/x", "ml-b": "/checkpoints/_areas/x/y"}),
         ["ml-a", "ml-b", "/checkpoints/_areas/x/y"]),
        ("an area inside another namespace's default area", env({"ml-a": "/checkpoints/ml-b/stolen"}),
         ["ml-a", "ml-b", "/checkpoints/ml-b"]),
        ("an area holding the whole mount", env({"ml-a": "/checkpoints"}), ["ml-a", "/checkpoints"]),
        ("two object-store areas, one inside the other",
         env(objects=[{"uri": "s3://bkt/teams", "namespaces": ["ml-a"]},
                      {"uri": "s3://bkt/teams/b", "namespaces": ["ml-b"]}]),
         ["s3://bkt/teams", "s3://bkt/teams/b", "ml-a", "ml-b"]),
        ("the same bucket twice", env(objects=[{"uri": "s3://bkt", "namespaces": ["ml-a"]},
                                               {"uri": "s3://bkt/", "namespaces": ["ml-b"]}]), ["s3://bkt"]),
    ],
)
def test_overlapping_storage_areas_refuse_to_start_naming_both(name: str, settings: dict[str, str],
                                                                names: list[str]) -> None:
    with pytest.raises(SettingsError) as err:
        DiscoverySettings.from_environ(settings)
    for part in names:
        assert part in str(err.value), name


def test_disjoint_areas_and_one_shared_entry_start() -> None:
    DiscoverySettings.from_environ(env({"ml-a": "/checkpoints/_areas/a", "ml-b": "/checkpoints/_areas/b",
                                        "ml-c": "/checkpoints/ml-c/own"}))
    DiscoverySettings.from_environ(env(objects=[{"uri": "s3://bkt/a", "namespaces": ["ml-a", "ml-b"]},
                                                {"uri": "s3://bkt/ab", "namespaces": ["ml-c"]},
                                                {"uri": "s3://other/a", "namespaces": ["ml-d"]}]))


# ---- RootInUse ---------------------------------------------------------------------------------------------
def obj(name: str, created: str, root: str = "/ckpt/demo", phase: str | None = "Running", share: bool = False,
        namespace: str = "ml", deleting: bool = False) -> dict[str, Any]:
    out = job_object(name=name, status={"phase": phase} if phase else {},
                     checkpoint={"root": root, **({"shareRoot": True} if share else {})})
    out["metadata"].update(uid=f"uid-{name}", namespace=namespace, creationTimestamp=created)
    if deleting:
        out["metadata"]["deletionTimestamp"] = created
    return out


def holder(me: dict[str, Any], *others: dict[str, Any]) -> str | None:
    return views.root_holder(views.job_view(me), me, [me, *others])


def test_a_root_an_older_live_job_uses_is_held_by_it() -> None:
    old, new = obj("old", "2026-01-01T00:00:00Z"), obj("new", "2026-01-02T00:00:00Z", phase=None)
    assert holder(new, old) == "ml/old" and holder(old, new) is None
    other_ns = obj("thief", "2026-01-03T00:00:00Z", root="file:///ckpt//demo/", namespace="other")
    assert views.root_key(other_ns) == views.root_key(old) == "/ckpt/demo"
    assert holder(other_ns, old, new) == "ml/old"


@pytest.mark.parametrize(
    ("name", "other"),
    [
        ("it finished", obj("old", "2026-01-01T00:00:00Z", phase=c.SUCCEEDED)),
        ("it failed", obj("old", "2026-01-01T00:00:00Z", phase=c.FAILED)),
        ("it is being deleted", obj("old", "2026-01-01T00:00:00Z", deleting=True)),
        ("both opted into sharing", obj("old", "2026-01-01T00:00:00Z", share=True)),
    ],
)
def test_a_root_is_free_when(name: str, other: dict[str, Any]) -> None:
    assert holder(obj("new", "2026-01-02T00:00:00Z", share=True), other) is None, name


def test_one_side_opting_in_is_not_enough() -> None:
    assert holder(obj("new", "2026-01-02T00:00:00Z", share=True), obj("old", "2026-01-01T00:00:00Z")) == "ml/old"
    assert holder(obj("new", "2026-01-02T00:00:00Z"), obj("old", "2026-01-01T00:00:00Z", share=True)) == "ml/old"


def test_a_job_whose_root_is_in_use_gets_root_in_use_and_no_pods() -> None:
    job = dataclasses.replace(views.job_view(job_object()), root_in_use_by="ml/old")
    plan = reconcile(job, [], healthy(4), listing(10), NOW)
    cond = get_condition(plan.status, c.COND_STORAGE)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == c.REASON_ROOT_IN_USE
    assert "ml/old" in cond["message"] and "shareRoot" in cond["message"]
    assert not plan.create and plan.status["phase"] == c.PENDING
    assert [e.reason for e in plan.events if e.type == "Warning"] == [c.REASON_ROOT_IN_USE]
    again = reconcile(dataclasses.replace(job, status=copy.deepcopy(plan.status)), [], healthy(4), listing(10), NOW)
    assert not again.create and not [e for e in again.events if e.reason == c.REASON_ROOT_IN_USE]  # said once
    freed = reconcile(views.job_view(job_object(status=copy.deepcopy(plan.status))), [], healthy(4), listing(10),
                      NOW)
    assert any(m["kind"] == "Pod" for m in freed.manifests())
    assert get_condition(freed.status, c.COND_STORAGE)["status"] == "True"  # type: ignore[index]


def test_share_root_is_in_the_crd_and_defaults_off() -> None:
    assert views.job_view(job_object()).spec.share_root is False
    assert views.job_view(job_object(checkpoint={"root": "/ckpt/demo", "shareRoot": True})).spec.share_root is True


class _Cache:
    """The reads `controller.observe` makes, over a fixed set of jobs."""

    def __init__(self, *jobs: dict[str, Any]) -> None:
        self.jobs = list(jobs)

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((j for j in self.jobs if j["metadata"]["name"] == name), None)

    def job_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return []

    def node_views(self) -> dict[str, Any]:
        return {}

    def jobs_with_root(self, root: str) -> list[dict[str, Any]]:
        return [j for j in self.jobs if views.root_key(j) == root]


def test_the_shell_marks_the_younger_job_and_skips_its_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    from resilient_operator import controller, discovery

    def no_discovery(*args: Any) -> Any:
        raise AssertionError("a job that cannot launch needs no discovery")

    monkeypatch.setattr(discovery, "discover_with_reports", no_discovery)
    cache = _Cache(obj("old", "2026-01-01T00:00:00Z"), obj("new", "2026-01-02T00:00:00Z", phase=None))
    observed = controller.observe(cache, "ml", "new")  # type: ignore[arg-type]
    assert observed is not None and observed[1].root_in_use_by == "ml/old"
