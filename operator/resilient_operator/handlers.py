"""Wiring: cache events turn into work-queue keys; workers run the controller. Nothing decides here.

kopf is the runtime (start-up, liveness, cleanup); the watches are our informers (cache.py), because a
cache fed by kopf's watches cannot learn what was deleted while a watch was down. Watched: jobs, their
pods (by label), nodes, node Leases and, with the Kueue integration on (RTJ_KUEUE_ENABLED and Kueue's API
served), the operator's Workloads, ResourceFlavors and WorkloadPriorityClasses. A job is queued when it,
one of its pods, its Workload, or a node hosting its pods changes; jobs whose size depends on capacity
(waiting, or running below their desired size) are also queued when any node changes or a lease is seen
renewed. A lease going stale sends no event, so the core's `requeue_after` (the lease deadline) brings the
job back instead.

High availability (leader.py): every replica runs its informers and routes events into its queue, but
only the replica that holds the leader Lease starts the workers that reconcile; a standby's queue just
collects keys, so at takeover every job is looked at once, from caches that are already warm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import socket
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf
from prometheus_client import start_http_server

from resilient_operator import constants as c
from resilient_operator import controller, delivery, discovery, leader, metrics, plankey
from resilient_operator.cache import ClusterCache
from resilient_operator.core import routing
from resilient_operator.informer import Obj
from resilient_operator.kube import Conflict, Kube, load_config
from resilient_operator.settings import Settings
from resilient_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)
JobKey = tuple[str, str]
ERROR_RETRY_SECONDS = 1.0
MAX_ERROR_RETRY_SECONDS = 10.0
BLIND_RETRY_SECONDS = 1.0  # an API outage should not delay recovery by more than this


@dataclass
class State:
    """In-memory routing only (which job to wake); every decision re-reads the caches."""

    settings: Settings
    queue: WorkQueue[JobKey] = field(default_factory=WorkQueue)
    kube: Kube | None = None
    cache: ClusterCache | None = None
    phases: dict[JobKey, str] = field(default_factory=dict)
    capacity_bound: set[JobKey] = field(default_factory=set)
    pods_on_node: dict[str, dict[str, JobKey]] = field(default_factory=lambda: defaultdict(dict))
    errors: dict[JobKey, int] = field(default_factory=dict)  # consecutive failed reconciles, for backoff
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    elector: leader.Elector | None = None
    reconcilers: ThreadPoolExecutor | None = None  # one thread per worker (_start_workers)
    deliverer: delivery.Deliverer | None = None  # in-place plans (None: no signing key, every restart recreates)


def _state(memo: Any) -> State:
    return memo.state


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    state = _state(memo)
    settings.posting.level = logging.WARNING  # kopf's own events: problems only
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.scanning.disabled = True  # no CRD/namespace discovery: the RBAC grants only what we use
    settings.peering.standalone = True  # no kopf peering: the leader Lease decides who writes (leader.py)
    load_config()
    state.kube = Kube()
    await _load_plan_key(state)
    discovery.start(state.settings.discovery)  # checkpoint discovery's sandboxed worker pool
    if state.settings.metrics_port:
        start_http_server(state.settings.metrics_port)
    loop = asyncio.get_running_loop()

    def notify(resource: str, etype: str, old: Obj | None, new: Obj | None) -> None:
        loop.call_soon_threadsafe(_route, state, resource, etype, old, new)

    kueue = state.settings.kueue and await asyncio.to_thread(state.kube.served, c.KUEUE_GROUP, c.KUEUE_VERSION)
    if state.settings.kueue and not kueue:  # no error loop: queue-labelled jobs wait, saying why
        log.warning("the Kueue integration is on but %s is not served (Kueue not installed?): jobs labelled %s "
                    "stay Queued; restart the operator once Kueue is installed", c.KUEUE_API_VERSION,
                    c.LABEL_QUEUE_NAME)
    state.cache = ClusterCache(state.kube.api, state.settings.namespaces, notify, kueue=kueue)
    state.cache.start()
    while not await asyncio.to_thread(state.cache.wait_synced, 10):  # workers read only a filled cache
        log.info("waiting for the caches to sync")
    if os.environ.get("RTJ_LEADER_ELECTION", "true").strip().lower() == "false":  # one replica, no Lease
        metrics.LEADER.set(1)
        _start_workers(state)
        return
    leading = asyncio.Event()
    state.elector = leader.Elector(
        state.kube, os.environ.get("POD_NAMESPACE") or "default",
        os.environ.get("RTJ_LEADER_LEASE_NAME") or "resilient-training-operator",
        os.environ.get("POD_NAME") or socket.gethostname(), leader.timings_from_environ(),
        on_lead=lambda: loop.call_soon_threadsafe(leading.set))
    state.kube.write_guard = state.elector.ensure  # no write unless the Lease is ours, by our own clock
    state.tasks.append(asyncio.create_task(_lead(state, leading), name="rtj-lead"))
    state.elector.start()  # a standby only after its caches are filled: it may take over at any moment


async def _load_plan_key(state: State) -> None:
    """The signing key for in-place plans (plankey.py); without it every job's restarts recreate, said once."""
    assert state.kube is not None
    ds = state.settings.delivery
    try:
        key = await asyncio.to_thread(plankey.load, state.kube.core, ds.namespace, ds.plan_key_secret)
    except Exception as exc:  # RBAC, a malformed Secret: run on, recreating, and say why
        log.warning("no plan signing key (%s/%s: %s): restartStrategy InPlace jobs recreate their pods on every "
                    "restart", ds.namespace, ds.plan_key_secret, exc)
        return
    state.deliverer = delivery.Deliverer(state.kube, key.private, ds.workers, ds.timeout_seconds)
    config = dataclasses.replace(state.settings.config, plan_public_key=key.public)
    state.settings = dataclasses.replace(state.settings, config=config)


