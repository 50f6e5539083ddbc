"""Prometheus metrics: restarts by reason, time to detect, time to relaunch, jobs by phase."""

from __future__ import annotations

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
JOBS_BY_PHASE = Gauge("rtj_jobs", "Jobs by phase", ["phase"])
