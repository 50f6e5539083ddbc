"""The operator in a real cluster: installed with helm, running as its pod with its ServiceAccount only.

Worker pods here run a shell stand-in (the real trainer runs in the end-to-end scenarios), so each
failure mode is injected exactly: a deleted pod, an exit code, a dead node, a restarted operator.
Detection latency (fault -> decision) is printed, not asserted.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e import support
from e2e.cluster import ClusterLike, wait_for
from e2e.support import HOST_DIR, MOUNT, OPERATOR_NS, RELEASE
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from resilient_contract import environment
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]


@pytest.mark.timeout(240)
def test_job_starts_a_gang_with_the_contract(cluster: ClusterLike, namespace: str) -> None:
    support.apply(cluster, support.job_manifest("gang", namespace))
    pods = support.running_attempt(cluster, namespace, "gang", 1, 3)
    envs = sorted((support.injected_env(p) for p in pods), key=lambda e: e[environment.NODE_RANK])
    assert [e[environment.NODE_RANK] for e in envs] == ["0", "1", "2"]
    for env in envs:
        assert env[environment.NNODES] == "3" and env[environment.ATTEMPT] == "1"
        assert env[environment.MASTER_ADDR] == f"gang-a1-0.gang.{namespace}.svc"
        assert environment.RESUME_FROM in env and not env[environment.RESUME_FROM]  # explicit, empty: beats envFrom
    # the processes saw the same values (written by the stand-in trainer)
    seen = wait_for(lambda: sorted(cluster.host_path(HOST_DIR).glob("gang-*.env")), 30, "env files")
    assert any(f"{environment.NNODES}=3" in f.read_text() for f in seen)
    svc = support.core(cluster).read_namespaced_service("gang", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    table = cluster.kubectl("get", "rtj", "-n", namespace).stdout
    assert "PHASE" in table and "WORKERS" in table and "Running" in table and "3/3" in table
    describe = cluster.kubectl("describe", "rtj", "gang", "-n", namespace).stdout
    assert c.REASON_STARTED in describe and c.REASON_ALL_RUNNING in describe


@pytest.mark.timeout(240)
def test_deleted_worker_pod_restarts_the_gang_once(cluster: ClusterLike, namespace: str) -> None:
    support.apply(cluster, support.job_manifest("del", namespace))
    pods = support.running_attempt(cluster, namespace, "del", 1, 3)
    victim = next(p for p in pods if p.metadata.labels[c.LABEL_RANK] == "1")
    start = time.monotonic()
    support.core(cluster).delete_namespaced_pod(victim.metadata.name, namespace)
    support.running_attempt(cluster, namespace, "del", 2, 3)
    print(f"\npod deleted -> attempt 2 running: {time.monotonic() - start:.1f}s")
    status = support.get_job(cluster, namespace, "del")["status"]
    assert status["restarts"] == {"infrastructure": 1, "application": 0, "planned": 0}
    assert status["lastFailure"]["reason"] == c.REASON_POD_DELETED
    assert [h["attempt"] for h in status["history"]] == [1, 2]


@pytest.mark.timeout(300)
def test_application_failure_backs_off_then_fails(cluster: ClusterLike, namespace: str) -> None:
    manifest = support.job_manifest("app", namespace, script=support.worker_script(fail_rank=0, code=3),
                            failurePolicy={"maxApplicationRestarts": 1, "applicationBackoffSeconds": 2})  # fmt: skip
    support.apply(cluster, manifest)

    def failed() -> dict[str, Any] | None:
        status = support.get_job(cluster, namespace, "app").get("status", {})
        return status if status.get("phase") == c.FAILED else None

    status = wait_for(failed, 180, "the job to fail after its application budget")
    assert status["restarts"]["application"] == 1 and status["restarts"]["infrastructure"] == 0
    assert status["lastFailure"]["exitCode"] == 3 and status["lastFailure"]["kind"] == c.APPLICATION
    cond = {x["type"]: x for x in status["conditions"]}[c.COND_FAILED]
    assert cond["status"] == "True" and cond["reason"] == c.REASON_APP_BUDGET
    # events follow the status write that they describe
    story = wait_for(lambda: (e := support.events(cluster, namespace, "app")) and any(
        x.startswith(c.REASON_APP_BUDGET) for x in e) and e, 30, "the budget event")  # fmt: skip
    assert any(e.startswith(c.REASON_BACKOFF) for e in story), story
    wait_for(lambda: not [p for p in support.job_pods(cluster, namespace, "app") if p.status.phase == "Running"], 60,
             "no worker left running after the failure")  # fmt: skip


@pytest.mark.timeout(300)
def test_killed_node_shrinks_the_job_and_resumes_from_the_checkpoint(cluster: ClusterLike, namespace: str) -> None:
    root = cluster.host_path(f"{HOST_DIR}/{namespace}/shrink")
    support.make_checkpoint(root, step=12)
    support.apply(cluster, support.job_manifest("shrink", namespace, replicas=4))
    pods = support.running_attempt(cluster, namespace, "shrink", 1, 4)
    assert support.injected_env(pods[0])[environment.RESUME_FROM] == f"{MOUNT}/{namespace}/shrink/step-0000000012"
    support.make_checkpoint(root, step=24)  # written "during" attempt 1
    (root / "step-0000000036").mkdir()  # a newer save that never finished: must not be used
    dead = support.node_of(pods, "2")
    killed_at = time.time()
    cluster.kill_node(dead)

    def detected() -> dict[str, Any] | None:
        status = support.get_job(cluster, namespace, "shrink").get("status", {})
        return status if status.get("restarts", {}).get("infrastructure") == 1 else None

    status = wait_for(detected, 60, "the node loss to be recorded")
    detected_after = time.time() - killed_at
    assert status["lastFailure"]["node"] == dead and status["lastFailure"]["reason"] == c.REASON_NODE_LOST
    new = support.running_attempt(cluster, namespace, "shrink", 2, 3)
    relaunched_after = time.time() - killed_at
    print(f"\nnode killed -> loss recorded {detected_after:.1f}s (timeout 4s), -> 3 workers running "
          f"{relaunched_after:.1f}s")  # fmt: skip
    assert all(p.spec.node_name != dead for p in new)
    env = support.injected_env(new[0])
    assert env[environment.NNODES] == "3"
    assert env[environment.RESUME_FROM] == f"{MOUNT}/{namespace}/shrink/step-0000000024"
    status = support.get_job(cluster, namespace, "shrink")["status"]
    assert status["resumedFrom"]["step"] == 24 and status["workers"] == "3/4"
    wait_for(lambda: any("restarted 4 -> 3 workers from step-0000000024" in e
                         for e in support.events(cluster, namespace, "shrink")), 30, "the restart event")  # fmt: skip


@pytest.mark.timeout(300)
def test_operator_restarted_mid_recovery_continues_without_duplicates(cluster: ClusterLike, namespace: str) -> None:
    support.apply(cluster, support.job_manifest("opr", namespace, replicas=3))
    pods = support.running_attempt(cluster, namespace, "opr", 1, 3)
    cluster.kill_node(support.node_of(pods, "0"))
    cluster.kubectl("delete", "pod", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/instance=" + RELEASE,
                    "--wait=false")  # fmt: skip
    new = support.running_attempt(cluster, namespace, "opr", 2, 3, timeout=150)
    assert len({p.metadata.name for p in new}) == 3
    status = support.get_job(cluster, namespace, "opr")["status"]
    assert status["attempt"] == 2 and status["restarts"]["infrastructure"] == 1


