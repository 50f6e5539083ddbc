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
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import node_loss
from e2e import get_cluster, scenarios, support


def one_run(cluster: Any, index: int) -> scenarios.Timeline:
    return node_loss.one_run(cluster, f"bench-{index}")


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
            median, low, high = node_loss.stage_stats(runs, stage)
            print(f"{stage:<12} {median:>9.2f} {low:>7.2f} {high:>7.2f}")
        print("stock Kubernetes: pods on the dead node evicted after ~350 s (50 s grace + 300 s toleration)")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
