"""Runtime settings from the environment (the chart sets them); defaults suit a local run."""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from resilient_contract.storage import s3
from resilient_contract.storage.s3 import S3Credentials
from resilient_operator.core.model import OperatorConfig

MiB = 1024 * 1024


class SettingsError(ValueError):
    """An operator setting is malformed: the operator refuses to start rather than guess."""


OBJECT_STORE_SECRETS_DIR = "/etc/resilient-training/object-store"  # RTJ_OBJECT_STORE_SECRETS_DIR
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")  # the keys each area's Secret holds
MAX_SECRET_BYTES = 4096
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_ENDPOINT_RE = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[^\s]*)?$")


@dataclass(frozen=True)
class ObjectStoreArea:
    """An `s3://bucket[/prefix]` the platform admin lets `namespaces` use (the chart's objectStorage.areas).

    The operator's read-only keys for it are the Secret `secret` in the operator's namespace, mounted by
    the chart at <RTJ_OBJECT_STORE_SECRETS_DIR>/<secret>/ and read at each discovery (so a rotated key is
    picked up); no secret: botocore's default chain (the operator pod's own identity, e.g. IRSA)."""

    uri: str
    namespaces: tuple[str, ...]
    secret: str | None = None
    endpoint: str | None = None
    region: str | None = None

    def credentials(self, secrets_dir: str, timeout_s: float | None = None) -> S3Credentials:
        """The area's keys, read from the mounted Secret now; SettingsError if they cannot be read."""
        if self.secret is None:
            return S3Credentials(None, None, self.endpoint, self.region, timeout_s)
        values = []
        for key in SECRET_KEYS:
            path = posixpath.join(secrets_dir, self.secret, key)
            try:
                with open(path, "rb") as f:
                    raw = f.read(MAX_SECRET_BYTES + 1)
            except OSError as exc:
                why = f"{key} of Secret {self.secret} is not mounted ({type(exc).__name__})"
                raise SettingsError(f"the operator's keys for {self.uri} cannot be read: {why}") from None
            value = raw.decode("utf-8", "replace").strip()
            if not value or len(raw) > MAX_SECRET_BYTES:
                raise SettingsError(f"the operator's keys for {self.uri}: {key} of Secret {self.secret} is empty "
                                    "or oversized")  # fmt: skip
            values.append(value)
        return S3Credentials(values[0], values[1], self.endpoint, self.region, timeout_s)


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
    object_areas: tuple[ObjectStoreArea, ...] = ()  # RTJ_OBJECT_STORE_AREAS
    object_secrets_dir: str = OBJECT_STORE_SECRETS_DIR  # RTJ_OBJECT_STORE_SECRETS_DIR

    def read_roots(self) -> list[str]:
        """What a discovery worker may read: the checkpoint mount and every mapped area (discovery.confine)."""
        return sorted({self.checkpoint_mount, *self.storage_areas.values()})

    def area_for(self, namespace: str) -> str:
        """Where a namespace's checkpoint roots must lie: its RTJ_STORAGE_AREAS entry or <mount>/<namespace>."""
        return self.storage_areas.get(namespace) or posixpath.join(self.checkpoint_mount, namespace)

    def object_areas_for(self, namespace: str) -> list[ObjectStoreArea]:
        """The object-store areas a namespace may use (none unless the platform admin mapped one)."""
        return [a for a in self.object_areas if namespace in a.namespaces]

    @classmethod
    def from_environ(cls, env: dict[str, str] | None = None) -> DiscoverySettings:
        env = dict(os.environ if env is None else env)
        mount = _abs_path(env.get("RTJ_CHECKPOINT_MOUNT") or "/checkpoints", "RTJ_CHECKPOINT_MOUNT")
        return check_areas(cls(
            checkpoint_mount=mount,
            storage_areas=_areas(env.get("RTJ_STORAGE_AREAS") or "{}"),
            timeout_seconds=_number(env, "RTJ_DISCOVERY_TIMEOUT_SECONDS", 5.0, float),
            metadata_max_bytes=_number(env, "RTJ_METADATA_MAX_BYTES", 32 * MiB, int),
            max_steps=_number(env, "RTJ_DISCOVERY_MAX_STEPS", 32, int),
            memory_bytes=_number(env, "RTJ_DISCOVERY_MEMORY_BYTES", 512 * MiB, int),
            workers=_number(env, "RTJ_DISCOVERY_WORKERS", 2, int),
            object_areas=object_areas(env.get("RTJ_OBJECT_STORE_AREAS") or "[]"),
            object_secrets_dir=_abs_path(env.get("RTJ_OBJECT_STORE_SECRETS_DIR") or OBJECT_STORE_SECRETS_DIR,
                                         "RTJ_OBJECT_STORE_SECRETS_DIR"),
        ))


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def _nested(a: list[str], b: list[str]) -> bool:
    """Is one of two component lists the other or below it?"""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def check_areas(settings: DiscoverySettings) -> DiscoverySettings:
    """Refuse storage areas that overlap: one namespace's area equal to, inside or around another's would hand
    it the other's checkpoints. Checked: the mapped areas (RTJ_STORAGE_AREAS) among themselves and against the
    default area `<mount>/<namespace>` of every namespace they reach into; the object-store areas among
    themselves (per endpoint). An area shared by several namespaces on purpose is one object-store entry
    listing them all. SettingsError names both areas."""
    mount = _parts(settings.checkpoint_mount)
    mapped = sorted(settings.storage_areas.items())
    for i, (ns, area) in enumerate(mapped):
        parts = _parts(area)
        for other, other_area in mapped[i + 1:]:
            if _nested(parts, _parts(other_area)):
                raise SettingsError(f"RTJ_STORAGE_AREAS: the areas of namespaces {ns} ({area}) and {other} "
                                    f"({other_area}) overlap; give each namespace its own disjoint directory")
        if len(parts) <= len(mount) and _nested(parts, mount):
            raise SettingsError(f"RTJ_STORAGE_AREAS: the area of namespace {ns} ({area}) holds the whole checkpoint "
                                f"mount {settings.checkpoint_mount}, so every other namespace's default area too")
        if len(parts) > len(mount) and parts[: len(mount)] == mount:
            owner = parts[len(mount)]
            if owner != ns and owner not in settings.storage_areas and _DNS_LABEL_RE.match(owner):
                raise SettingsError(f"RTJ_STORAGE_AREAS: the area of namespace {ns} ({area}) lies inside namespace "
                                    f"{owner}'s default area ({posixpath.join(settings.checkpoint_mount, owner)}); "
                                    "map it under a directory that cannot be a namespace name (e.g. _areas/)")
    stores = sorted(settings.object_areas, key=lambda a: (a.endpoint or "", a.uri))
    for i, a in enumerate(stores):
        for b in stores[i + 1:]:
            if (a.endpoint or "") == (b.endpoint or "") and _nested(_parts(a.uri[len(s3.SCHEME):]),
                                                                    _parts(b.uri[len(s3.SCHEME):])):
                raise SettingsError(f"RTJ_OBJECT_STORE_AREAS: the areas {a.uri} (namespaces {', '.join(a.namespaces)}) "
                                    f"and {b.uri} (namespaces {', '.join(b.namespaces)}) overlap; list namespaces "
                                    "that share an area on purpose in one entry")
    return settings


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


