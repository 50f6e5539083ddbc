"""One job's observe -> decide -> apply pass. Decisions are the core's; this only reads and writes.

Apply order is crash-safe: fence (delete pods), write status once (guarded by resourceVersion),
create (AlreadyExists is fine), then emit events, which therefore never describe an unwritten state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from resilient_contract import progress
from resilient_contract.storage import roots
from resilient_contract.storage.listing import Listing
from resilient_operator import constants as c
from resilient_operator import discovery, metrics, views
from resilient_operator.cache import ClusterCache
from resilient_operator.core import Job, NodeView, Plan, PodView, badcheckpoints, badnodes, history, reconcile
from resilient_operator.core.model import OperatorConfig, Progress, WorkloadPriority, WorkloadView
from resilient_operator.core.plan import Delivery, Render
from resilient_operator.core.reconcile import needs_discovery
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


Observed = tuple[dict[str, Any], Job, list[PodView], dict[str, NodeView], Listing, dict[str, progress.Report]]


def observe(cache: ClusterCache, namespace: str, name: str, config: OperatorConfig | None = None,
            ) -> Observed | None:
    """Memory only: the job, its pods and the node views from the watch-fed caches, plus storage: the listing
    and the progress reports of the job's own current pods, both read in the sandbox."""
    obj = cache.job(namespace, name)
    if obj is None:
        return None  # deleted: garbage collection removes its pods and Service (owner references)
    job = views.job_view(obj)
    pods = [views.pod_view(p) for p in cache.job_pods(namespace, name)]
    nodes = cache.node_views()
    if job.problem:  # the core refuses the job; nothing to read
        return obj, job, pods, nodes, Listing("", None, (), None, True), {}
    key = views.root_key(obj)
    if key and (holder := views.root_holder(job, obj, cache.jobs_with_root(key))):
        job = dataclasses.replace(job, root_in_use_by=holder)  # refused (RootInUse): nothing to read either
        return obj, job, pods, nodes, Listing(job.spec.checkpoint_root, None, (), None, True), {}
    if not needs_discovery(job, pods, nodes, cache.clock.now(), config or OperatorConfig()):
        return obj, job, pods, nodes, Listing(job.spec.checkpoint_root, None, reason=c.DISCOVERY_SKIPPED), {}
    # Sandboxed (worker process, deadline, limits): the root is written by the job's own pods.
    attempt = job.status.get("attempt")
    ours = [p.name for p in pods if p.owner_uid == job.uid and p.attempt == attempt] \
        if isinstance(attempt, int) and not isinstance(attempt, bool) else []
    listing, reports = discovery.discover_with_reports(job.spec.checkpoint_root, namespace, job.uid,
                                                       history.lineage_starts(job.status), ours,
                                                       badcheckpoints.names(job.status))
    return obj, job, pods, nodes, listing, reports


def read_progress(job: Job, pods: list[PodView], now: datetime | None = None,
                  found: dict[str, progress.Report] | None = None) -> list[Progress]:
    """The launchers' reports for the pods of the job's current attempt: `found` is what the sandboxed worker
    read (discovery.read_reports: relative to the root's fd, no link followed, bounded, parsed); nothing is
    read here, in the operator's own process."""
    root = job.spec.checkpoint_root
    if roots.is_object_store(root) or not found:
        return []  # an s3:// root: the launchers' reports are files on a shared volume, not objects
    attempt = int(job.status.get("attempt") or 0) if isinstance(job.status.get("attempt"), int) else 0
    out = []
    for pod in pods:
        if job.problem or pod.attempt != attempt or not root or pod.owner_uid != job.uid:
            continue  # only the job's own pods (by uid, never labels): a stray pod's report is nobody's
        report = found.get(pod.name)
        if report is None or report.attempt != pod.attempt:
            continue
        out.append(Progress(pod=pod.name, attempt=report.attempt, step=report.step,
                            updated=_epoch(report.time, now), step_seconds=report.step_seconds,
                            slowest_rank=report.slowest_rank,
                            first_step_at=_epoch(report.first_step_at, now) if report.first_step_at else None,
                            hung=report.hung))
    return out


def _epoch(seconds: float, now: datetime | None) -> datetime:
    """A launcher's epoch seconds (bounded by the parser) as a time, never later than the operator's now."""
    when = datetime.fromtimestamp(min(seconds, progress.MAX_EPOCH), UTC)
    return min(when, now) if now is not None else when


