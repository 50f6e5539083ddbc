"""Runtime settings from the environment (the chart sets them); defaults suit a local run."""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from resilient_operator.core.model import OperatorConfig

MiB = 1024 * 1024


class SettingsError(ValueError):
    """An operator setting is malformed: the operator refuses to start rather than guess."""


@dataclass(frozen=True)
class DiscoverySettings:
    """Checkpoint discovery runs in sandboxed worker processes with these bounds (see discovery.py)."""

    checkpoint_mount: str = "/checkpoints"  # RTJ_CHECKPOINT_MOUNT
    storage_areas: dict[str, str] = field(default_factory=dict)  # RTJ_STORAGE_AREAS: namespace -> area
    timeout_seconds: float = 5.0  # RTJ_DISCOVERY_TIMEOUT_SECONDS: per call, wall clock
    metadata_max_bytes: int = 32 * MiB  # RTJ_METADATA_MAX_BYTES
    max_steps: int = 32  # RTJ_DISCOVERY_MAX_STEPS: newest K step directories examined
    memory_bytes: int = 512 * MiB  # RTJ_DISCOVERY_MEMORY_BYTES: each worker's RLIMIT_AS
    workers: int = 2  # RTJ_DISCOVERY_WORKERS

    def area_for(self, namespace: str) -> str:
        """Where a namespace's checkpoint roots must lie: its RTJ_STORAGE_AREAS entry or <mount>/<namespace>."""
        return self.storage_areas.get(namespace) or posixpath.join(self.checkpoint_mount, namespace)

    @classmethod
    def from_environ(cls, env: dict[str, str] | None = None) -> DiscoverySettings:
        env = dict(os.environ if env is None else env)
        mount = _abs_path(env.get("RTJ_CHECKPOINT_MOUNT") or "/checkpoints", "RTJ_CHECKPOINT_MOUNT")
        return cls(
            checkpoint_mount=mount,
            storage_areas=_areas(env.get("RTJ_STORAGE_AREAS") or "{}"),
            timeout_seconds=_number(env, "RTJ_DISCOVERY_TIMEOUT_SECONDS", 5.0, float),
            metadata_max_bytes=_number(env, "RTJ_METADATA_MAX_BYTES", 32 * MiB, int),
            max_steps=_number(env, "RTJ_DISCOVERY_MAX_STEPS", 32, int),
            memory_bytes=_number(env, "RTJ_DISCOVERY_MEMORY_BYTES", 512 * MiB, int),
            workers=_number(env, "RTJ_DISCOVERY_WORKERS", 2, int),
        )


N = TypeVar("N", int, float)


def _number(env: dict[str, str], name: str, default: N, kind: Callable[[str], N]) -> N:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a {type(default).__name__}") from None
    if value <= 0:
        raise SettingsError(f"{name} must be positive")
    return value


def _abs_path(raw: str, what: str) -> str:
    if not raw.startswith("/") or "\x00" in raw:
        raise SettingsError(f"{what}: {raw!r} must be an absolute path")
    path = posixpath.normpath(raw)
    if path == "/":
        raise SettingsError(f"{what} cannot be the filesystem root")
    return path


def _areas(raw: str) -> dict[str, str]:
    try:
        data = json.loads(raw)
    except ValueError:
        raise SettingsError("RTJ_STORAGE_AREAS must be a JSON object {namespace: absolute path}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise SettingsError("RTJ_STORAGE_AREAS must be a JSON object {namespace: absolute path}")
    return {ns: _abs_path(path, f"RTJ_STORAGE_AREAS[{ns}]") for ns, path in data.items()}


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...]  # empty: every namespace
    metrics_port: int
    health_port: int
    workers: int  # jobs reconciled concurrently (one job is never reconciled twice at once)
    log_level: str
    config: OperatorConfig = field(default_factory=OperatorConfig)  # what the core's policies read
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    kueue: bool = False  # RTJ_KUEUE_ENABLED: manage jobs labelled kueue.x-k8s.io/queue-name (chart: kueue.enabled)

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
            discovery=DiscoverySettings.from_environ(),
            kueue=os.environ.get("RTJ_KUEUE_ENABLED", "").strip().lower() == "true",
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