_AREA_FIELDS = {"uri", "namespaces", "secret", "endpoint", "region"}


def object_areas(raw: str) -> tuple[ObjectStoreArea, ...]:
    """RTJ_OBJECT_STORE_AREAS: the chart's `objectStorage.areas` as JSON, one format for both. Each entry is
    {uri: s3://bucket[/prefix], namespaces: [..], secret?: Secret name, endpoint?: URL, region?: name}."""
    what = "RTJ_OBJECT_STORE_AREAS"
    try:
        data = json.loads(raw)
    except ValueError:
        raise SettingsError(f"{what} must be a JSON list of areas") from None
    if not isinstance(data, list):
        raise SettingsError(f"{what} must be a JSON list of areas")
    out = []
    for i, entry in enumerate(data):
        at = f"{what}[{i}]"
        if not isinstance(entry, dict) or not set(entry) <= _AREA_FIELDS:
            raise SettingsError(f"{at} must be an object with keys among {sorted(_AREA_FIELDS)}")
        uri = entry.get("uri")
        try:
            uri = s3.parse_uri(uri).uri if isinstance(uri, str) else None
        except ValueError as exc:
            raise SettingsError(f"{at}.uri: {exc}") from None
        if uri is None:
            raise SettingsError(f"{at}.uri must be s3://bucket[/prefix]")
        namespaces = entry.get("namespaces")
        if not isinstance(namespaces, list) or not namespaces or not all(
                isinstance(n, str) and _DNS_LABEL_RE.match(n) for n in namespaces):
            raise SettingsError(f"{at}.namespaces must be a non-empty list of namespace names")
        secret, endpoint, region = (entry.get(k) or None for k in ("secret", "endpoint", "region"))  # "": unset
        if secret is not None and not (isinstance(secret, str) and _DNS_SUBDOMAIN_RE.match(secret)):
            raise SettingsError(f"{at}.secret must name a Secret in the operator's namespace")
        if endpoint is not None and not (isinstance(endpoint, str) and _ENDPOINT_RE.match(endpoint)):
            raise SettingsError(f"{at}.endpoint must be an http(s):// URL")
        if region is not None and not (isinstance(region, str) and re.fullmatch(r"[a-z0-9-]{1,32}", region)):
            raise SettingsError(f"{at}.region must be a region name such as us-east-1")
        out.append(ObjectStoreArea(uri, tuple(namespaces), secret, endpoint, region))
    return tuple(out)


