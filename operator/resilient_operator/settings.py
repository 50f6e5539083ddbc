"""Runtime settings from the environment (the chart sets them); defaults suit a local run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from resilient_operator.core.model import OperatorConfig


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...]  # empty: every namespace
    metrics_port: int
    health_port: int
    workers: int  # jobs reconciled concurrently (one job is never reconciled twice at once)
    log_level: str
    config: OperatorConfig = field(default_factory=OperatorConfig)  # what the core's policies read

    @classmethod
    def from_environ(cls) -> Settings:
        raw = os.environ.get("RTJ_NAMESPACES", "")
        return cls(
            namespaces=tuple(n.strip() for n in raw.split(",") if n.strip()),
            metrics_port=int(os.environ.get("RTJ_METRICS_PORT", "8080")),
            health_port=int(os.environ.get("RTJ_HEALTH_PORT", "8081")),
            workers=int(os.environ.get("RTJ_WORKERS", "8")),
            log_level=os.environ.get("RTJ_LOG_LEVEL", "INFO"),
            config=operator_config(os.environ),
        )


def operator_config(env: Mapping[str, str]) -> OperatorConfig:
    """The cluster-wide policy knobs the chart sets (defaults: the core's)."""
    default = OperatorConfig()
    taints = env.get("RTJ_DRAIN_TAINTS")
    return OperatorConfig(
        drain_taints=frozenset(t.strip() for t in taints.split(",") if t.strip()) if taints is not None
        else default.drain_taints,
        settle_seconds=float(env.get("RTJ_SETTLE_SECONDS", default.settle_seconds)),
        bad_node_taint=env.get("RTJ_BAD_NODE_TAINT") or None,
        bad_node_failures=int(env.get("RTJ_BAD_NODE_FAILURES", default.bad_node_failures)),
        bad_node_window_seconds=float(env.get("RTJ_BAD_NODE_WINDOW_SECONDS", default.bad_node_window_seconds)),
        bad_node_max_fraction=float(env.get("RTJ_BAD_NODE_MAX_FRACTION", default.bad_node_max_fraction)),
    )
