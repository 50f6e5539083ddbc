"""Progress reports go through the same sandboxed seam as checkpoints (issue 25, item 4).

They are read by a discovery worker, relative to the root's directory fd, following no link anywhere on the
path, and only for the job's own pods (by controller uid) of its current attempt. Before, the operator read
them in its own process by path string: a symlinked `_RTJ_PROGRESS` made it copy another namespace's step and
step time into the attacker's status.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resilient_contract import progress
from resilient_operator import constants as c
from resilient_operator import controller, discovery
from resilient_operator.settings import DiscoverySettings
from tests.operator.builders import NOW, healthy, job_object, running_status

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mount() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rtj-progress-"))
    path.chmod(0o755)
    discovery.start(DiscoverySettings(checkpoint_mount=str(path), timeout_seconds=10.0, workers=1))
    yield path
    discovery.shutdown()
    shutil.rmtree(path)


def pod_object(name: str, attempt: int = 1, owner: str | None = "uid-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml",
                            "labels": {c.LABEL_JOB: "demo", c.LABEL_ATTEMPT: str(attempt), c.LABEL_RANK: "0"},
                            "annotations": {c.ANNOTATION_REPLICAS: "1"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "demo", "uid": owner,
                                    "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": "n0"}, "status": {"phase": "Running"}}


class _Clock:
    def now(self) -> Any:
        return NOW


class _Cache:
    def __init__(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.obj, self.pods, self.clock = job, pods, _Clock()

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.obj

    def job_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.pods

    def node_views(self) -> Any:
        return healthy(4)

    def jobs_with_root(self, root: str) -> list[dict[str, Any]]:
        return [self.obj]


def report(pod: str, step: int) -> bytes:
    return json.dumps({"pod": pod, "attempt": 1, "step": step, "time": NOW.timestamp() - 5,
                       "firstStepAt": NOW.timestamp() - 60, "stepSeconds": 0.5, "slowestRank": 0}).encode()


def reports_for(mount: Path, root: Path, pods: list[dict[str, Any]]) -> list[Any]:
    obj = job_object(status=running_status(replicas=1), checkpoint={"root": str(root)}, replicas=1)
    observed = controller.observe(_Cache(obj, pods), "ml", "demo")  # type: ignore[arg-type]
    assert observed is not None
    _, job, pod_views, _, listing, found = observed
    assert listing.error is None, listing
    return controller.read_progress(job, pod_views, NOW, found)


def test_the_jobs_own_report_is_read_through_the_worker(mount: Path) -> None:
    root = mount / "ml" / "own"
    (root / progress.DIRNAME).mkdir(parents=True)
    (root / progress.DIRNAME / "demo-a1-0.json").write_bytes(report("demo-a1-0", 41))
    (got,) = reports_for(mount, root, [pod_object("demo-a1-0")])
    assert got.step == 41 and got.step_seconds == 0.5


def test_a_symlinked_progress_directory_into_another_namespace_yields_nothing(mount: Path) -> None:
    victim = mount / "victim-ns" / "job" / progress.DIRNAME
    victim.mkdir(parents=True)
    (victim / "demo-a1-0.json").write_bytes(report("demo-a1-0", 99999))
    root = mount / "ml" / "thief"
    root.mkdir(parents=True)
    (root / progress.DIRNAME).symlink_to(victim)
    assert reports_for(mount, root, [pod_object("demo-a1-0")]) == []


def test_a_symlinked_report_file_yields_nothing(mount: Path) -> None:
    victim = mount / "victim-ns" / "job2"
    victim.mkdir(parents=True)
    (victim / "r.json").write_bytes(report("demo-a1-0", 99999))
    root = mount / "ml" / "thief2"
    (root / progress.DIRNAME).mkdir(parents=True)
    (root / progress.DIRNAME / "demo-a1-0.json").symlink_to(victim / "r.json")
    assert reports_for(mount, root, [pod_object("demo-a1-0")]) == []


def test_reports_of_pods_the_job_does_not_own_are_not_used(mount: Path) -> None:
    root = mount / "ml" / "strays"
    (root / progress.DIRNAME).mkdir(parents=True)
    for name in ("stray-a1-0", "other-a1-0"):
        (root / progress.DIRNAME / f"{name}.json").write_bytes(report(name, 7))
    pods = [pod_object("stray-a1-0", owner=None), pod_object("other-a1-0", owner="uid-of-another-job")]
    assert reports_for(mount, root, pods) == []
