"""Drains on the local cluster: the gang moves off a cordoned/drained node at the step it was at.

The example trainer's SIGTERM path saves a checkpoint at its current step (RTJ_PREEMPTED); the operator's
planned restart resumes from exactly that step on the other pool nodes, so no step is trained twice. The
goodput the operator reports for the interruption is checked against the time the harness measured.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e import scenarios
from e2e.cluster import ClusterLike, wait_for
from e2e.support import get_job, node_of, running_attempt
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]


def submit(cluster: ClusterLike, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    scenarios.shared_claim(cluster, ns)
    # 3 of the 4 pool nodes: the restart without the drained node still has full size; checkpoints are rare,
    # so any step not recomputed is the SIGTERM checkpoint's doing.
    job = scenarios.example_job(name, ns, replicas=3, min_replicas=2, steps=400, checkpoint_every=100,
                                step_delay=0.2, grow_back=False, **spec)
    cluster.apply(job)
    return job


def started(cluster: ClusterLike, ns: str, name: str, **spec: Any) -> list[Any]:
    """The job submitted, its first attempt running and past step 5; its pods."""
    submit(cluster, ns, name, **spec)
    old = running_attempt(cluster, ns, name, 1, 3, timeout=180)
    scenarios.wait_steps(cluster, ns, old[0].metadata.name, 5)
    return old


@pytest.mark.timeout(420)
def test_cordon_moves_the_gang_at_its_current_step(cluster: ClusterLike, job_ns: str) -> None:
    ns, name = job_ns, "cordon"
    cordon_and_move(cluster, ns, name, started(cluster, ns, name))


def cordon_and_move(cluster: ClusterLike, ns: str, name: str, old: list[Any]) -> str:
    """Cordon rank 1's node; the gang moves at its step (scenarios.moved_at_its_step); uncordoned after."""
    node = node_of(old, "1")
    t0 = time.monotonic()
    cluster.kubectl("cordon", node)
    try:
        scenarios.moved_at_its_step(cluster, ns, name, old, node, t0)
    finally:
        cluster.kubectl("uncordon", node)
    return node


@pytest.mark.timeout(420)
def test_cordon_in_place_replaces_only_the_cordoned_pod_and_moves_at_its_step(cluster: ClusterLike,
                                                                              job_ns: str) -> None:
    """restartStrategy InPlace: only the cordoned node's pod is deleted; its SIGTERM stops the whole gang at its
    step (every rank saves), the two other pods (same uids) take the plan once that checkpoint is complete,
    and one new pod takes the third rank on the free pool node: no step trained twice."""
    ns, name = job_ns, "cordon-in-place"
    old = started(cluster, ns, name, restartStrategy=c.RestartStrategy.IN_PLACE.value)
    others = {p.metadata.name: p.metadata.uid for p in old if p.spec.node_name != node_of(old, "1")}
    cordon_and_move(cluster, ns, name, old)
    now = {p.metadata.name: p.metadata.uid for p in running_attempt(cluster, ns, name, 2, 3)}
    assert {n: now.get(n) for n in others} == others  # the same pods carry on
    entry = next(e for e in get_job(cluster, ns, name)["status"]["history"] if e["attempt"] == 2)
    assert entry["restart"] == "InPlace" and entry["kept"] == sorted(others), entry


@pytest.mark.timeout(420)
def test_kubectl_drain_completes_and_the_job_continues_from_its_step(cluster: ClusterLike, job_ns: str) -> None:
    ns, name = job_ns, "drain"
    old = started(cluster, ns, name)
    pdbs = cluster.kubectl("get", "pdb", "-n", ns, "-o", "name").stdout.split()
    assert pdbs == [f"poddisruptionbudget.policy/{name}-a1"]
    node = node_of(old, "2")
    t0 = time.monotonic()
    try:
        scenarios.drain(cluster, ns, name, node)
        scenarios.moved_at_its_step(cluster, ns, name, old, node, t0)
        wait_for(lambda: cluster.kubectl("get", "pdb", "-n", ns, "-o", "name").stdout.split()
                 == [f"poddisruptionbudget.policy/{name}-a2"], 30, "the old attempt's budget released")
    finally:
        cluster.kubectl("uncordon", node)
