"""The operator in a real cluster: installed with helm, running as its pod with its ServiceAccount only.

Worker pods here run a shell stand-in (the real trainer runs in the end-to-end scenarios), so each
failure mode is injected exactly: a deleted pod, an exit code, a dead node, a restarted operator.
Detection latency (fault -> decision) is printed, not asserted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.localcluster.cluster import Cluster, wait_for
from resilient_operator import constants as c
from resilient_trainer import contract

pytestmark = [pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "resilient-training-operator"
RELEASE = "rtj"
OPERATOR_NS = "rtj-system"
MOUNT = "/checkpoints"
NODES = ("w0", "w1", "w2", "w3")
HOST_DIR = "/rtj-checkpoints"  # a hostPath shared by every simulated node: the RWX checkpoint volume


@pytest.fixture(scope="module")
def cluster(rtj_cluster: Cluster) -> Cluster:
    """The session cluster plus a pool of one-GPU training nodes and a node for the operator."""
    for name in NODES:
        rtj_cluster.add_node(name, cpu="4", memory="8Gi", gpus=1, labels={"pool": "train"})
    rtj_cluster.add_node("infra", cpu="4", memory="8Gi", labels={"role": "infra"})
    rtj_cluster.host_path(HOST_DIR).mkdir(parents=True, exist_ok=True)
    rtj_cluster.kubectl("create", "namespace", OPERATOR_NS)
    rtj_cluster.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--wait", "--timeout", "120s",
                     "--set", f"checkpointStorage.hostPath={HOST_DIR}", "--set", f"checkpointStorage.mountPath={MOUNT}",
                     "--set", "nodeSelector.role=infra", "--set", "logLevel=DEBUG")  # fmt: skip
    return rtj_cluster


def custom(cl: Cluster) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(cl.api_client())


def core(cl: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cl.api_client())


def get_job(cl: Cluster, ns: str, name: str) -> dict[str, Any]:
    return custom(cl).get_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL, name)


def job_pods(cl: Cluster, ns: str, name: str) -> list[Any]:
    return core(cl).list_namespaced_pod(ns, label_selector=f"{c.LABEL_JOB}={name}").items


def worker_script(fail_rank: int | None = None, code: int = 3) -> str:
    """Record the injected environment, then idle (or fail with `code` on one rank)."""
    record = f'env | grep -E "^(PET_|RTJ_|MASTER_)" > {MOUNT}/$RTJ_JOB_NAME-$(hostname).env;'
    if fail_rank is None:
        return record + " exec sleep 3600"
    return record + f' if [ "$PET_NODE_RANK" = "{fail_rank}" ]; then sleep 1; exit {code}; fi; exec sleep 3600'


def job_manifest(name: str, ns: str, replicas: int = 3, min_replicas: int = 2, script: str | None = None,
                 **spec: Any) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {
        "replicas": replicas,
        "elasticPolicy": {"minReplicas": min_replicas},
        "checkpoint": {"root": f"{MOUNT}/{ns}-{name}"},
        "nodeLossTimeoutSeconds": 4,
        "template": {"spec": {
            "terminationGracePeriodSeconds": 2,
            "nodeSelector": {"pool": "train"},
            "containers": [{
                "name": "trainer", "image": "busybox", "command": ["sh", "-c", script or worker_script()],
                "resources": {"limits": {c.GPU_RESOURCE: "1"}},
                "volumeMounts": [{"name": "ckpt", "mountPath": MOUNT}],
            }],
            "volumes": [{"name": "ckpt", "hostPath": {"path": HOST_DIR, "type": "Directory"}}],
        }},
    }  # fmt: skip
    body.update(spec)
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name, "namespace": ns}, "spec": body}


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    ns = f"t-{request.node.name.replace('_', '-')[:40].strip('-').lower()}"
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for_default_sa(ns)
    yield ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    for node in NODES:  # leave every node alive for the next test
        if cluster.nodes[node].killed:
            cluster.restore_node(node)
    # pods of a deleted namespace go with it; wait so the next test sees all capacity
    wait_for(lambda: not [p for p in core(cluster).list_pod_for_all_namespaces(
        label_selector=c.LABEL_JOB).items if p.metadata.namespace == ns], 60, f"pods of {ns} gone")  # fmt: skip


def apply(cl: Cluster, manifest: dict[str, Any]) -> None:
    cl.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def running_attempt(cl: Cluster, ns: str, name: str, attempt: int, replicas: int, timeout: float = 90) -> list[Any]:
    """Wait until exactly `replicas` pods of `attempt` run, no other pods exist, and status says Running."""

    def check() -> list[Any] | None:
        pods = job_pods(cl, ns, name)
        ours = [p for p in pods if p.metadata.labels[c.LABEL_ATTEMPT] == str(attempt)]
        if len(pods) != replicas or len(ours) != replicas or any(p.status.phase != "Running" for p in ours):
            return None
        status = get_job(cl, ns, name).get("status", {})
        return ours if status.get("phase") == c.RUNNING and status.get("attempt") == attempt else None

    return wait_for(check, timeout, f"attempt {attempt} of {ns}/{name} running {replicas} workers")


def events(cl: Cluster, ns: str, name: str) -> list[str]:
    items = core(cl).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [f"{e.reason}: {e.message}" for e in sorted(items, key=lambda e: e.metadata.creation_timestamp)]


def injected_env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.name in contract.ALL_NAMES}


@pytest.mark.timeout(240)
def test_job_starts_a_gang_with_the_contract(cluster: Cluster, namespace: str) -> None:
    apply(cluster, job_manifest("gang", namespace))
    pods = running_attempt(cluster, namespace, "gang", 1, 3)
    envs = sorted((injected_env(p) for p in pods), key=lambda e: e[contract.NODE_RANK])
    assert [e[contract.NODE_RANK] for e in envs] == ["0", "1", "2"]
    for env in envs:
        assert env[contract.NNODES] == "3" and env[contract.ATTEMPT] == "1"
        assert env[contract.MASTER_ADDR] == f"gang-a1-0.gang.{namespace}.svc"
        assert contract.RESUME_FROM not in env
    # the processes saw the same values (written by the stand-in trainer)
    seen = wait_for(lambda: sorted(cluster.host_path(HOST_DIR).glob("gang-*.env")), 30, "env files")
    assert any(f"{contract.NNODES}=3" in f.read_text() for f in seen)
    svc = core(cluster).read_namespaced_service("gang", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    table = cluster.kubectl("get", "rtj", "-n", namespace).stdout
    assert "PHASE" in table and "WORKERS" in table and "Running" in table and "3/3" in table
    describe = cluster.kubectl("describe", "rtj", "gang", "-n", namespace).stdout
    assert c.REASON_STARTED in describe and c.REASON_ALL_RUNNING in describe


@pytest.mark.timeout(240)
def test_deleted_worker_pod_restarts_the_gang_once(cluster: Cluster, namespace: str) -> None:
    apply(cluster, job_manifest("del", namespace))
    pods = running_attempt(cluster, namespace, "del", 1, 3)
    victim = next(p for p in pods if p.metadata.labels[c.LABEL_RANK] == "1")
    start = time.monotonic()
    core(cluster).delete_namespaced_pod(victim.metadata.name, namespace)
    running_attempt(cluster, namespace, "del", 2, 3)
    print(f"\npod deleted -> attempt 2 running: {time.monotonic() - start:.1f}s")
    status = get_job(cluster, namespace, "del")["status"]
    assert status["restarts"] == {"infrastructure": 1, "application": 0, "planned": 0}
    assert status["lastFailure"]["reason"] == c.REASON_POD_DELETED
    assert [h["attempt"] for h in status["history"]] == [1, 2]


@pytest.mark.timeout(300)
def test_application_failure_backs_off_then_fails(cluster: Cluster, namespace: str) -> None:
    manifest = job_manifest("app", namespace, script=worker_script(fail_rank=0, code=3),
                            failurePolicy={"maxApplicationRestarts": 1, "applicationBackoffSeconds": 2})  # fmt: skip
    apply(cluster, manifest)

    def failed() -> dict[str, Any] | None:
        status = get_job(cluster, namespace, "app").get("status", {})
        return status if status.get("phase") == c.FAILED else None

    status = wait_for(failed, 180, "the job to fail after its application budget")
    assert status["restarts"]["application"] == 1 and status["restarts"]["infrastructure"] == 0
    assert status["lastFailure"]["exitCode"] == 3 and status["lastFailure"]["kind"] == c.APPLICATION
    cond = {x["type"]: x for x in status["conditions"]}[c.COND_FAILED]
    assert cond["status"] == "True" and cond["reason"] == c.REASON_APP_BUDGET
    # events follow the status write that they describe
    story = wait_for(lambda: (e := events(cluster, namespace, "app")) and any(
        x.startswith(c.REASON_APP_BUDGET) for x in e) and e, 30, "the budget event")  # fmt: skip
    assert any(e.startswith(c.REASON_BACKOFF) for e in story), story
    wait_for(lambda: not [p for p in job_pods(cluster, namespace, "app") if p.status.phase == "Running"], 60,
             "no worker left running after the failure")  # fmt: skip


def node_of(pods: list[Any], rank: str) -> str:
    return next(p.spec.node_name for p in pods if p.metadata.labels[c.LABEL_RANK] == rank)


@pytest.mark.timeout(300)
def test_killed_node_shrinks_the_job_and_resumes_from_the_checkpoint(cluster: Cluster, namespace: str) -> None:
    root = cluster.host_path(f"{HOST_DIR}/{namespace}-shrink")
    make_checkpoint(root, step=12)
    apply(cluster, job_manifest("shrink", namespace, replicas=4))
    pods = running_attempt(cluster, namespace, "shrink", 1, 4)
    assert injected_env(pods[0])[contract.RESUME_FROM] == f"{MOUNT}/{namespace}-shrink/step-0000000012"
    make_checkpoint(root, step=24)  # written "during" attempt 1
    (root / "step-0000000036").mkdir()  # a newer save that never finished: must not be used
    dead = node_of(pods, "2")
    killed_at = time.time()
    cluster.kill_node(dead)

    def detected() -> dict[str, Any] | None:
        status = get_job(cluster, namespace, "shrink").get("status", {})
        return status if status.get("restarts", {}).get("infrastructure") == 1 else None

    status = wait_for(detected, 60, "the node loss to be recorded")
    detected_after = time.time() - killed_at
    assert status["lastFailure"]["node"] == dead and status["lastFailure"]["reason"] == c.REASON_NODE_LOST
    new = running_attempt(cluster, namespace, "shrink", 2, 3)
    relaunched_after = time.time() - killed_at
    print(f"\nnode killed -> loss recorded {detected_after:.1f}s (timeout 4s), -> 3 workers running "
          f"{relaunched_after:.1f}s")  # fmt: skip
    assert all(p.spec.node_name != dead for p in new)
    env = injected_env(new[0])
    assert env[contract.NNODES] == "3"
    assert env[contract.RESUME_FROM] == f"{MOUNT}/{namespace}-shrink/step-0000000024"
    status = get_job(cluster, namespace, "shrink")["status"]
    assert status["resumedFrom"]["step"] == 24 and status["workers"] == "3/4"
    wait_for(lambda: any("restarted 4 -> 3 workers from step-0000000024" in e
                         for e in events(cluster, namespace, "shrink")), 30, "the restart event")  # fmt: skip


@pytest.mark.timeout(300)
def test_operator_restarted_mid_recovery_continues_without_duplicates(cluster: Cluster, namespace: str) -> None:
    apply(cluster, job_manifest("opr", namespace, replicas=3))
    pods = running_attempt(cluster, namespace, "opr", 1, 3)
    cluster.kill_node(node_of(pods, "0"))
    cluster.kubectl("delete", "pod", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/instance=" + RELEASE,
                    "--wait=false")  # fmt: skip
    new = running_attempt(cluster, namespace, "opr", 2, 3, timeout=150)
    assert len({p.metadata.name for p in new}) == 3
    status = get_job(cluster, namespace, "opr")["status"]
    assert status["attempt"] == 2 and status["restarts"]["infrastructure"] == 1


def make_checkpoint(root: Path, step: int) -> Path:
    """A real, complete DCP checkpoint in the job's root (written by this test process)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from resilient_trainer.layout import step_dir_name

    path = root / step_dir_name(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.full((8,), float(step))}, checkpoint_id=str(path))
    return path
