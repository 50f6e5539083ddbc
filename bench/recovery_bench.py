"""Recovery timeline benchmark: kill a node under a training job, several times, print the medians, for each
restartStrategy side by side (interleaved in one run, same cluster).

Each repetition: a fresh namespace, the example job (4 workers, min 2, node-loss timeout 4 s), the
first complete checkpoint (in place, by default, also every agent's next generation warm: `--kill-at warm`,
the steady state of a long job; `--kill-at checkpoint` kills at once), then SIGKILL of one worker's node.
Stages are seconds after the kill:
loss detected (status records it) -> broken attempt fenced (Recreate: its pods gone; InPlace: the lost pod
gone and the kept pods moved into the new attempt, their old workers stopped) -> new attempt running ->
checkpoint loaded (trainer log) -> first training step done. Then the API writes the recovery cost, by verb.
The stock path for comparison: node-monitor-grace-period (50 s) + NoExecute toleration (300 s) before pods
are even evicted.

    python bench/recovery_bench.py [--repeats 3] [--strategies Recreate,InPlace] [--kill-at warm|checkpoint]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import node_loss
from e2e import get_cluster, scenarios, support


def one_run(cluster: Any, index: int, strategy: str = "Recreate", warm: bool = True) -> scenarios.Timeline:
    return node_loss.one_run(cluster, f"bench-{strategy.lower()}-{index}", warm=warm, restartStrategy=strategy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", default="Recreate,InPlace")
    parser.add_argument("--kill-at", choices=("warm", "checkpoint"), default="warm",
                        help="warm: in place, once every agent's next generation is warm (a long job's steady "
                             "state); checkpoint: right after the first complete checkpoint, imports maybe running")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    cluster = get_cluster("bench")
    try:
        support.install_operator(cluster)
        runs: dict[str, list[scenarios.Timeline]] = {s: [] for s in strategies}
        for i in range(args.repeats):
            for strategy in strategies:  # interleaved: a drifting machine load hits both alike
                runs[strategy].append(one_run(cluster, i, strategy, args.kill_at == "warm"))
                tl = runs[strategy][-1]
                print(f"run {i + 1} {strategy:<8}: {tl.row()}  writes {tl.writes}  ({node_loss.load_average()})",
                      flush=True)
        header = "".join(f" {s + ' median':>16} {'min':>6} {'max':>6}" for s in strategies)
        print(f"\n{'stage':<12}{header}   (node-loss timeout 4 s, seconds after the kill; killed at: {args.kill_at})")
        for stage in scenarios.Timeline.STAGES:
            cells = ""
            for s in strategies:
                median, low, high = node_loss.stage_stats(runs[s], stage)
                cells += f" {median:>16.2f} {low:>6.2f} {high:>6.2f}"
            print(f"{stage:<12}{cells}")
        print(f"\n{'API writes per recovered job (median)':<40}" + "".join(f" {s:>10}" for s in strategies))
        for what in node_loss.WRITES.values():
            print(f"{what:<40}" + "".join(
                f" {statistics.median(r.writes.get(what, 0) for r in runs[s]):>10g}" for s in strategies))
        print("stock Kubernetes: pods on the dead node evicted after ~350 s (50 s grace + 300 s toleration)")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
