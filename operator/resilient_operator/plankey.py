"""The operator's plan-signing key: one Ed25519 key in a Secret of the operator's own namespace.

Every replica loads it at start-up (a standby must be able to sign the moment it takes over), and the first
replica of a fresh install creates it: a create that loses the race (409) reads the winner's, so both replicas
always sign with one key. Worker pods get only the public half (`$RTJ_PLAN_PUBLIC_KEY`); the private half never
leaves this namespace, whose Secrets tenants cannot read. The Secret is immutable and never overwritten: a
malformed one stops the operator rather than being replaced under pods that trust the old public key.

Rotation: delete the Secret and restart the operator's replicas. Pods started under the old key then refuse
new plans (403); the core falls back to re-creating their gang, whose new pods carry the new public key.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from resilient_contract import plan

log = logging.getLogger(__name__)
DATA_KEY = "ed25519.key"  # the Secret's one entry: base64 (in `data`, as every Secret) of the raw 32-byte key
KEY_BYTES = 32
TIMEOUT = (3, 10)  # connect, read: start-up never hangs on one call
MANAGED_BY = {"app.kubernetes.io/managed-by": "resilient-training-operator",
              "app.kubernetes.io/component": "plan-signing-key"}


class PlanKeyError(RuntimeError):
    """The Secret exists but holds no usable key: the operator refuses to start rather than replace it."""


@dataclass(frozen=True, repr=False)
class PlanKey:
    private: bytes  # raw Ed25519 private key: plan.sign's argument
    public: str  # base64 public key: the workers' $RTJ_PLAN_PUBLIC_KEY

    def __repr__(self) -> str:  # never the private half in a log line or a traceback
        return f"PlanKey(public={self.public!r})"


def _from_secret(secret: Any, where: str) -> PlanKey:
    data = (secret.data or {}) if secret is not None else {}
    raw = data.get(DATA_KEY)
    try:
        private = base64.b64decode(raw or "", validate=True)
    except (binascii.Error, ValueError):
        private = b""
    if len(private) != KEY_BYTES:
        raise PlanKeyError(f"Secret {where} has no {KEY_BYTES}-byte Ed25519 key under {DATA_KEY!r}; delete it and "
                           "restart the operator to make a new one (pods started under the old key are then "
                           "re-created at their next recovery)")
    return PlanKey(private, plan.public_key(private))


def _transient(exc: Exception) -> bool:
    """Worth another try: the API server overloaded or restarting, or the connection dropped."""
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504) or not exc.status
    return isinstance(exc, (OSError, urllib3.exceptions.HTTPError))


def load(core: client.CoreV1Api, namespace: str, name: str, deadline_seconds: float = 30.0,
         sleep: Callable[[float], None] = time.sleep) -> PlanKey:
    """load_or_create, tried again on transient API errors (backoff 0.5 s doubling to 4 s) for up to
    `deadline_seconds`. A refusal (403: the RBAC is missing) or a malformed Secret raises at once."""
    deadline, pause = time.monotonic() + deadline_seconds, 0.5
    while True:
        try:
            return load_or_create(core, namespace, name)
        except Exception as exc:
            if not _transient(exc) or time.monotonic() + pause > deadline:
                raise
            log.info("reading the plan-signing key %s/%s failed (%s); trying again in %.1fs", namespace, name,
                     exc, pause)
            sleep(pause)
            pause = min(pause * 2, 4.0)


def load_or_create(core: client.CoreV1Api, namespace: str, name: str) -> PlanKey:
    """The key in Secret namespace/name, created first if absent. API errors other than 404/409 propagate;
    a Secret without a usable key raises PlanKeyError."""
    where = f"{namespace}/{name}"
    try:
        return _from_secret(core.read_namespaced_secret(name, namespace, _request_timeout=TIMEOUT), where)
    except ApiException as exc:
        if exc.status != 404:
            raise
    private = plan.new_private_key()
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=dict(MANAGED_BY)),
        type="Opaque", immutable=True, data={DATA_KEY: base64.b64encode(private).decode()})
    try:
        core.create_namespaced_secret(namespace, body, _request_timeout=TIMEOUT)
    except ApiException as exc:
        if exc.status != 409:
            raise
        log.info("plan-signing key %s was created by another replica first; using it", where)
        return _from_secret(core.read_namespaced_secret(name, namespace, _request_timeout=TIMEOUT), where)
    log.info("created the plan-signing key %s", where)
    return PlanKey(private, plan.public_key(private))
