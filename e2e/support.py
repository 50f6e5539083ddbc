"""What the operator's cluster tests share: an installed operator, job manifests, waits and reads.

The operator is installed once per session with helm, as a platform team would, and runs as its pod
with only its ServiceAccount's rights. Training nodes form a pool (label pool=train, one fake GPU
each) so a job's capacity is exactly the number of live pool nodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import ClusterLike, HasNetns, Partitionable, RestartableControlPlane, wait_for
from e2e.controlplane.binaries import REPO_ROOT
from resilient_contract import environment
from resilient_contract.storage import step_dir_name
from resilient_operator import constants as c

ROOT = REPO_ROOT
CHART = ROOT / "charts" / "resilient-training-operator"
RELEASE = "rtj"
OPERATOR_NS = "rtj-system"
MOUNT = "/checkpoints"
NODES = ("w0", "w1", "w2", "w3")
HOST_DIR = "/rtj-checkpoints"  # a hostPath shared by every simulated node: the RWX checkpoint volume


def helm_install(cluster: ClusterLike, values: dict[str, str], *, wait: str = "120s",
                 timeout: float = 300) -> None:
    """`helm install` the chart as release RELEASE into OPERATOR_NS (which must exist) with these `--set`s."""
    sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    cluster.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--wait", "--timeout", wait, *sets,
                 timeout=timeout)


def shared_dir(cluster: ClusterLike) -> Path:
    """HOST_DIR on this machine, writable by every user: workers run as their image's non-root user and
    each job gets its own root inside."""
    shared = cluster.host_path(HOST_DIR)
    shared.mkdir(parents=True, exist_ok=True)
    shared.chmod(0o1777)
    return shared


def install_operator(cluster: ClusterLike, *, pool: tuple[str, ...] = NODES, values: dict[str, str] | None = None,
                     wait: str = "120s") -> ClusterLike:
    """The cluster plus a pool of one-GPU training nodes, a node for the operator, and the operator on it:
    the chart with the shared hostPath as checkpoint storage, plus `values` (by default a DEBUG log, which
    the suites read). Every install of the operator on a process-node cluster goes through here."""
    for name in pool:
        cluster.add_node(name, cpu="4", memory="8Gi", gpus=1, labels={"pool": "train"})
    cluster.add_node("infra", cpu="4", memory="8Gi", labels={"role": "infra"})
    shared_dir(cluster)
    cluster.kubectl("create", "namespace", OPERATOR_NS)
    helm_install(cluster, {"checkpointStorage.hostPath": HOST_DIR, "checkpointStorage.mountPath": MOUNT,
                           "nodeSelector.role": "infra", **({"logLevel": "DEBUG"} if values is None else values)},
                 wait=wait)
    return cluster


def custom(cl: ClusterLike) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(cl.api_client())


def core(cl: ClusterLike) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cl.api_client())


def get_job(cl: ClusterLike, ns: str, name: str) -> dict[str, Any]:
    return custom(cl).get_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL, name)


def job_pods(cl: ClusterLike, ns: str, name: str) -> list[Any]:
    return core(cl).list_namespaced_pod(ns, label_selector=f"{c.LABEL_JOB}={name}").items


def worker_script(fail_rank: int | None = None, code: int = 3) -> str:
    """Record the injected environment, then idle (or fail with `code` on one rank)."""
    record = f'env | grep -E "^(PET_|RTJ_|MASTER_)" > {MOUNT}/$RTJ_JOB_NAME-$(hostname).env;'
    if fail_rank is None:
        return record + " exec sleep 3600"
    return record + f' if [ "$PET_NODE_RANK" = "{fail_rank}" ]; then sleep 1; exit {code}; fi; exec sleep 3600'


def job_manifest(name: str, ns: str, replicas: int = 3, min_replicas: int = 2, script: str | None = None,
                 **spec: Any) -> dict[str, Any]:  # fmt: skip
    """A job of busybox shells (no agent). restartStrategy Recreate unless `spec` says otherwise: under the
    default, InPlace, every recovery would first find no agent in the kept pods and replace them."""
    body: dict[str, Any] = {
        "replicas": replicas,
        "restartStrategy": c.RestartStrategy.RECREATE.value,
        "elasticPolicy": {"minReplicas": min_replicas},
        "checkpoint": {"root": f"{MOUNT}/{ns}/{name}"},
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


def scratch_namespace(cluster: ClusterLike, name: str | None = None, prefix: str = "t") -> Iterator[str]:
    """A fixture's namespace: `name` (or `<prefix>-<random>`) created, ready for pods, deleted afterwards
    without waiting."""
    ns = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for_default_sa(ns)
    yield ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def job_namespace(cluster: ClusterLike, request: pytest.FixtureRequest) -> Iterator[str]:
    # readable, and unique per parametrized case (the next case starts while the last one's namespace goes)
    digest = hashlib.sha1(request.node.name.encode()).hexdigest()[:6]
    readable = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:36].strip("-")
    ns = f"t-{readable}-{digest}"
    yield from scratch_namespace(cluster, ns)
    if isinstance(cluster, Partitionable):  # a test that froze an agent must not freeze the next
        for node in cluster.partitioned_nodes():
            cluster.heal_node(node)
    for node in NODES:  # leave every node alive for the next test
        if cluster.is_killed(node):
            cluster.restore_node(node)
    # Pods of a deleted namespace go with it; wait so the next test sees all capacity. After an API-server
    # restart the controller-manager's namespace controller can take a minute to act (seen in CI: 60 s).
    wait_for(lambda: not [p for p in core(cluster).list_pod_for_all_namespaces(
        label_selector=c.LABEL_JOB).items if p.metadata.namespace == ns], 180, f"pods of {ns} gone")  # fmt: skip


def apply(cl: ClusterLike, manifest: dict[str, Any]) -> None:
    cl.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def running_attempt(cl: ClusterLike, ns: str, name: str, attempt: int, replicas: int, timeout: float = 90) -> list[Any]:
    """Wait until exactly `replicas` pods of `attempt` run, no other pods exist, and status says Running."""

    def check() -> list[Any] | None:
        pods = job_pods(cl, ns, name)
        ours = [p for p in pods if p.metadata.labels[c.LABEL_ATTEMPT] == str(attempt)]
        if len(pods) != replicas or len(ours) != replicas or any(p.status.phase != "Running" for p in ours):
            return None
        status = get_job(cl, ns, name).get("status", {})
        return ours if status.get("phase") == c.RUNNING and status.get("attempt") == attempt else None

    return wait_for(check, timeout, f"attempt {attempt} of {ns}/{name} running {replicas} workers")


def events(cl: ClusterLike, ns: str, name: str) -> list[str]:
    items = core(cl).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [f"{e.reason}: {e.message}" for e in sorted(items, key=lambda e: e.metadata.creation_timestamp)]


def injected_env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.name in environment.ALL_NAMES}


def node_of(pods: list[Any], rank: str) -> str:
    return next(p.spec.node_name for p in pods if p.metadata.labels[c.LABEL_RANK] == rank)


def make_checkpoint(root: Path, step: int) -> Path:
    """A real, complete DCP checkpoint in the job's root (written by this test process)."""
    import torch
    import torch.distributed.checkpoint as dcp

    path = root / step_dir_name(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.full((8,), float(step))}, checkpoint_id=str(path))
    return path


