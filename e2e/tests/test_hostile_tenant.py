"""A hostile tenant, with no more than the right to create jobs and pods in its own namespace, cannot hang
the operator, read another tenant's checkpoints, take over a gang, or crash-loop a job (issue #12).

Each case runs against the operator installed by helm, as its pod, with the discovery sandbox it ships with.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import support
from e2e.cluster import ClusterLike
from e2e.localcluster.cluster import wait_for
from e2e.support import HOST_DIR, MOUNT
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from resilient_contract import environment
from resilient_operator import constants as c
from tests.hostile import attacks

pytestmark = [pytest.mark.cluster]


@pytest.fixture
def other_namespace(cluster: ClusterLike) -> Iterator[str]:
    """A second tenant's namespace."""
    yield from support.scratch_namespace(cluster, prefix="t-other")


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((cond for cond in status.get("conditions") or [] if cond["type"] == ctype), None)


def wait_condition(cluster: ClusterLike, ns: str, name: str, ctype: str, value: str, reason: str,
                   timeout: float = 60) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = condition(support.get_job(cluster, ns, name).get("status") or {}, ctype)
        return cond if cond and cond["status"] == value and cond.get("reason") == reason else None

    return wait_for(check, timeout, f"{ns}/{name} {ctype}={value} ({reason})")


@pytest.mark.timeout(420)
def test_a_hostile_root_beside_a_healthy_job_that_loses_a_node(cluster: ClusterLike, namespace: str,
                                                               other_namespace: str) -> None:
    """Two hostile jobs (a FIFO named .metadata, a pickle bomb) keep the sandbox busy; the healthy job in
    another namespace still recovers from a node loss on time, from its own checkpoint."""
    host = cluster.host_path(HOST_DIR)
    template = support.make_checkpoint(host / "templates" / uuid.uuid4().hex[:6], step=1)
    for name, attack in (("fifo", attacks.fifo_metadata), ("bomb", attacks.bomb_metadata("million-containers"))):
        root = host / other_namespace / name
        root.mkdir(parents=True)
        attack(template, root)
        hostile = support.job_manifest(name, other_namespace, replicas=1, min_replicas=1)
        # no GPU: with every checkpoint refused, a hostile job rightly starts from scratch (cheaply now), and its
        # pod must not take a GPU the healthy job needs after the node loss (seen in CI: 2 of 3 GPUs taken)
        hostile["spec"]["template"]["spec"]["containers"][0].pop("resources")
        support.apply(cluster, hostile)
    healthy_root = host / namespace / "healthy"
    support.make_checkpoint(healthy_root, step=7)
    support.apply(cluster, support.job_manifest("healthy", namespace, replicas=2, min_replicas=1))
    pods = support.running_attempt(cluster, namespace, "healthy", 1, 2, timeout=120)
    killed_at = time.monotonic()
    cluster.kill_node(support.node_of(pods, "1"))
    def relaunched() -> list[Any] | None:
        status = support.get_job(cluster, namespace, "healthy").get("status") or {}
        if status.get("attempt") != 2 or status.get("phase") != c.RUNNING:
            return None
        pods = [p for p in support.job_pods(cluster, namespace, "healthy") if p.metadata.labels[c.LABEL_ATTEMPT] == "2"]
        return pods if pods and all(p.status.phase == "Running" for p in pods) else None

    new = wait_for(relaunched, 90, "the healthy job running again as attempt 2")
    relaunch = time.monotonic() - killed_at
    print(f"\nbeside two hostile roots: node killed -> healthy job running again in {relaunch:.1f}s (timeout 4s)")
    assert relaunch <= 4 + 15  # the node-loss timeout, the settle wait and a discovery deadline at most
    assert all(p.spec.node_name != support.node_of(pods, "1") for p in new)
    env = {e.name: e.value for e in new[0].spec.containers[0].env}
    assert env[environment.RESUME_FROM] == f"{MOUNT}/{namespace}/healthy/step-0000000007"
    # the hostile jobs said what was wrong with their roots instead of hanging or crashing anyone
    for name in ("fifo", "bomb"):
        wait_for(lambda n=name: support.get_job(cluster, other_namespace, n).get("status", {}).get("phase"), 60,
                 "a phase")


