"""Drains on the local cluster: the gang moves off a cordoned/drained node at the step it was at.

The example trainer's SIGTERM path saves a checkpoint at its current step (RTJ_PREEMPTED); the operator's
planned restart resumes from exactly that step on the other pool nodes, so no step is trained twice. The
goodput the operator reports for the interruption is checked against the time the harness measured.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from e2e import scenarios
from e2e.cluster import ClusterLike, wait_for
from e2e.support import events, get_job, job_pods, node_of, running_attempt
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]
PREEMPTED = re.compile(r"^RTJ_PREEMPTED step=(\d+)", re.M)


def submit(cluster: ClusterLike, ns: str, name: str) -> dict[str, Any]:
    scenarios.shared_claim(cluster, ns)
    # 3 of the 4 pool nodes: the restart without the drained node still has full size; checkpoints are rare,
    # so any step not recomputed is the SIGTERM checkpoint's doing.
    job = scenarios.example_job(name, ns, replicas=3, min_replicas=2, steps=400, checkpoint_every=100,
                                step_delay=0.2, grow_back=False)
    cluster.apply(job)
    return job


def log_of(cluster: ClusterLike, ns: str, pod: str) -> str:
    return scenarios.trainer_log(cluster, ns, pod)


def wait_steps(cluster: ClusterLike, ns: str, pod: str, steps: int, timeout: float = 120) -> None:
    wait_for(lambda: len(re.findall(r"^RTJ_STEP ", log_of(cluster, ns, pod), re.M)) >= steps, timeout,
             f"{steps} steps in {pod}")


def started(cluster: ClusterLike, ns: str, name: str) -> list[Any]:
    """The job submitted, its first attempt running and past step 5; its pods."""
    submit(cluster, ns, name)
    old = running_attempt(cluster, ns, name, 1, 3, timeout=180)
    wait_steps(cluster, ns, old[0].metadata.name, 5)
    return old


def moved_at_its_step(cluster: ClusterLike, ns: str, name: str, old: list[Any], node: str, t0: float) -> dict[str, Any]:
    """The new attempt runs without `node`, resumed from the step the old one was stopped at, and its
    goodput matches what the harness saw. Returns the figures."""
    new = running_attempt(cluster, ns, name, 2, 3, timeout=180)
    assert node not in {p.spec.node_name for p in new}
    rank0_old = next(p.metadata.name for p in old if p.metadata.labels[c.LABEL_RANK] == "0")
    stopped = PREEMPTED.search(log_of(cluster, ns, rank0_old))
    assert stopped, "the old gang did not take the SIGTERM checkpoint path"
    status = get_job(cluster, ns, name)["status"]
    assert status["resumedFrom"]["step"] == int(stopped.group(1))
    assert status["restarts"] == {"infrastructure": 0, "application": 0, "planned": 1}
    rank0 = next(p.metadata.name for p in new if p.metadata.labels[c.LABEL_RANK] == "0")
    first = rf"^RTJ_STEP step={int(stopped.group(1)) + 1}\b"
    wait_for(lambda: re.search(first, log_of(cluster, ns, rank0), re.M), 120, "the first step after the restart")
    t1 = time.monotonic()

    def closed() -> dict[str, Any] | None:
        gp = get_job(cluster, ns, name)["status"].get("goodput") or {}
        return gp if gp.get("recoveries") == 1 else None

    gp = wait_for(closed, 60, "the recovery accounted in status.goodput")
    lost = sum(gp["lost"].values())
    truth = t1 - t0
    print(f"\ndrain of {node}: stopped at step {stopped.group(1)}, resumed at {status['resumedFrom']['step']}, "
          f"steps recomputed {gp['stepsRecomputed']}; lost {lost:.1f}s by stage {gp['lost']} vs "
          f"{truth:.1f}s measured by the harness (cordon -> first new step)")
    assert gp["stepsRecomputed"] == 0 and gp["lost"]["recompute"] == 0
    # the harness polls logs every ~0.1 s and the operator stamps whole milliseconds: a few seconds at most
    assert abs(lost - truth) <= 4.0, (lost, truth)
    assert any(e.startswith(c.REASON_DRAIN) and node in e for e in events(cluster, ns, name))
    return gp


@pytest.mark.timeout(420)
def test_cordon_moves_the_gang_at_its_current_step(cluster: ClusterLike, job_ns: str) -> None:
    ns, name = job_ns, "cordon"
    old = started(cluster, ns, name)
    node = node_of(old, "1")
    t0 = time.monotonic()
    cluster.kubectl("cordon", node)
    try:
        moved_at_its_step(cluster, ns, name, old, node, t0)
    finally:
        cluster.kubectl("uncordon", node)


@pytest.mark.timeout(420)
def test_kubectl_drain_completes_and_the_job_continues_from_its_step(cluster: ClusterLike, job_ns: str) -> None:
    ns, name = job_ns, "drain"
    old = started(cluster, ns, name)
    pdbs = cluster.kubectl("get", "pdb", "-n", ns, "-o", "name").stdout.split()
    assert pdbs == [f"poddisruptionbudget.policy/{name}-a1"]
    node = node_of(old, "2")
    t0 = time.monotonic()
    try:
        drained = cluster.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=150s",
                                  check=False, timeout=180)
        assert drained.returncode == 0, drained.stderr
        assert not [p for p in job_pods(cluster, ns, name) if p.spec.node_name == node]
        moved_at_its_step(cluster, ns, name, old, node, t0)
        wait_for(lambda: cluster.kubectl("get", "pdb", "-n", ns, "-o", "name").stdout.split()
                 == [f"poddisruptionbudget.policy/{name}-a2"], 30, "the old attempt's budget released")
    finally:
        cluster.kubectl("uncordon", node)
