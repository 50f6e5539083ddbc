"""Recovery timeline benchmark: kill a node under a training job, several times, print the medians.

Each repetition: a fresh namespace, the example job (4 workers, min 2, node-loss timeout 4 s), the
first complete checkpoint, then SIGKILL of one worker's node. Stages are seconds after the kill:
loss detected (status records it) -> broken attempt fenced (its pods gone) -> new pods running ->
checkpoint loaded (trainer log) -> first training step done. The stock path for comparison:
node-monitor-grace-period (50 s) + NoExecute toleration (300 s) before pods are even evicted.

    python bench/recovery_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e import get_cluster, scenarios, support
from e2e.localcluster.cluster import wait_for


def one_run(cluster: Any, index: int) -> scenarios.Timeline:
    ns = f"bench-{index}"
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for_default_sa(ns)
    scenarios.shared_claim(cluster, ns)
    job = scenarios.example_job("bench", ns, steps=400, checkpoint_every=5, step_delay=0.3)
    cluster.apply(job)
    pods = support.running_attempt(cluster, ns, "bench", 1, 4, timeout=300)
    scenarios.first_complete_checkpoint(cluster, job)
    timeline = scenarios.kill_and_time(cluster, ns, "bench", support.node_of(pods, "1"))
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    cluster.restore_node(timeline.node)
    wait_for(lambda: not support.job_pods(cluster, ns, "bench"), 120, "bench pods gone")
    return timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cluster = get_cluster("bench")
    try:
        support.install_operator(cluster)
        runs = []
        for i in range(args.repeats):
            runs.append(one_run(cluster, i))
            print(f"run {i + 1}: {runs[-1].row()}", flush=True)
        print(f"\n{'stage':<12} {'median s':>9} {'min s':>7} {'max s':>7}   (node-loss timeout 4 s)")
        for stage in scenarios.Timeline.STAGES:
            values = [getattr(r, stage) for r in runs]
            print(f"{stage:<12} {statistics.median(values):>9.2f} {min(values):>7.2f} {max(values):>7.2f}")
        print("stock Kubernetes: pods on the dead node evicted after ~350 s (50 s grace + 300 s toleration)")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
