"""Prometheus metrics: restarts by reason, time to detect, time to relaunch, jobs by phase, goodput per job."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RESTARTS = Counter("rtj_restarts_total", "Restarts by budget kind and reason", ["kind", "reason"])
TIME_TO_DETECT = Histogram(
    "rtj_time_to_detect_seconds",
    "From the last sign of life of a lost node (its lease renewal) to the operator's decision",
    buckets=(1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300),
)
TIME_TO_RELAUNCH = Histogram(
    "rtj_time_to_relaunch_seconds",
    "From a failure's detection to the creation of the next attempt's pods",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
RECONCILE_SECONDS = Histogram("rtj_reconcile_seconds", "One observe-decide-apply pass")
RECONCILE_ERRORS = Counter("rtj_reconcile_errors_total", "Reconciles that raised", ["error"])
EVENTS_DROPPED = Counter("rtj_events_dropped_total", "Events not posted: too many waited to be posted (kube.py)")
JOBS_BY_PHASE = Gauge("rtj_jobs", "Jobs by phase", ["phase"])
LEADER = Gauge("rtj_leader", "1 while this replica holds the leader Lease (it alone reconciles and writes), else 0")

# Goodput per job (status.goodput as gauges; per-job labels: one series set per job, removed on deletion).
GOODPUT_RATIO = Gauge("rtj_goodput_ratio", "Productive share of the job's wall time", ["namespace", "job"])
PRODUCTIVE_SECONDS = Gauge("rtj_productive_seconds", "Wall time spent training", ["namespace", "job"])
LOST_SECONDS = Gauge("rtj_lost_seconds", "Wall time lost to interruptions, by recovery stage",
                     ["namespace", "job", "stage"])
STEPS_RECOMPUTED = Gauge("rtj_steps_recomputed", "Steps trained twice after restarts", ["namespace", "job"])
STEP_SECONDS = Gauge("rtj_step_seconds", "Step time of each pod's slowest rank, as its launcher reports it",
                     ["namespace", "job", "pod", "node"])
RECOVERY_SECONDS = Histogram("rtj_recovery_seconds", "Length of each recovery stage, per recovery",
                             ["stage"], buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800))
STAGES = ("detection", "fencing", "relaunch", "load", "recompute")


def record_job(namespace: str, job: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Publish a job's goodput from its new status; a closed recovery's stages go to the histogram."""
    gp, old = after.get("goodput") or {}, before.get("goodput") or {}
    if "ratio" in gp:
        GOODPUT_RATIO.labels(namespace, job).set(float(gp["ratio"]))
        PRODUCTIVE_SECONDS.labels(namespace, job).set(float(gp.get("productiveSeconds", 0)))
    STEPS_RECOMPUTED.labels(namespace, job).set(float(gp.get("stepsRecomputed", 0)))
    lost, was = gp.get("lost") or {}, old.get("lost") or {}
    for stage in STAGES:
        LOST_SECONDS.labels(namespace, job, stage).set(float(lost.get(stage, 0)))
    if int(gp.get("recoveries", 0)) > int(old.get("recoveries", 0)):
        for stage in STAGES:
            RECOVERY_SECONDS.labels(stage).observe(max(0.0, float(lost.get(stage, 0)) - float(was.get(stage, 0))))


def record_steps(namespace: str, job: str, step_seconds: Mapping[tuple[str, str], float]) -> None:
    """Each pod's reported step time, by (pod, node); pods no longer reporting drop out."""
    for labels in list(STEP_SECONDS._metrics):
        if labels[:2] == (namespace, job) and labels[2:] not in step_seconds:
            STEP_SECONDS.remove(*labels)
    for (pod, node), seconds in step_seconds.items():
        STEP_SECONDS.labels(namespace, job, pod, node).set(seconds)


def forget_job(namespace: str, job: str) -> None:
    """A deleted job's series go with it."""
    for gauge in (GOODPUT_RATIO, PRODUCTIVE_SECONDS, STEPS_RECOMPUTED):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, job)
    for stage in STAGES:
        with contextlib.suppress(KeyError):
            LOST_SECONDS.remove(namespace, job, stage)
