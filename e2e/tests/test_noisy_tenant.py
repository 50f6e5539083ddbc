"""A noisy tenant costs another tenant's job at most 2 s to launch and to restart after a node loss (issue 25).

The noise, as the issue found it: ten jobs that can never fit (64 workers at minimum, so WaitingForCapacity:
no pods, no quota) whose roots hold a `.metadata` that costs about a third of the discovery deadline to reject
(a long run of cheap pickle opcodes ending in one that does not exist). Such jobs are looked at again on every
node Lease renewal. The good job's launch and restart are timed beside quiet runs of the same job (the best
of two each).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import support
from e2e.cluster import ClusterLike
from e2e.localcluster.cluster import wait_for
from e2e.support import HOST_DIR, apply, get_job, job_manifest, job_pods, make_checkpoint, node_of, running_attempt
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from resilient_contract import dcp_metadata
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]
HOSTILE_JOBS = 10
DISCOVERY_DEADLINE = 5.0  # the chart's default discovery.timeoutSeconds
SLACK = 2.0  # what the issue allows the noise to cost
# Each figure is the best of this many runs: the hostile jobs are there for every noisy run, so what they cost
# shows in each, while a burst of load from the lane beside (a kind cluster starting) hits one run, not both
# (one run each once failed with restarts of 4.0 s quiet and 6.1 s noisy, the noisy one during such a burst).
TRIALS = 2


@pytest.fixture
def noisy_namespace(cluster: ClusterLike) -> Iterator[str]:
    yield from support.scratch_namespace(cluster, prefix="t-noisy")


def costly_rejection(seconds: float) -> bytes:
    pairs = 200_000
    start = time.monotonic()
    with contextlib.suppress(dcp_metadata.MalformedMetadata):
        dcp_metadata.storage_entries(b"\x80\x04" + b"N0" * pairs + b"\xfe", dcp_metadata.Limits())
    per_pair = max((time.monotonic() - start) / pairs, 1e-7)
    return b"\x80\x04" + b"N0" * int(seconds / per_pair) + b"\xfe"


def launch_and_restart(cluster: ClusterLike, host: Path, ns: str, name: str) -> tuple[float, float]:
    """Seconds from apply to both workers running, and from a node kill to attempt 2 running."""
    make_checkpoint(host / ns / name, step=7)
    started = time.monotonic()
    apply(cluster, job_manifest(name, ns, replicas=2, min_replicas=1))
    pods = running_attempt(cluster, ns, name, 1, 2, timeout=120)
    launch = time.monotonic() - started
    victim = node_of(pods, "1")
    killed = time.monotonic()
    cluster.kill_node(victim)

    def relaunched() -> list[Any] | None:
        status = get_job(cluster, ns, name).get("status") or {}
        if status.get("attempt") != 2 or status.get("phase") != c.RUNNING:
            return None
        new = [p for p in job_pods(cluster, ns, name) if p.metadata.labels[c.LABEL_ATTEMPT] == "2"]
        return new if new and all(p.status.phase == "Running" for p in new) else None

    wait_for(relaunched, 120, f"{ns}/{name} running again as attempt 2")
    restart = time.monotonic() - killed
    cluster.kubectl("delete", c.PLURAL, name, "-n", ns, "--wait=false")
    cluster.restore_node(victim)
    wait_for(lambda: not job_pods(cluster, ns, name), 120, f"{ns}/{name}'s pods gone")
    return launch, restart


def best_of(trials: int, run: Callable[[int], tuple[float, float]]) -> tuple[float, float]:
    """The fastest launch and the fastest restart over `trials` runs."""
    results = [run(i) for i in range(trials)]
    return min(r[0] for r in results), min(r[1] for r in results)


@pytest.mark.timeout(900)
def test_a_noisy_namespace_costs_a_good_job_at_most_2s(
    cluster: ClusterLike, namespace: str, noisy_namespace: str,
) -> None:
    host = cluster.host_path(HOST_DIR)
    quiet = best_of(TRIALS, lambda i: launch_and_restart(cluster, host, namespace, f"quiet{i}"))
    payload = costly_rejection(DISCOVERY_DEADLINE / 3)
    for i in range(HOSTILE_JOBS):
        step = host / noisy_namespace / f"h{i}" / "step-0000000010"
        step.mkdir(parents=True)
        (step / ".metadata").write_bytes(payload)
        apply(cluster, job_manifest(f"h{i}", noisy_namespace, replicas=64, min_replicas=64))
    wait_for(lambda: all((get_job(cluster, noisy_namespace, f"h{i}").get("status") or {}).get("phase")
                         == c.WAITING_FOR_CAPACITY for i in range(HOSTILE_JOBS)), 120,
             "every hostile job waiting for capacity")  # fmt: skip
    noisy = best_of(TRIALS, lambda i: launch_and_restart(cluster, host, namespace, f"noisy{i}"))
    print(f"\nquiet: launch {quiet[0]:.1f}s, restart {quiet[1]:.1f}s; beside {HOSTILE_JOBS} hostile jobs: "
          f"launch {noisy[0]:.1f}s, restart {noisy[1]:.1f}s")
    assert noisy[0] <= quiet[0] + SLACK, (quiet, noisy)
    assert noisy[1] <= quiet[1] + SLACK, (quiet, noisy)