def observe_workload(cache: ClusterCache, job: Job) -> WorkloadView | None:
    """For a Kueue-managed job, from the caches: its Workload (owned by it, by uid) and the flavors its
    admission names. A job without a queue name reads nothing."""
    if not job.queue_name:
        return None
    owned = [w for w in cache.job_workloads(job.namespace, job.name)
             if views.controller_uid(w.get("metadata") or {}) == job.uid]
    if not owned:
        return None
    # The newest live one; one being deleted (replaced by a new admission) only while no other exists.
    raw = max(owned, key=lambda w: (not w["metadata"].get("deletionTimestamp"),
                                    str(w["metadata"].get("creationTimestamp") or "")))
    flavors = {name: f for name in views.workload_flavors(raw) if (f := cache.flavor(name)) is not None}
    return views.workload_view(raw, flavors)


def with_priority(cache: ClusterCache, obj: dict[str, Any], job: Job) -> Job:
    """The job with the value of the WorkloadPriorityClass its label names (absent class: no priority)."""
    name = views.priority_class(obj.get("metadata") or {})
    if not job.queue_name or not name:
        return job
    value = (cache.priority_class(name) or {}).get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        return job
    return dataclasses.replace(job, priority=WorkloadPriority(name, value))


def apply_workload(kube: Kube, cache: ClusterCache, obj: dict[str, Any], plan: Plan) -> None:
    """The Kueue part of a plan: report on or release the observed Workload, replace or create one."""
    ns = obj["metadata"]["namespace"]
    if plan.workload_status is not None and plan.workload_ref is not None:
        cache.wrote_workload(kube.patch_workload_status(ns, *plan.workload_ref, plan.workload_status))
    if plan.workload_delete and not cache.expected("delete-workload", ns, plan.workload_delete):
        kube.delete_workload(ns, plan.workload_delete)
        cache.expect("delete-workload", ns, plan.workload_delete)
    if plan.workload_create is not None:
        manifest = plan.workload_create()
        name = manifest["metadata"]["name"]
        if not cache.expected("create-workload", ns, name):
            kube.create_workload(manifest)
            cache.expect("create-workload", ns, name)


class Deliver(Protocol):
    """Where in-place plans go (delivery.Deliverer): queued, never awaited by the reconcile."""

    def submit(self, namespace: str, deliveries: Iterable[Delivery]) -> int: ...

    def failed(self, namespace: str, attempt: int) -> Mapping[str, str]: ...


def apply(kube: Kube, cache: ClusterCache, obj: dict[str, Any], plan: Plan, deliver: Deliver | None = None) -> None:
    """Write what the plan asks, skipping creates and deletes issued before that the cache does not show yet.

    First, the leader check (leader.Elector.ensure; NotLeader unless this replica renewed its Lease within the
    renew deadline); Kube repeats it before each call, so a replica that lost the Lease mid-batch stops there."""
    kube.write_guard()
    ns = obj["metadata"]["namespace"]

    def force_delete(name: str) -> None:
        kube.delete_pod(ns, name, force=True)
        cache.expect("force-delete", ns, name)

    def delete(name: str) -> None:
        kube.delete_pod(ns, name, force=False)
        cache.expect("delete", ns, name)

    fan_out([partial(force_delete, name) for name in plan.force_delete
             if not cache.expected("force-delete", ns, name)])
    fan_out([partial(delete, name) for name in plan.delete
             if not (cache.expected("delete", ns, name) or cache.expected("force-delete", ns, name))])
    patch = merge_patch(obj.get("status") or {}, plan.status)
    if patch:
        cache.wrote_job(kube.write_status(obj, patch))
        log.debug("%s/%s: status written (%s)", ns, obj["metadata"]["name"], ", ".join(sorted(patch)))
    if plan.deliver and deliver is not None:  # after the status names the new attempt, so a crash resumes it
        deliver.submit(ns, plan.deliver)
    try:
        _create_all(kube, cache, plan.create)
    except _Rejected as exc:  # admission, quota, an invalid template: say so, once per reconcile
        message = f"cannot create {exc.what}: {_api_message(exc.error)}"
        kube.emit_event(obj, "Warning", c.REASON_CREATE_REJECTED, message)
        raise exc.error from None
    for name in plan.release:
        kube.delete_pdb(ns, name)
    apply_workload(kube, cache, obj, plan)
    for event in plan.events:
        kube.emit_event(obj, event.type, event.reason, event.message)


# A gang's pod writes go out together, not one after another: at hundreds of pods the sequential calls
# (8 deletes, then 8 creates, each a round trip to a busy API server) held every worker for seconds and
# delayed the last hit job's relaunch by as much. One pool for all workers bounds the requests in flight
# and the manifests rendered at once (each is rendered by the thread that creates it).
FAN_OUT = 16
_pool = ThreadPoolExecutor(max_workers=FAN_OUT, thread_name_prefix="writes")


