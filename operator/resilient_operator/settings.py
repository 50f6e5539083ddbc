"""Runtime settings from the environment (the chart sets them); defaults suit a local run."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...]  # empty: every namespace
    metrics_port: int
    health_port: int
    workers: int  # jobs reconciled concurrently (one job is never reconciled twice at once)
    log_level: str

    @classmethod
    def from_environ(cls) -> Settings:
        raw = os.environ.get("RTJ_NAMESPACES", "")
        return cls(
            namespaces=tuple(n.strip() for n in raw.split(",") if n.strip()),
            metrics_port=int(os.environ.get("RTJ_METRICS_PORT", "8080")),
            health_port=int(os.environ.get("RTJ_HEALTH_PORT", "8081")),
            workers=int(os.environ.get("RTJ_WORKERS", "8")),
            log_level=os.environ.get("RTJ_LOG_LEVEL", "INFO"),
        )
