"""Operator failover benchmark: SIGKILL the leading replica, time until a new leader's first reconcile.

Two operator replicas (the chart's defaults: lease 15 s, renew deadline 10 s, retry 2 s) and one running
job. Two ways to lose the leader, each repeated (default 5):

- pod lost: the leader's process is SIGKILLed and its pod force-deleted at once (as when its node dies):
  the standby takes the Lease once it has seen it unchanged for the lease duration;
- process crash: only the process is SIGKILLed: its container restarts and takes its own Lease back
  (holderIdentity is the pod name) unless the standby got it first.

The time is from the kill to the first reconcile of a process that was not the killed one and holds the
Lease (its rtj_reconcile_seconds_count > 0, its rtj_leader 1), polled every 0.1 s on the replicas' metrics
endpoints. Also printed: the standby's RSS and its informer lists and watch events over a steady minute.

Then a node loss at the same moment as the leader's death: the example job (4 workers, node-loss timeout 4 s)
loses rank 1's node right after the leader's process is SIGKILLed and its pod force-deleted (its node died
too), against a node loss alone, runs interleaved; each stage in s after the node kill (bench/node_loss.py).

    python bench/failover_bench.py [--repeats 5] [--node-repeats 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import node_loss
from e2e import get_cluster, scenarios, support
from e2e.localcluster.cluster import wait_for


def samples(cluster: Any, pod: Any, name: str) -> float:
    return sum(support.metric_samples(support.operator_metrics(cluster, timeout=2, pod=pod), name).values())


def two_replicas(cluster: Any) -> tuple[Any, Any]:
    leader = support.wait_operator_ready(cluster, timeout=180)
    standby = wait_for(lambda: next((p for p in support.standby_pods(cluster)
                                     if p.status.phase == "Running" and support.pod_pid(p)), None), 180,
                       "a standby running")  # fmt: skip
    # both serving metrics (the standby's process may have just started)
    wait_for(lambda: samples(cluster, standby, "rtj_informer_lists_total") > 0, 120, "the standby's caches")
    return leader, standby


def first_reconcile_after(cluster: Any, killed_pid: int, t0: float, timeout: float = 120) -> tuple[float, str]:
    def check() -> tuple[float, str] | None:
        for pod in support.operator_pods(cluster):
            pid = support.pod_pid(pod)
            if pid in (None, killed_pid):
                continue
            try:
                text = support.operator_metrics(cluster, timeout=1, pod=pod)
            except Exception:
                continue
            lead = support.metric_samples(text, "rtj_leader").get("rtj_leader")
            if lead == 1 and sum(support.metric_samples(text, "rtj_reconcile_seconds_count").values()) > 0:
                return time.monotonic() - t0, pod.metadata.name
        return None

    return wait_for(check, timeout, "a new leader's first reconcile", interval=0.1)


def one_failover(cluster: Any, delete_pod: bool) -> tuple[float, str, str]:
    leader, _ = two_replicas(cluster)
    pid = support.pod_pid(leader)
    assert pid is not None
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    if delete_pod:
        cluster.kubectl("delete", "pod", "-n", support.OPERATOR_NS, leader.metadata.name, "--grace-period=0",
                        "--force", "--wait=false")  # fmt: skip
    seconds, new = first_reconcile_after(cluster, pid, t0)
    return seconds, leader.metadata.name, new


def kill_leader_pod(cluster: Any) -> None:
    """The leader's process SIGKILLed and its pod force-deleted at once, as when the operator's node dies."""
    leader, _ = two_replicas(cluster)
    pid = support.pod_pid(leader)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    cluster.kubectl("delete", "pod", "-n", support.OPERATOR_NS, leader.metadata.name, "--grace-period=0",
                    "--force", "--wait=false")  # fmt: skip


def node_loss_with_and_without_the_leader(cluster: Any, repeats: int) -> None:
    alone: list[Any] = []
    with_leader: list[Any] = []
    for i in range(repeats):  # interleaved, so both see the same load
        two_replicas(cluster)
        alone.append(node_loss.one_run(cluster, f"alone-{i}"))
        print(f"node loss alone {i + 1}: {alone[-1].row()}  ({node_loss.load_average()})", flush=True)
        two_replicas(cluster)
        with_leader.append(node_loss.one_run(cluster, f"leader-{i}", before_kill=lambda: kill_leader_pod(cluster)))
        print(f"node loss + leader {i + 1}: {with_leader[-1].row()}  ({node_loss.load_average()})", flush=True)
    print("\n| stage after the node kill (s) | node loss alone, median (min-max) | node loss + leader death, "
          "median (min-max) | difference of medians |\n|---|---|---|---|")  # fmt: skip
    for stage in scenarios.Timeline.STAGES:
        a, b = node_loss.stage_stats(alone, stage), node_loss.stage_stats(with_leader, stage)
        print(f"| {stage} | {a[0]:.1f} ({a[1]:.1f}-{a[2]:.1f}) | {b[0]:.1f} ({b[1]:.1f}-{b[2]:.1f}) | "
              f"{b[0] - a[0]:+.1f} |")  # fmt: skip
    print(f"{repeats} runs each, interleaved; lease 15 s, node-loss timeout 4 s; {node_loss.load_average()}",
          flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--node-repeats", type=int, default=3, help="node loss with and without the leader, each")
    args = parser.parse_args()
    cluster = get_cluster("failover")
    try:
        support.install_operator(cluster)
        ns = node_loss.new_namespace(cluster, "bench")
        support.apply(cluster, support.job_manifest("steady", ns, replicas=2))
        support.running_attempt(cluster, ns, "steady", 1, 2)
        _, standby = two_replicas(cluster)
        lists0 = samples(cluster, standby, "rtj_informer_lists_total")
        events0 = samples(cluster, standby, "rtj_informer_events_total")
        time.sleep(60)  # the steady minute being measured
        lists1 = samples(cluster, standby, "rtj_informer_lists_total")
        events1 = samples(cluster, standby, "rtj_informer_events_total")
        rss = support.process_rss_bytes(support.pod_pid(standby) or 0)
        leader_rss = support.process_rss_bytes(support.operator_pid(cluster) or 0)
        print(f"standby RSS {rss / 2**20:.0f} MiB (leader {leader_rss / 2**20:.0f} MiB); over a steady minute "
              f"the standby made {lists1 - lists0:.0f} LISTs and received {events1 - events0:.0f} watch events "
              f"(its Lease GET every 2 s is the only other request); {node_loss.load_average()}",
              flush=True)  # fmt: skip
        for mode, delete_pod in (("pod lost", True), ("process crash", False)):
            times = []
            for i in range(args.repeats):
                seconds, old, new = one_failover(cluster, delete_pod)
                times.append(seconds)
                print(f"{mode} {i + 1}: {old} killed -> {new} reconciled after {seconds:.1f}s", flush=True)
            print(f"{mode}: p50 {statistics.median(times):.1f}s, max {max(times):.1f}s over {len(times)} runs "
                  f"(lease duration 15 s); {node_loss.load_average()}", flush=True)  # fmt: skip
        cluster.kubectl("delete", "namespace", ns, "--wait=false")  # its job's 2 workers would hold 2 pool nodes
        wait_for(lambda: not support.job_pods(cluster, ns, "steady"), 120, "the steady job's pods gone")
        node_loss_with_and_without_the_leader(cluster, args.node_repeats)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