async def _lead(state: State, leading: asyncio.Event) -> None:
    """Standby until the Lease is ours; then reconcile every job once, and everything routed from then on."""
    log.info("standby: caches warm, waiting for the leader Lease")
    await leading.wait()
    assert state.cache is not None
    for key in state.cache.job_keys():
        state.queue.add(key)
    _start_workers(state)


def _start_workers(state: State) -> None:
    # Their own threads, as many as workers: asyncio's default executor has min(32, CPUs + 4), 6 on 2 cores, so
    # RTJ_WORKERS=8 ran 6 reconciles at once, and every other `to_thread` call queued behind them.
    state.reconcilers = ThreadPoolExecutor(max_workers=state.settings.workers, thread_name_prefix="reconcile")
    for index in range(state.settings.workers):
        state.tasks.append(asyncio.create_task(_worker(state), name=f"rtj-worker-{index}"))


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    state = _state(memo)
    for task in state.tasks:
        task.cancel()
    if state.elector is not None:  # released: a standby takes over within a retry period
        state.elector.stop(release=True)
    discovery.shutdown()
    if state.deliverer is not None:
        state.deliverer.close()
    if state.reconcilers is not None:
        state.reconcilers.shutdown(wait=False, cancel_futures=True)
    if state.kube is not None:  # the events of the last reconciles, within the pod's grace
        await asyncio.to_thread(state.kube.flush_events, 5.0)
    if state.cache is not None:
        state.cache.stop()


async def _worker(state: State) -> None:
    assert state.kube is not None and state.cache is not None
    while True:
        key = await state.queue.get()
        if state.cache.blind():  # judging node health now would count our own blindness against nodes
            state.queue.done(key)
            state.queue.add(key, BLIND_RETRY_SECONDS)
            continue
        try:
            requeue, phase = await asyncio.get_running_loop().run_in_executor(
                state.reconcilers, functools.partial(controller.reconcile_job, state.kube, state.cache, *key,
                                                     state.settings.config, state.settings.kueue, state.deliverer))
            if phase:
                _note_phase(state, key, phase)
            state.errors.pop(key, None)
            if requeue is not None:
                state.queue.add(key, requeue)
        except Conflict:
            state.queue.add(key)  # someone else wrote first; read again
        except leader.NotLeader as exc:  # the elector exits the process; nothing more is written
            log.error("reconcile of %s/%s stopped before writing: %s", *key, exc)
        except Exception as exc:
            failures = state.errors[key] = state.errors.get(key, 0) + 1
            delay = min(ERROR_RETRY_SECONDS * 2 ** (failures - 1), MAX_ERROR_RETRY_SECONDS)
            metrics.RECONCILE_ERRORS.labels(error=type(exc).__name__).inc()
            log.exception("reconcile of %s/%s failed (%d in a row); retrying in %ss", *key, failures, delay)
            state.queue.add(key, delay)
        finally:
            state.queue.done(key)


def _note_phase(state: State, key: JobKey, phase: str) -> None:
    old = state.phases.get(key)
    state.phases[key] = phase
    if old != phase:
        if old:
            metrics.JOBS_BY_PHASE.labels(phase=old).dec()
        metrics.JOBS_BY_PHASE.labels(phase=phase).inc()


def _route(state: State, resource: str, etype: str, old: Obj | None, new: Obj | None) -> None:
    """Which jobs an event wakes (on the event loop, called from the informers' threads)."""
    obj = new if new is not None else old
    if obj is None:
        return
    if resource == "jobs":
        _job_event(state, etype, obj)
    elif resource == "pods":
        _pod_event(state, etype, obj)
    elif resource == "nodes":
        _wake_for_node(state, obj["metadata"]["name"])
    elif resource == "leases":  # a renewal is good news for that node; only capacity-bound jobs care
        for key in state.capacity_bound:
            state.queue.add(key)
    elif resource == "workloads":  # Kueue admitted, evicted or requeued it (ownership is checked by uid later)
        job = (obj["metadata"].get("labels") or {}).get(c.LABEL_JOB)
        if isinstance(job, str) and job:
            state.queue.add((obj["metadata"]["namespace"], job))


def _job_event(state: State, etype: str, body: Obj) -> None:
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if etype == "DELETED":
        state.queue.forget(key)
        state.capacity_bound.discard(key)
        if key in state.phases:
            metrics.JOBS_BY_PHASE.labels(phase=state.phases.pop(key)).dec()
        metrics.forget_job(*key)
        return
    if routing.capacity_bound(body.get("spec") or {}, body.get("status") or {}):
        state.capacity_bound.add(key)
    else:
        state.capacity_bound.discard(key)
    state.queue.add(key)


def _pod_event(state: State, etype: str, body: Obj) -> None:
    meta = body["metadata"]
    job = (meta.get("labels") or {}).get(c.LABEL_JOB)
    if not isinstance(job, str):
        return
    key = (meta["namespace"], job)
    node = (body.get("spec") or {}).get("nodeName")
    if node:
        if etype == "DELETED":
            on_node = state.pods_on_node.get(node)
            if on_node is not None:
                on_node.pop(meta["name"], None)
                if not on_node:
                    del state.pods_on_node[node]
        else:
            state.pods_on_node[node][meta["name"]] = key
    state.queue.add(key)


def _wake_for_node(state: State, node: str) -> None:
    for key in set(state.pods_on_node.get(node, {}).values()) | state.capacity_bound:
        state.queue.add(key)
