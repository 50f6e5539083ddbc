"""One node loss under the example job, timed stage by stage: the run the recovery and failover benchmarks repeat.

A fresh namespace, the example job (4 workers, min 2, node-loss timeout 4 s), the first complete checkpoint,
then SIGKILL of rank 1's node (after `before_kill`, if given: another fault at the same moment). Stages are
seconds after the kill (e2e.scenarios.Timeline). The namespace is deleted and the node restored afterwards.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e import scenarios, support
from e2e.localcluster.cluster import wait_for


def new_namespace(cluster: Any, ns: str) -> str:
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for_default_sa(ns)
    return ns


def one_run(cluster: Any, ns: str, before_kill: Callable[[], None] | None = None) -> scenarios.Timeline:
    new_namespace(cluster, ns)
    scenarios.shared_claim(cluster, ns)
    job = scenarios.example_job("bench", ns, steps=400, checkpoint_every=5, step_delay=0.3)
    cluster.apply(job)
    pods = support.running_attempt(cluster, ns, "bench", 1, 4, timeout=300)
    scenarios.first_complete_checkpoint(cluster, job)
    if before_kill is not None:
        before_kill()
    timeline = scenarios.kill_and_time(cluster, ns, "bench", support.node_of(pods, "1"))
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    cluster.restore_node(timeline.node)
    wait_for(lambda: not support.job_pods(cluster, ns, "bench"), 120, "bench pods gone")
    return timeline


def stage_stats(runs: list[scenarios.Timeline], stage: str) -> tuple[float, float, float]:
    """(median, min, max) of one stage over runs."""
    values = [getattr(r, stage) for r in runs]
    return statistics.median(values), min(values), max(values)


def load_average() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