@pytest.mark.timeout(180)
def test_a_root_in_another_namespaces_area_is_refused(cluster: ClusterLike, namespace: str,
                                                      other_namespace: str) -> None:
    secret = cluster.host_path(HOST_DIR) / other_namespace / "private"
    support.make_checkpoint(secret, step=99)
    job = support.job_manifest("thief", namespace, replicas=1, min_replicas=1)
    job["spec"]["checkpoint"]["root"] = f"{MOUNT}/{other_namespace}/private"
    support.apply(cluster, job)
    cond = wait_condition(cluster, namespace, "thief", c.COND_STORAGE, "False", "RootOutsideNamespaceArea")
    assert f"{MOUNT}/{namespace}" in cond["message"] and "99" not in cond["message"]
    assert support.job_pods(cluster, namespace, "thief") == []
    # the same answer for a path that does not exist: no existence oracle
    probe = support.job_manifest("probe", namespace, replicas=1, min_replicas=1)
    probe["spec"]["checkpoint"]["root"] = f"{MOUNT}/{other_namespace}/no-such-dir"
    support.apply(cluster, probe)
    other = wait_condition(cluster, namespace, "probe", c.COND_STORAGE, "False", "RootOutsideNamespaceArea")
    assert other["message"].replace("probe", "thief") == cond["message"].replace("no-such-dir", "private")


@pytest.mark.timeout(240)
def test_an_impostor_pod_with_the_jobs_labels_is_ignored(cluster: ClusterLike, namespace: str) -> None:
    support.apply(cluster, support.job_manifest("gang", namespace, replicas=2, min_replicas=1))
    pods = support.running_attempt(cluster, namespace, "gang", 1, 2)
    impostor = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gang-a9-0", "namespace": namespace, "labels": {
            c.LABEL_JOB: "gang", c.LABEL_ATTEMPT: "9", c.LABEL_RANK: "0", c.LABEL_ROLE: c.ROLE_WORKER},
            "annotations": {c.ANNOTATION_RESUME_FROM: "/checkpoints/elsewhere/step-0000000099",
                            c.ANNOTATION_RESUME_STEP: "99", c.ANNOTATION_REPLICAS: "1"}},
        "spec": {"containers": [{"name": "x", "image": "busybox", "command": ["sleep", "3600"]}],
                 "nodeSelector": {"pool": "train"}, "terminationGracePeriodSeconds": 1},
    }
    support.core(cluster).create_namespaced_pod(namespace, impostor)
    malformed = {**impostor, "metadata": {**impostor["metadata"], "name": "gang-ax-0",
                                          "labels": {**impostor["metadata"]["labels"], c.LABEL_ATTEMPT: "x"}}}
    support.core(cluster).create_namespaced_pod(namespace, malformed)
    # The operator reconciles on every pod event; give it a few of them, then the real gang must be intact.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = support.get_job(cluster, namespace, "gang")["status"]
        assert status["attempt"] == 1 and status["phase"] == c.RUNNING, status
        time.sleep(1)
    names = {p.metadata.name for p in support.job_pods(cluster, namespace, "gang")
             if p.metadata.deletion_timestamp is None}
    assert {p.metadata.name for p in pods} <= names
    assert not any("gang-a9" in e or "elsewhere" in e for e in support.events(cluster, namespace, "gang"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"env": ["A=1"]}, "env[0]"),
        ({"env": [{"name": environment.RESUME_FROM, "value": "/checkpoints/x/step-0000000001"}]}, "RTJ_RESUME_FROM"),
        ({"resources": {"limits": {"cpu": "1.2.3"}}}, "resources.cpu"),
    ],
    ids=["env-as-strings", "contract-name-in-env", "bad-quantity"],
)
def test_a_template_the_operator_cannot_use_gets_a_condition(cluster: ClusterLike, namespace: str,
                                                             edit: dict[str, Any], field: str) -> None:
    job = support.job_manifest("shape", namespace, replicas=1, min_replicas=1)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container.update(edit)
    if "resources" in edit:
        container["resources"]["limits"][c.GPU_RESOURCE] = "1"
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(job), check=False)
    if result.returncode != 0:  # the API server refused it outright: also a clear error, and nothing lost
        assert "shape" in result.stderr or "invalid" in result.stderr.lower()
        return
    cond = wait_condition(cluster, namespace, "shape", c.COND_SPEC_VALID, "False", c.REASON_INVALID_SPEC)
    assert field in cond["message"]
    assert support.job_pods(cluster, namespace, "shape") == []
    assert any(field in e for e in support.events(cluster, namespace, "shape"))
