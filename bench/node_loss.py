"""One node loss under the example job, timed stage by stage: the run the recovery and failover benchmarks repeat.

A fresh namespace, the example job (4 workers, min 2, node-loss timeout 4 s), the first complete checkpoint,
then SIGKILL of rank 1's node (after `before_kill`, if given: another fault at the same moment). Stages are
seconds after the kill (e2e.scenarios.Timeline). The namespace is deleted and the node restored afterwards.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e import scenarios, support
from e2e.localcluster.cluster import wait_for
from resilient_trainer import agent


def new_namespace(cluster: Any, ns: str) -> str:
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for_default_sa(ns)
    return ns


def one_run(cluster: Any, ns: str, before_kill: Callable[[], None] | None = None, warm: bool = False,
            **spec: Any) -> scenarios.Timeline:
    """`spec`: extra job spec fields (e.g. restartStrategy="InPlace"). `warm`: in place, kill only once every
    pod's agent logged its next generation warm (torch imported by it and its workers), as it is a few
    seconds into any long job; otherwise the kill comes right after the first complete checkpoint, when
    those imports may still be running and a recovery pays their rest."""
    new_namespace(cluster, ns)
    scenarios.shared_claim(cluster, ns)
    job = scenarios.example_job("bench", ns, steps=400, checkpoint_every=5, step_delay=0.3, **spec)
    cluster.apply(job)
    pods = support.running_attempt(cluster, ns, "bench", 1, 4, timeout=300)
    scenarios.first_complete_checkpoint(cluster, job)
    if warm and spec.get("restartStrategy", "InPlace") == "InPlace":
        names = [p.metadata.name for p in pods]
        wait_for(lambda: all(agent.PARKED_WARM_LOG in scenarios.trainer_log(cluster, ns, n) for n in names), 120,
                 "every agent's next generation warm")
    if before_kill is not None:
        before_kill()
    before = api_writes(cluster)
    timeline = scenarios.kill_and_time(cluster, ns, "bench", support.node_of(pods, "1"))
    after = api_writes(cluster)
    timeline.writes = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    cluster.restore_node(timeline.node)
    wait_for(lambda: not support.job_pods(cluster, ns, "bench"), 120, "bench pods gone")
    return timeline


# The API writes a recovery costs: pods created and deleted, pod metadata patched (in-place relabels), the
# job's status written, as the API server counts them (apiserver_request_total, cluster-wide: one job runs).
WRITES = {("POST", "pods", ""): "pod creates", ("DELETE", "pods", ""): "pod deletes",
          ("PATCH", "pods", ""): "pod patches", ("PATCH", "resilienttrainingjobs", "status"): "status patches",
          ("PUT", "resilienttrainingjobs", "status"): "status updates"}
_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$', re.M)


def api_writes(cluster: Any) -> dict[str, int]:
    """The API server's request counters for the writes in WRITES, by name."""
    out: dict[str, int] = dict.fromkeys(WRITES.values(), 0)
    text = cluster.kubectl("get", "--raw", "/metrics", timeout=30).stdout
    for m in _SAMPLE.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        if key in WRITES and labels.get("code", "").startswith("2"):
            out[WRITES[key]] += int(float(m.group("value")))
    return out


def stage_stats(runs: list[scenarios.Timeline], stage: str) -> tuple[float, float, float]:
    """(median, min, max) of one stage over runs."""
    values = [getattr(r, stage) for r in runs]
    return statistics.median(values), min(values), max(values)


def load_average() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
