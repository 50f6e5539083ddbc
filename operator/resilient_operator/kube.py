"""The operator's writes to the Kubernetes API (its reads come from the watch-fed caches in cache.py).

Calls are synchronous (the official client) and run in worker threads from the controller.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from resilient_operator import constants as c
from resilient_operator.metrics import EVENTS_DROPPED

log = logging.getLogger(__name__)
NODE_LEASE_NAMESPACE = "kube-node-lease"
COMPONENT = "resilient-training-operator"


class Conflict(Exception):
    """The object changed since we read it; reconcile again from a fresh read."""


# Connections kept open to the API server: the watches, every worker, and the controller's concurrent pod
# writes. The client's default (5 per CPU) would open and drop a TLS connection per write beyond it.
CONNECTIONS = 48
# A Lease call never blocks the elector past a retry or two: a hung API server must not keep a leader that
# can no longer renew from reaching its renew deadline and exiting (leader.py).
LEASE_TIMEOUT = (3, 4)
# A pod relabel after an agent acknowledged runs on a delivery thread (delivery.py): bounded like a Lease call.
POD_PATCH_TIMEOUT = (3, 10)
# Events are posted off the reconcile, as client-go's recorder does: a recovery emits 4-5 per job, and posted in
# line each held a reconcile thread for a round trip to a busy API server (a fifth of the reconcile threads'
# samples in a 200-node recovery's profile). EVENT_SHARDS single-thread queues, a job always on the same one,
# so one job's events keep their order; past MAX_PENDING_EVENTS unposted ones, new events are dropped (counted
# and logged), so an API server that stopped answering cannot grow the operator's memory.
EVENT_SHARDS = 4
MAX_PENDING_EVENTS = 1000
EVENT_TIMEOUT = (3, 10)


def load_config() -> None:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, CONNECTIONS)
    client.Configuration.set_default(cfg)


def _raw(response: Any) -> Any:
    return json.loads(response.data)


def _discard(response: Any) -> None:
    """A write's answer nobody reads: not made into the client's models (a pod's took a reconcile thread longer
    than its decision), and read to the end so its connection goes back to the pool. Left unread, it is dropped
    with the response: the next request pays a new TLS handshake, on both ends."""
    response.read()
    response.release_conn()


def _lease_or_none(expected: tuple[int, ...], call: Callable[[], Any]) -> dict[str, Any] | None:
    """The Lease a call returned, or None when it failed with one of the `expected` statuses (gone, or
    another replica got there first): leader.py decides what that means."""
    try:
        return dict(_raw(call()))
    except ApiException as exc:
        if exc.status in expected:
            return None
        raise


def _invalid_field(exc: ApiException) -> str | None:
    """The field a 422 names (the first cause's), if any."""
    try:
        causes = (json.loads(exc.body or "{}").get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        return None
    return causes[0].get("field") if causes and isinstance(causes[0], dict) else None


class Kube:
    """Thin, typed wrappers over the calls the controller needs."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api = api_client or client.ApiClient()
        identity = os.environ.get("POD_NAME") or COMPONENT
        if api_client is None:  # the API server names the field manager after this: each replica's writes show
            self.api.user_agent = f"{identity}/{COMPONENT}"  # as its own in managedFields (who wrote what)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.identity = identity
        self.coordination = client.CoordinationV1Api(self.api)
        # Called before every write: with leader election, leader.Elector.ensure (raises NotLeader when
        # this replica does not hold the Lease by its own clock). The default: a single writer.
        self.write_guard: Callable[[], None] = lambda: None
        self._event_shards = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"events-{i}")
                              for i in range(EVENT_SHARDS)]
        self._events_pending = 0
        self._events_lock = threading.Lock()

    # the leader Lease (leader.py decides; these only call) ----------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _lease_or_none((404,), lambda: self.coordination.read_namespaced_lease(
            name, namespace, _preload_content=False, _request_timeout=LEASE_TIMEOUT))

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The Lease created, or None if one exists already (another replica created it first)."""
        return _lease_or_none((409,), lambda: self.coordination.create_namespaced_lease(
            namespace, body, _preload_content=False, _request_timeout=LEASE_TIMEOUT))

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Update guarded by body's resourceVersion; None on a conflict (another replica wrote first)."""
        return _lease_or_none((404, 409), lambda: self.coordination.replace_namespaced_lease(
            name, namespace, body, _preload_content=False, _request_timeout=LEASE_TIMEOUT))

    # writes ----------------------------------------------------------------------------------
    def write_status(self, job: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource, guarded by the resourceVersion we read; the job written."""
        self.write_guard()
        meta = job["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": patch}
        try:
            return _raw(self.custom.patch_namespaced_custom_object_status(
                c.GROUP, c.VERSION, meta["namespace"], c.PLURAL, meta["name"], body, _preload_content=False))
        except ApiException as exc:
            if exc.status in (404, 409):
                raise Conflict(f"{meta['namespace']}/{meta['name']}: {exc.reason}") from None
            raise

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create a pod or service; AlreadyExists counts as done (creates are replayed after a crash)."""
        self.write_guard()
        ns = manifest["metadata"]["namespace"]
        try:
            if manifest["kind"] == "Pod":
                _discard(self.core.create_namespaced_pod(ns, manifest, _preload_content=False))  # takes dicts
            elif manifest["kind"] == "Service":
                _discard(self.core.create_namespaced_service(ns, manifest, _preload_content=False))
            elif manifest["kind"] == "PodDisruptionBudget":
                _discard(self.policy.create_namespaced_pod_disruption_budget(ns, manifest, _preload_content=False))
            else:
                raise ValueError(f"cannot create {manifest['kind']}")
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def delete_pod(self, namespace: str, name: str, force: bool) -> None:
        """Graceful delete, or grace period 0 for a pod whose node will never confirm the kill."""
        self.write_guard()
        grace = 0 if force else None
        try:
            _discard(self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace,
                                                     body=client.V1DeleteOptions(grace_period_seconds=grace),
                                                     _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def patch_pod_metadata(self, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                           annotations: Mapping[str, str]) -> bool:
        """Merge-patch labels and annotations onto the pod `name` whose uid is `uid` (the uid rides in the patch:
        the API server refuses to change it, 422, so a pod re-created under the same name is not relabelled).
        False if it is gone or another pod now has the name."""
        self.write_guard()
        body = {"metadata": {"uid": uid, "labels": dict(labels), "annotations": dict(annotations)}}
        try:
            _discard(self.core.patch_namespaced_pod(name, namespace, body, _request_timeout=POD_PATCH_TIMEOUT,
                                                    _content_type="application/merge-patch+json",
                                                    _preload_content=False))
            return True
        except ApiException as exc:
            if exc.status in (404, 409) or (exc.status == 422 and _invalid_field(exc) == "metadata.uid"):
                return False
            raise

    def list_job_statuses(self) -> list[dict[str, Any]]:
        """Every job's status, cluster-wide (only when a failure was blamed on a node, for bad-node tainting)."""
        try:
            items = _raw(self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL,
                                                                _preload_content=False))
        except ApiException as exc:  # a namespaced install (watchNamespaces) cannot list cluster-wide
            log.warning("bad-node tainting needs to list jobs cluster-wide: %s", exc.reason)
            return []
        return [item.get("status") or {} for item in items["items"]]

    def taint_node(self, name: str, key: str, message: str) -> bool:
        """Add `key:NoSchedule` to a node (guarded by its resourceVersion) and say why in an event on it."""
        self.write_guard()
        node = _raw(self.core.read_node(name, _preload_content=False))
        taints = list((node.get("spec") or {}).get("taints") or [])
        if any(t.get("key") == key for t in taints):
            return False
        taints.append({"key": key, "value": "repeated-failures", "effect": "NoSchedule"})
        body = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]}, "spec": {"taints": taints}}
        self.core.patch_node(name, body)
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace="default"),
            involved_object=client.V1ObjectReference(api_version="v1", kind="Node", name=name,
                                                     uid=node["metadata"].get("uid")),
            reason=c.REASON_NODE_TAINTED, message=message[:1024], type="Warning", count=1,
            first_timestamp=now, last_timestamp=now, source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT, reporting_instance=self.identity,
        )
        try:
            self.core.create_namespaced_event("default", event)
        except ApiException as exc:
            log.warning("could not post event %s on node %s: %s", c.REASON_NODE_TAINTED, name, exc.reason)
        return True

    def delete_pdb(self, namespace: str, name: str) -> None:
        """Release an attempt's PodDisruptionBudget; one already gone is fine."""
        self.write_guard()
        try:
            _discard(self.policy.delete_namespaced_pod_disruption_budget(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise

    # Kueue (reads come from the caches: cache.py) ---------------------------------------------------
    def served(self, group: str, version: str) -> bool:
        """Is group/version served (e.g. Kueue's CRDs installed)? Discovery: no RBAC needed."""
        try:
            resources = client.ApisApi(self.api).get_api_versions()
        except ApiException as exc:
            log.warning("API discovery failed: %s", exc.reason)
            return False
        return any(g.name == group and any(v.version == version for v in g.versions or []) for g in resources.groups)

    def create_workload(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create the job's Workload; the object created, or None if it exists already (a replayed create)."""
        self.write_guard()
        try:
            return dict(_raw(self.custom.create_namespaced_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, manifest["metadata"]["namespace"], c.WORKLOADS, manifest,
                _preload_content=False)))
        except ApiException as exc:
            if exc.status != 409:
                raise
            return None

    def patch_workload_status(self, namespace: str, name: str, resource_version: str,
                              status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the Workload's status, guarded by the resourceVersion we decided on (Kueue writes it
        too); the Workload written."""
        self.write_guard()
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            return dict(_raw(self.custom.patch_namespaced_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, c.WORKLOADS, name, body, _preload_content=False)))
        except ApiException as exc:
            if exc.status in (404, 409):
                raise Conflict(f"workload {namespace}/{name}: {exc.reason}") from None
            raise

    def delete_workload(self, namespace: str, name: str) -> None:
        self.write_guard()
        try:
            self.custom.delete_namespaced_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, c.WORKLOADS, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def emit_event(self, job: dict[str, Any], etype: str, reason: str, message: str) -> None:
        """A core/v1 Event on the job, so `kubectl describe rtj` tells the story: queued and posted by an event
        thread (its time is now's, so the story keeps its order); never raises for the API's answer."""
        self.write_guard()
        with self._events_lock:
            if self._events_pending >= MAX_PENDING_EVENTS:
                EVENTS_DROPPED.inc()
                log.warning("event %s on %s dropped: %d events wait to be posted", reason,
                            job["metadata"]["name"], self._events_pending)
                return
            self._events_pending += 1
        meta = job["metadata"]
        shard = zlib.crc32(f"{meta['namespace']}/{meta['name']}".encode()) % EVENT_SHARDS
        args = (dict(meta), etype, reason, message, datetime.now(UTC))
        try:
            self._event_shards[shard].submit(self._post_event, *args)
        except RuntimeError:  # shutting down
            with self._events_lock:
                self._events_pending -= 1

    def _post_event(self, meta: dict[str, Any], etype: str, reason: str, message: str, now: datetime) -> None:
        try:
            self._create_event(meta, etype, reason, message, now)
        except Exception as exc:  # NotLeader (the Lease was lost meanwhile), a timeout: never the thread's end
            log.warning("could not post event %s on %s: %s: %s", reason, meta.get("name"), type(exc).__name__, exc)
        finally:
            with self._events_lock:
                self._events_pending -= 1

    def flush_events(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event was posted (or `timeout`); True when none is left."""
        done = threading.Event()
        remaining = [len(self._event_shards)]

        def one_done() -> None:
            with self._events_lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        for shard in self._event_shards:
            shard.submit(one_done)
        return done.wait(timeout)

    def _create_event(self, meta: dict[str, Any], etype: str, reason: str, message: str, now: datetime) -> None:
        self.write_guard()  # again: this replica may have lost the Lease while the event waited
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=c.API_VERSION, kind=c.KIND, name=meta["name"], namespace=meta["namespace"],
                uid=meta["uid"], resource_version=meta.get("resourceVersion"),
            ),
            reason=reason, message=message[:1024], type=etype, count=1,
            first_timestamp=now, last_timestamp=now,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT, reporting_instance=self.identity,
        )
        try:
            _discard(self.core.create_namespaced_event(meta["namespace"], event, _preload_content=False,
                                                       _request_timeout=EVENT_TIMEOUT))
        except ApiException as exc:  # an event is never worth failing a reconcile
            log.warning("could not post event %s on %s: %s", reason, meta["name"], exc.reason)