# ---- fault injection and operator introspection (chaos and security tests) --------------------------
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


LEASE_NAME = f"{RELEASE}-resilient-training-operator"  # the leader Lease (the chart's fullname), in OPERATOR_NS


def operator_pods(cl: ClusterLike) -> list[Any]:
    """The operator's live pods (not terminating): the leader and its standbys."""
    pods = core(cl).list_namespaced_pod(OPERATOR_NS, label_selector=OPERATOR_SELECTOR).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def leader_lease(cl: ClusterLike) -> Any:
    """The operators' leader Lease (coordination.k8s.io/v1), or None before the first election."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.CoordinationV1Api(cl.api_client()).read_namespaced_lease(LEASE_NAME, OPERATOR_NS)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def leader_name(cl: ClusterLike) -> str | None:
    """The pod the leader Lease names (holderIdentity), or None (no Lease, or released)."""
    lease = leader_lease(cl)
    return (lease.spec.holder_identity or None) if lease is not None else None


def operator_pod(cl: ClusterLike) -> Any:
    """The leading operator's live pod: the one the leader Lease names; with none of the live pods named
    (before the first election, or while a deleted leader's Lease runs out) the only live pod if there is
    exactly one (a one-replica install); else None."""
    name = leader_name(cl)
    pods = operator_pods(cl)
    named = next((p for p in pods if p.metadata.name == name), None) if name else None
    return named if named is not None else (pods[0] if len(pods) == 1 else None)


def standby_pods(cl: ClusterLike) -> list[Any]:
    """The live operator pods that do not lead."""
    name = leader_name(cl)
    return [p for p in operator_pods(cl) if p.metadata.name != name]


def pod_pid(pod: Any) -> int | None:
    """The pid of a pod's (first) running container on this machine (containerID names the pid)."""
    statuses = (pod.status.container_statuses or []) if pod else []
    if not statuses or not statuses[0].state.running or not statuses[0].container_id:
        return None
    return int(statuses[0].container_id.rsplit("/", 1)[-1])


def operator_pid(cl: ClusterLike) -> int | None:
    """The leading operator process's pid on this machine (pods are processes)."""
    return pod_pid(operator_pod(cl))


def operator_restarts(cl: ClusterLike) -> int:
    pod = operator_pod(cl)
    return sum(s.restart_count for s in (pod.status.container_statuses or [])) if pod else 0


def operator_replicas(cl: ClusterLike) -> int:
    """The replicas the operator's Deployment asks for."""
    from kubernetes import client

    apps = client.AppsV1Api(cl.api_client())
    deployments = apps.list_namespaced_deployment(OPERATOR_NS, label_selector=OPERATOR_SELECTOR).items
    return int(deployments[0].spec.replicas) if deployments else 1


def wait_operator_ready(cl: ClusterLike, timeout: float = 120) -> Any:
    """Until every replica the Deployment asks for runs a live process and one of them holds the leader
    Lease; returns the leader's pod."""

    def ready() -> Any:
        pods = operator_pods(cl)
        if len(pods) < operator_replicas(cl) or any(p.status.phase != "Running" or pod_pid(p) is None for p in pods):
            return None
        pod = operator_pod(cl)
        return pod if pod is not None and pod_pid(pod) is not None else None

    return wait_for(ready, timeout, "the operator pods running, one of them leading")


def crash_operator(cl: ClusterLike) -> int:
    """SIGKILL the leading operator process (a crash: no cleanup); its pod restarts the container, which
    takes its own Lease back (or a standby takes it once it expires). Old pid."""

    pod = wait_for(lambda: (p := operator_pod(cl)) is not None and pod_pid(p) is not None and p, 60,
                   "the leading operator process")  # fmt: skip
    pid, name = pod_pid(pod), pod.metadata.name
    assert pid is not None
    before = sum(s.restart_count for s in (pod.status.container_statuses or []))

    def restarted() -> bool:
        same = next((p for p in operator_pods(cl) if p.metadata.name == name), None)
        again = same is None or sum(s.restart_count for s in (same.status.container_statuses or [])) > before
        return again and operator_pid(cl) not in (None, pid)

    os.kill(pid, signal.SIGKILL)
    wait_for(restarted, 90, "the operator container restarted and a leader running")
    return int(pid)


def replace_operator_pods(cl: ClusterLike, *, leading: bool = True) -> list[str]:
    """Delete every replica's pod (gracefully: the leader releases its Lease) and wait until the Deployment's new
    ones run their processes (and, if `leading`, one of them leads): fresh processes under the cluster's current
    RBAC. Unlike killing the processes, no container restart and so no crash-loop backoff: it doubles with each
    restart of the same container (to 10 s here, as the kubelet's does to 5 min), and a sweep of restarts would
    pay it every time. Returns the new pods' names."""
    old = {p.metadata.name for p in operator_pods(cl)}
    cl.kubectl("delete", "pod", "-n", OPERATOR_NS, *sorted(old), "--wait=false")

    def running() -> list[str] | None:
        pods = operator_pods(cl)
        fresh = len(pods) >= operator_replicas(cl) and not old & {p.metadata.name for p in pods}
        return [p.metadata.name for p in pods] if fresh and all(pod_pid(p) for p in pods) else None

    names = wait_for(running, 90, "new operator pods running")
    if leading:
        wait_operator_ready(cl)
    return names


def delete_operator_pod(cl: ClusterLike) -> None:
    """Force-delete the leading operator's pod (no grace): the Deployment makes a new one, and a live
    replica leads (a standby at once, after the Lease expires; with one replica, the new pod)."""
    old = wait_for(lambda: operator_pod(cl), 60, "the operator pod").metadata.name
    cl.kubectl("delete", "pod", "-n", OPERATOR_NS, old, "--grace-period=0", "--force", "--wait=false")
    wait_for(lambda: (p := operator_pod(cl)) is not None and p.metadata.name != old, 60, "a new operator pod")


def operator_log(cl: ClusterLike) -> str:
    pod = operator_pod(cl)
    return cl.pod_log(OPERATOR_NS, pod.metadata.name) if pod else ""


def process_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def operator_metrics(cl: ClusterLike, timeout: float = 5, pod: Any = None) -> str:
    """The leading operator's Prometheus text (or `pod`'s), scraped from its pod IP (port 8080) as Prometheus
    would."""
    import urllib.request

    pod = pod if pod is not None else operator_pod(cl)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/metrics", timeout=timeout) as resp:
            return str(resp.read().decode())

    # Pod addresses live inside the local cluster's network namespace; kind's are routed from the host.
    return str(cl.in_netns(scrape, timeout=timeout + 5)) if isinstance(cl, HasNetns) else scrape()


def metric_samples(text: str, name: str) -> dict[str, float]:
    """`{series-with-labels: value}` for the samples of one metric family in Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def api_ready(cl: ClusterLike) -> bool:
    res = cl.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
    return res.returncode == 0 and res.stdout.strip() == "ok"


def restart_component(cl: ClusterLike, name: str, down_seconds: float = 0.0, timeout: float = 120) -> None:
    """Stop a control-plane process and start it again with the same flags (the harness does it)."""
    assert isinstance(cl, RestartableControlPlane), f"{type(cl).__name__} cannot restart its control plane"
    cl.restart_component(name, down_seconds=down_seconds, timeout=timeout)


def signal_component(cl: ClusterLike, name: str, sig: int) -> None:
    """SIGSTOP/SIGCONT a control-plane process (e.g. etcd frozen: the API server cannot reach storage)."""
    assert isinstance(cl, RestartableControlPlane), f"{type(cl).__name__} cannot signal its control plane"
    cl.signal_component(name, sig)


def pause_node_agent(cl: ClusterLike, node: str) -> None:
    """Freeze only the node's agent: heartbeats (Lease, status) stop, its pods keep running."""
    assert isinstance(cl, Partitionable), f"{type(cl).__name__} cannot partition a node"
    cl.partition_node(node)


def resume_node_agent(cl: ClusterLike, node: str) -> None:
    assert isinstance(cl, Partitionable), f"{type(cl).__name__} cannot partition a node"
    cl.heal_node(node)


def lease_age(cl: ClusterLike, node: str) -> float:
    """Seconds since the node's Lease was last renewed."""
    from datetime import UTC, datetime

    from kubernetes import client

    lease = client.CoordinationV1Api(cl.api_client()).read_namespaced_lease(node, "kube-node-lease")
    return (datetime.now(UTC) - lease.spec.renew_time).total_seconds()


def job_status(cl: ClusterLike, ns: str, name: str) -> dict[str, Any]:
    return dict(get_job(cl, ns, name).get("status") or {})


def job_statuses(cl: ClusterLike, ns: str) -> dict[str, dict[str, Any]]:
    """Every job's status in a namespace, in one list call (many-job tests and the scale bench)."""
    items = custom(cl).list_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL)["items"]
    return {i["metadata"]["name"]: dict(i.get("status") or {}) for i in items}