def fan_out(calls: list[Callable[[], None]]) -> None:
    """Run the calls concurrently; every call runs, then the first failure (in call order) is raised."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    futures = [_pool.submit(call) for call in calls]
    wait(futures)
    for future in futures:
        if (error := future.exception()) is not None:
            raise error


class _Rejected(Exception):
    """A create the API server refused as a client error (4xx): reported once, then re-raised."""

    def __init__(self, what: str, error: ApiException) -> None:
        super().__init__(what)
        self.what, self.error = what, error


def _create_all(kube: Kube, cache: ClusterCache, renders: list[Render]) -> None:
    """The objects before the first pod (the rendezvous Service, the budget) one by one, then the pods together.

    A refused Service must stop the pods: the next reconcile sees ranks missing and creates both again, while
    a gang created without its Service would never get one."""
    pending = iter(renders)
    for render in pending:
        manifest = render()
        if manifest["kind"] == "Pod":
            fan_out([partial(_create_checked, kube, cache, manifest),
                     *(partial(_render_and_create, kube, cache, r) for r in pending)])
            return
        _create_checked(kube, cache, manifest)


def _render_and_create(kube: Kube, cache: ClusterCache, render: Render) -> None:
    _create_checked(kube, cache, render())


def _create_checked(kube: Kube, cache: ClusterCache, manifest: dict[str, Any]) -> None:
    try:
        _create(kube, cache, manifest)
    except ApiException as exc:
        if exc.status and 400 <= exc.status < 500:
            raise _Rejected(f"{manifest['kind']} {manifest['metadata']['name']}", exc) from exc
        raise


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


def _newly_blamed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    def times(st: dict[str, Any]) -> int:
        # only attested blames (badnodes.py): a failure a tenant can forge never even triggers the LIST
        return sum(len(e.get("attestedTimes") or []) for e in st.get("badNodes") or [] if isinstance(e, dict))

    return times(after) > times(before)


def taint_bad_nodes(kube: Kube, config: OperatorConfig, nodes: dict[str, NodeView], now: datetime) -> None:
    """Opt-in: taint nodes blamed for repeated failures across jobs (one LIST of jobs, only after a blame)."""
    assert config.bad_node_taint
    decisions = badnodes.to_taint(kube.list_job_statuses(), nodes, now, config.bad_node_taint,
                                  config.bad_node_failures, config.bad_node_window_seconds,
                                  config.bad_node_max_fraction)
    for decision in decisions:
        if kube.taint_node(decision.node, config.bad_node_taint, decision.message):
            log.warning("tainted node %s: %s", decision.node, decision.message)


def reconcile_job(kube: Kube, cache: ClusterCache, namespace: str, name: str,
                  config: OperatorConfig | None = None, kueue: bool = False,
                  deliver: Deliver | None = None) -> tuple[float | None, str | None]:
    """Run one pass; returns (seconds until the core wants another look, the phase written)."""
    with metrics.RECONCILE_SECONDS.time():
        observed = observe(cache, namespace, name, config)
        if observed is None:
            return None, None
        obj, job, pods, nodes, listing, found = observed
        workload = None
        if not kueue:  # the integration is off: a queue-name label means nothing to the operator
            job = dataclasses.replace(job, queue_name=None)
        elif cache.kueue:  # on and served (otherwise the core holds queue-labelled jobs, saying why)
            job = with_priority(cache, obj, job)
            workload = observe_workload(cache, job)
        now = cache.clock.now()  # the clock the lease probes were timed with
        reports = read_progress(job, pods, now, found) if not listing.error else []  # only under an accepted root
        attempt = job.status.get("attempt")
        undeliverable = deliver.failed(namespace, attempt) if deliver is not None and isinstance(attempt, int) \
            else {}
        plan = reconcile(job, pods, nodes, listing, now, progress=reports,
                         config=config or OperatorConfig(), workload=workload, kueue_ready=cache.kueue,
                         undeliverable=undeliverable)
        apply(kube, cache, obj, plan, deliver)
        record(obj.get("status") or {}, plan.status, nodes, now)
        metrics.record_job(namespace, name, obj.get("status") or {}, plan.status)
        where = {p.name: p.node_name or "" for p in pods}
        metrics.record_steps(namespace, name, {(r.pod, where.get(r.pod, "")): r.step_seconds for r in reports
                                                if r.step_seconds is not None})
        if config and config.bad_node_taint and _newly_blamed(obj.get("status") or {}, plan.status):
            taint_bad_nodes(kube, config, nodes, now)
        for event in plan.events:
            log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
        return plan.requeue_after, plan.status.get("phase")
