"""One job's observe -> decide -> apply pass. Decisions are the core's; this only reads and writes.

Apply order is crash-safe: fence (delete pods), write status once (guarded by resourceVersion),
create (AlreadyExists is fine), then emit events, which therefore never describe an unwritten state.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from resilient_contract import layout
from resilient_operator import constants as c
from resilient_operator import metrics, views
from resilient_operator.cache import ClusterCache
from resilient_operator.core import Job, NodeView, Plan, PodView, reconcile
from resilient_operator.core.timeutil import parse
from resilient_operator.kube import Kube

log = logging.getLogger(__name__)


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 merge patch turning `old` into `new`: removed keys become null. None if equal."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None if old == new else new
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        else:
            sub = merge_patch(old[key], value)
            if sub is not None or (value is None and old[key] is not None):
                patch[key] = sub
    return patch or None


def observe(cache: ClusterCache, namespace: str, name: str) -> tuple[dict[str, Any], Job, list[PodView],
                                                                     dict[str, NodeView], layout.Listing] | None:
    """Memory only: the job, its pods and the node views from the watch-fed caches, plus storage."""
    obj = cache.job(namespace, name)
    if obj is None:
        return None  # deleted: garbage collection removes its pods and Service (owner references)
    job = views.job_view(obj)
    pods = [views.pod_view(p) for p in cache.job_pods(namespace, name)]
    nodes = cache.node_views()
    listing = layout.discover(job.spec.checkpoint_root) if not job.problem else layout.Listing("", None, (), None, True)
    return obj, job, pods, nodes, listing


def apply(kube: Kube, cache: ClusterCache, obj: dict[str, Any], plan: Plan) -> None:
    """Write what the plan asks, skipping creates and deletes issued before that the cache does not show yet."""
    ns = obj["metadata"]["namespace"]
    for name in plan.force_delete:
        if not cache.expected("force-delete", ns, name):
            kube.delete_pod(ns, name, force=True)
            cache.expect("force-delete", ns, name)
    for name in plan.delete:
        if not (cache.expected("delete", ns, name) or cache.expected("force-delete", ns, name)):
            kube.delete_pod(ns, name, force=False)
            cache.expect("delete", ns, name)
    patch = merge_patch(obj.get("status") or {}, plan.status)
    if patch:
        cache.wrote_job(kube.write_status(obj, patch))
    for manifest in plan.manifests():  # rendered one at a time
        try:
            _create(kube, cache, manifest)
        except ApiException as exc:
            if exc.status and 400 <= exc.status < 500:  # admission, quota, an invalid template: say so
                what = f"{manifest['kind']} {manifest['metadata']['name']}"
                kube.emit_event(obj, "Warning", c.REASON_CREATE_REJECTED, f"cannot create {what}: {_api_message(exc)}")
            raise
    for event in plan.events:
        kube.emit_event(obj, event.type, event.reason, event.message)


def _create(kube: Kube, cache: ClusterCache, manifest: dict[str, Any]) -> None:
    meta = manifest["metadata"]
    ns, name = meta["namespace"], meta["name"]
    if manifest["kind"] == "Service":  # not watched: remembered per job uid once it exists
        owner = next((r.get("uid", "") for r in meta.get("ownerReferences") or []), "")
        if not cache.service_known(ns, name, owner):
            kube.create(manifest)
            cache.service_exists(ns, name, owner)
    elif not cache.expected("create", ns, name):
        kube.create(manifest)
        cache.expect("create", ns, name)


def _api_message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body or "{}").get("message") or str(exc.reason)
    except ValueError:
        return str(exc.reason)


def record(before: dict[str, Any], after: dict[str, Any], nodes: dict[str, NodeView], now: datetime) -> None:
    """Metrics from the status transition (measurements only; no decision is made here)."""
    old_r, new_r = before.get("restarts") or {}, after.get("restarts") or {}
    failure = after.get("lastFailure") or {}
    for kind, key in ((c.INFRASTRUCTURE, "infrastructure"), (c.APPLICATION, "application"), ("Planned", "planned")):
        if new_r.get(key, 0) > old_r.get(key, 0):
            reason = failure.get("reason", "") if kind != "Planned" else c.REASON_GROW_BACK
            metrics.RESTARTS.labels(kind=kind, reason=reason).inc()
    if failure and failure != before.get("lastFailure") and failure.get("node") in nodes:
        renewed = nodes[failure["node"]].lease_renewed
        if renewed:
            metrics.TIME_TO_DETECT.observe((now - renewed).total_seconds())
    detected = parse(failure.get("time"))
    if after.get("attempt", 0) > before.get("attempt", 0) and detected and failure.get("attempt") == before.get(
        "attempt"
    ):
        metrics.TIME_TO_RELAUNCH.observe((now - detected).total_seconds())


def reconcile_job(kube: Kube, cache: ClusterCache, namespace: str, name: str) -> tuple[float | None, str | None]:
    """Run one pass; returns (seconds until the core wants another look, the phase written)."""
    with metrics.RECONCILE_SECONDS.time():
        observed = observe(cache, namespace, name)
        if observed is None:
            return None, None
        obj, job, pods, nodes, listing = observed
        now = cache.clock.now()  # the clock the lease probes were timed with
        plan = reconcile(job, pods, nodes, listing, now)
        apply(kube, cache, obj, plan)
        record(obj.get("status") or {}, plan.status, nodes, now)
        for event in plan.events:
            log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
        return plan.requeue_after, plan.status.get("phase")