PLAN_KEY_SECRET = "resilient-training-operator-plan-key"  # the chart sets <release fullname>-plan-key
DELIVERY_WORKERS = 64


@dataclass(frozen=True)
class DeliverySettings:
    """In-place restarts: the operator's signing key and how plans reach the kept pods' agents (delivery.py).

    The key is an Ed25519 private key in the Secret `plan_key_secret` of the operator's own namespace (both
    replicas read the same one; plankey.py creates it when absent). Each POST to an agent is bounded by
    `timeout_seconds` from connect to the last byte read, and at most `workers` are in flight at once."""

    plan_key_secret: str = PLAN_KEY_SECRET  # RTJ_PLAN_KEY_SECRET
    namespace: str = "default"  # POD_NAMESPACE: the operator's namespace, where the Secret lives
    # RTJ_DELIVERY_WORKERS: an agent answers once its old workers are gone (1-2 s), holding a thread that long, so
    # the pool bounds throughput: 64 kept pods took 12 s with 8 threads, 1.6 s with 64 (values.yaml, planDelivery)
    workers: int = DELIVERY_WORKERS
    timeout_seconds: float = 5.0  # RTJ_DELIVERY_TIMEOUT_SECONDS

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> DeliverySettings:
        env = dict(os.environ if env is None else env)
        secret = env.get("RTJ_PLAN_KEY_SECRET", "").strip() or PLAN_KEY_SECRET
        if not _DNS_SUBDOMAIN_RE.match(secret):
            raise SettingsError(f"RTJ_PLAN_KEY_SECRET={secret!r} is not a Secret name")
        return cls(plan_key_secret=secret, namespace=env.get("POD_NAMESPACE", "").strip() or "default",
                   workers=_number(env, "RTJ_DELIVERY_WORKERS", DELIVERY_WORKERS, int),
                   timeout_seconds=_number(env, "RTJ_DELIVERY_TIMEOUT_SECONDS", 5.0, float))


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
    delivery: DeliverySettings = field(default_factory=DeliverySettings)  # in-place plans (delivery.py)

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
            delivery=DeliverySettings.from_environ(),
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
        agent_port=_agent_port(env, default.agent_port),
        in_place_ack_seconds=_number(dict(env), "RTJ_IN_PLACE_ACK_SECONDS", default.in_place_ack_seconds, float),
    )


def _agent_port(env: Mapping[str, str], default: int) -> int:
    """RTJ_AGENT_PORT: where every worker pod's agent listens (the chart's planDelivery.agentPort)."""
    port = _number(dict(env), "RTJ_AGENT_PORT", default, int)
    if port > 65535:
        raise SettingsError(f"RTJ_AGENT_PORT={port} is not a port")
    return port