def wait_phase(cl: ClusterLike, ns: str, name: str, phases: str | tuple[str, ...],
               timeout: float = 90) -> dict[str, Any]:
    """Until status.phase is one of `phases`; returns the status."""
    wanted = (phases,) if isinstance(phases, str) else phases

    def check() -> dict[str, Any] | None:
        st = job_status(cl, ns, name)
        return st if st.get("phase") in wanted else None

    return wait_for(check, timeout, f"{ns}/{name} in phase {'/'.join(wanted)}", interval=0.1)


def assert_single_attempt(cl: ClusterLike, ns: str, name: str, attempt: int, replicas: int) -> list[Any]:
    """Exactly one attempt's pods, one per rank, no duplicates, no stragglers of another attempt."""
    pods = job_pods(cl, ns, name)
    ranks = sorted(int(p.metadata.labels[c.LABEL_RANK]) for p in pods)
    attempts = {p.metadata.labels[c.LABEL_ATTEMPT] for p in pods}
    assert attempts == {str(attempt)}, f"pods of attempts {attempts}: {[p.metadata.name for p in pods]}"
    assert ranks == list(range(replicas)), f"ranks {ranks}, want 0..{replicas - 1}"
    return pods


def assert_consistent_status(status: dict[str, Any]) -> None:
    """History matches the attempt counter and the restart budgets: nothing lost, nothing doubled."""
    history = status.get("history") or []
    attempts = [h["attempt"] for h in history]
    assert attempts == sorted(set(attempts)), f"history has duplicate/out-of-order attempts: {attempts}"
    assert attempts and attempts[-1] == status["attempt"], (attempts, status["attempt"])
    assert all("endTime" in h for h in history[:-1]), history
    restarts = status["restarts"]
    total = restarts["infrastructure"] + restarts["application"] + restarts["planned"]
    assert total == status["attempt"] - 1 == status["restartCount"], (restarts, status["attempt"])


def tiny_job(name: str, ns: str, script: str = "exec sleep 3600", replicas: int = 1, **spec: Any) -> dict[str, Any]:
    """A job whose workers request no GPU (many fit on a node): for load and input tests."""
    m = job_manifest(name, ns, replicas=replicas, min_replicas=1, script=script, **spec)
    ctr = m["spec"]["template"]["spec"]["containers"][0]
    ctr["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"}}
    return m
