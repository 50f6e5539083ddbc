"""Holds that pin a recovery at one stage, so a fault (the operator frozen, killed, replaced) lands exactly there.

Shared by the chaos and HA suites. Each hold is something a cluster really does: a worker that takes seconds to
stop on SIGTERM, an init container that keeps a new pod Pending, a finalizer that keeps a deleted pod in the
API. Releasing the hold lets the recovery go on.
"""

from __future__ import annotations

from typing import Any

from e2e.localcluster.cluster import Cluster, wait_for
from e2e.support import (
    MOUNT,
    assert_consistent_status,
    assert_single_attempt,
    core,
    injected_env,
    job_pods,
    job_status,
    running_attempt,
)  # fmt: skip
from resilient_contract import environment
from resilient_operator import constants as c

HOLD_FINALIZER = "test.resilient.dev/hold"


def slow_stop_script(done_flag: str | None = None) -> str:
    """A stand-in that takes ~3 s to stop on SIGTERM (a trainer flushing), so fencing is observable;
    with `done_flag`, it exits 0 once that file exists (the job completes)."""
    wait = f"while [ ! -f {done_flag} ]; do sleep 0.3; done; exit 0" if done_flag else "while :; do sleep 0.3; done"
    return f"trap 'sleep 3; exit 143' TERM; {wait}"


def gated_start(flag: str, volume: str = "ckpt") -> dict[str, Any]:
    """An init container that holds the pod (Pending, so the attempt stays Starting) until `flag` exists."""
    return {"name": "gate", "image": "busybox", "command": ["sh", "-c", f"until [ -f {flag} ]; do sleep 0.2; done"],
            "volumeMounts": [{"name": volume, "mountPath": MOUNT}]}  # fmt: skip


def starting_with_all_pods(cl: Cluster, ns: str, name: str, attempt: int, replicas: int) -> list[Any] | None:
    """The attempt's pods when the job is Starting it with all of them created (held by a gate), else None."""
    st = job_status(cl, ns, name)
    new = [p for p in job_pods(cl, ns, name) if p.metadata.labels[c.LABEL_ATTEMPT] == str(attempt)]
    return new if st.get("phase") == c.STARTING and st.get("attempt") == attempt and len(new) == replicas else None


def wait_starting_with_all_pods(cl: Cluster, ns: str, name: str, attempt: int, replicas: int,
                                timeout: float = 90) -> list[Any]:  # fmt: skip
    return wait_for(lambda: starting_with_all_pods(cl, ns, name, attempt, replicas), timeout,
                    f"attempt {attempt} Starting with its {replicas} pods created (held by the gate)")  # fmt: skip


def hold_pod(cl: Cluster, ns: str, pod: str) -> None:
    """A finalizer: once deleted, the pod stays in the API (Terminating) until `release_pod`, so its attempt's
    fence cannot complete."""
    core(cl).patch_namespaced_pod(pod, ns, {"metadata": {"finalizers": [HOLD_FINALIZER]}})


def release_pod(cl: Cluster, ns: str, pod: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core(cl).patch_namespaced_pod(pod, ns, {"metadata": {"finalizers": None}})
    except ApiException as exc:
        if exc.status != 404:
            raise


def first_delete(cl: Cluster, ns: str, name: str, attempt: int) -> None:
    """Delete rank 1 of `attempt` (a worker lost: the operator restarts the gang)."""
    victim = next(p for p in job_pods(cl, ns, name) if p.metadata.labels[c.LABEL_ATTEMPT] == str(attempt)
                  and p.metadata.labels[c.LABEL_RANK] == "1")  # fmt: skip
    core(cl).delete_namespaced_pod(victim.metadata.name, ns)


def check_recovered(cl: Cluster, ns: str, name: str, attempt: int, replicas: int, step: int) -> dict[str, Any]:
    """`attempt` runs `replicas` workers resumed from `step`, alone, and the status counts each restart once."""
    pods = running_attempt(cl, ns, name, attempt, replicas, timeout=150)
    assert_single_attempt(cl, ns, name, attempt, replicas)
    for pod in pods:
        env = injected_env(pod)
        assert env[environment.NNODES] == str(replicas) and env[environment.ATTEMPT] == str(attempt)
        assert env[environment.RESUME_FROM] == f"{MOUNT}/{ns}/{name}/step-{step:010d}"
    status = job_status(cl, ns, name)
    assert_consistent_status(status)
    assert status["restarts"]["infrastructure"] == attempt - 1 and status["resumedFrom"]["step"] == step
    return status
