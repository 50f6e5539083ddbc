"""Bad-node memory: a node that broke an attempt is avoided by the job's later attempts for a while, and
(opt-in) tainted for every job once it broke enough attempts across jobs.

Blame: a lost node, or the node whose rank stopped first in a hang, is blamed at once; other infrastructure
failures (eviction, a deleted pod) only when they repeat on the same node (REPEATS). Application failures
and planned restarts blame nobody. `status.badNodes` lists each blamed node with the reason, the recent
failure times (bounded) and when the job stops avoiding it (`spec.badNodeSeconds` after the last failure);
the pods' required node affinity excludes the active ones and capacity does not count them.

Cluster-wide, the operator adds up the *attested* failure times of every job's entries: K within the window
taint the node NoSchedule with a key of ours (an event on the Node says why), never more than a fraction of
all nodes (a cluster-wide problem must not take the cluster down). Removing the taint is the admin's call.

Attested failures are those a tenant cannot forge: the node's lease went stale or it turned NotReady (node
loss), or the kubelet or the control plane evicted or killed the pod (status.reason Evicted, NodeShutdown...;
DisruptionTarget DeletionByTaintManager, DeletionByPodGC, TerminationByKubelet). A hang (`RTJ_HUNG` is a line
the container writes), a deleted pod (the tenant may delete its own pods), an Eviction-API eviction (the
tenant may evict its own pods) and a preemption (its own priorities) still make *that job* avoid the node,
but never count towards tainting it for everyone: otherwise a few jobs pinned to one node could get any node
tainted on their word alone (`attestedTimes` holds the attested subset of `failureTimes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from resilient_operator import constants as c
from resilient_operator.core.model import NodeView
from resilient_operator.core.status import JobStatus
from resilient_operator.core.timeutil import fmt, parse

IMMEDIATE = frozenset({c.REASON_NODE_LOST, c.REASON_HANG})  # blamed on the first failure
REPEATS = 2  # other infrastructure failures on one node before it is blamed
MAX_TIMES = 5  # failure times kept per entry
MAX_ENTRIES = 20


def record(status: JobStatus, node: str, reason: str, now: datetime, hold_seconds: float,
           attested: bool = False) -> None:
    """Count an infrastructure failure against `node` (its entry's expiry moves to now + hold); `attested`: the
    signal came from the node's heartbeat, the kubelet or the control plane, so it may count cluster-wide."""
    if hold_seconds <= 0:
        return
    entries = status.setdefault("badNodes", [])
    entry = next((e for e in entries if e.get("node") == node), None)
    if entry is None:
        entry = {"node": node}
        entries.append(entry)
    times = [*entry.get("failureTimes", []), fmt(now)][-MAX_TIMES:]
    entry["reason"], entry["failureTimes"] = reason, times
    entry["expires"] = fmt(now + timedelta(seconds=hold_seconds))
    if attested:
        entry["attestedTimes"] = [*entry.get("attestedTimes", []), fmt(now)][-MAX_TIMES:]
    entry["avoided"] = reason in IMMEDIATE or bool(entry.get("avoided")) or len(times) >= REPEATS
    entries.sort(key=lambda e: e.get("expires", ""))
    del entries[: max(0, len(entries) - MAX_ENTRIES)]


def prune(status: JobStatus, now: datetime) -> None:
    """Forget entries whose time is up (the job may use the node again)."""
    entries = status.get("badNodes")
    if not entries:
        return
    kept = [e for e in entries if isinstance(e, dict) and (exp := parse(e.get("expires"))) and exp > now]
    if kept:
        status["badNodes"] = kept
    else:
        status.pop("badNodes", None)


def avoided(status: Mapping[str, Any], now: datetime) -> dict[str, datetime]:
    """Nodes this job avoids now, with when it stops."""
    out = {}
    for e in status.get("badNodes") or []:
        exp = parse(e.get("expires")) if isinstance(e, dict) else None
        if exp and exp > now and e.get("avoided") and isinstance(e.get("node"), str):
            out[e["node"]] = exp
    return out


@dataclass(frozen=True)
class Taint:
    node: str
    message: str


def to_taint(statuses: Iterable[Mapping[str, Any]], nodes: Mapping[str, NodeView], now: datetime, key: str,
             failures: int, window_seconds: float, max_fraction: float) -> list[Taint]:
    """Nodes to taint now: `failures` or more attested failure times within the window across all jobs'
    entries, not yet tainted by us, and never past `max_fraction` of all nodes tainted by us."""
    since = now - timedelta(seconds=window_seconds)
    counts: dict[str, list[datetime]] = {}
    for status in statuses:
        for e in status.get("badNodes") or []:
            if not isinstance(e, Mapping) or not isinstance(e.get("node"), str):
                continue
            raws = e.get("attestedTimes")
            times = [t for raw in raws if isinstance(raw, str) and (t := parse(raw)) and t >= since] \
                if isinstance(raws, list) else []
            counts.setdefault(e["node"], []).extend(times)
    tainted = {n for n, v in nodes.items() if any(t.key == key for t in v.taints)}
    room = math.floor(max_fraction * len(nodes)) - len(tainted)
    out = []
    ranked: Sequence[tuple[str, list[datetime]]] = sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for node, times in ranked:
        if room <= 0:
            break
        if node in nodes and node not in tainted and len(times) >= failures:
            out.append(Taint(node, f"{len(times)} training failures attributed to node {node} across jobs in the "
                                   f"last {window_seconds:g}s (threshold {failures}); tainted {key}:NoSchedule "
                                   f"by the resilient-training operator; remove the taint once it is repaired"))
            room -= 1
    return out
