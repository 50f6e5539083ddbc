"""What a reconcile reads: watch-fed caches of jobs, the operator's pods, nodes and node Leases, and (Kueue
integration on) the operator's Workloads, Kueue's ResourceFlavors and WorkloadPriorityClasses.

Steady state makes no LIST calls: each resource is one list+watch (`informer.Informer`). Node views are
built when a node or its Lease changes, not per reconcile, and carry the operator-clock time at which
the Lease was *seen* renewed (`core.probes`). A stale read is safe: the status write is guarded by the
resourceVersion read (a Conflict requeues), and creates/deletes already issued are remembered until
the watch shows them (controller-runtime's "expectations"), so a stale pod list causes no repeated
create or delete.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from resilient_operator import constants as c
from resilient_operator import views
from resilient_operator.core import NodeView
from resilient_operator.core.probes import LeaseProbes
from resilient_operator.informer import Informer, Obj, strip_managed_fields, wait_all_synced
from resilient_operator.kube import NODE_LEASE_NAMESPACE

EXPECTATION_SECONDS = 30.0  # after this an unconfirmed create/delete may be issued again
log = logging.getLogger(__name__)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# (resource "jobs" | "pods" | "nodes" | "leases" | "workloads", event type, old, new): on the informer's thread.
Notify = Callable[[str, str, Obj | None, Obj | None], None]


class OperatorClock:
    """Wall time as of start-up advanced by the monotonic clock: a wall-clock step cannot age a lease."""

    def __init__(self) -> None:
        self._wall0 = datetime.now(UTC)
        self._mono0 = time.monotonic()

    def now(self) -> datetime:
        return self._wall0 + timedelta(seconds=time.monotonic() - self._mono0)


def _strip_job(obj: Obj) -> Obj:
    strip_managed_fields(obj)
    (obj.get("metadata", {}).get("annotations") or {}).pop(LAST_APPLIED, None)  # a copy of the spec
    return obj


def _strip_node(obj: Obj) -> Obj:
    strip_managed_fields(obj)
    (obj.get("status") or {}).pop("images", None)  # can be tens of KiB per node; nobody reads it
    return obj


POD_ANNOTATIONS_READ = frozenset({c.ANNOTATION_REPLICAS, c.ANNOTATION_RESUME_FROM, c.ANNOTATION_RESUME_STEP,
                                   c.ANNOTATION_TEMPLATE_HASH})


def strip_pod(obj: Obj) -> Obj:
    """Keep what `views.pod_view` reads. The spec (the rendered template: env, volumes, affinity) is most
    of a pod; at 16,000 pods the whole objects alone would cost the operator ~270 MiB."""
    strip_managed_fields(obj)
    meta = obj.get("metadata") or {}
    if isinstance(meta.get("annotations"), dict):  # the template's own annotations can be large; ours are read
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k in POD_ANNOTATIONS_READ}
    node = (obj.get("spec") or {}).get("nodeName")
    obj["spec"] = {"nodeName": node} if node else {}
    status = obj.get("status") or {}
    for unread in ("initContainerStatuses", "podIPs", "hostIPs", "hostIP", "qosClass"):  # podIP: InPlace plans
        status.pop(unread, None)
    return obj


def _pod_job(obj: Obj) -> Hashable | None:
    meta = obj["metadata"]
    job = (meta.get("labels") or {}).get(c.LABEL_JOB)
    return (meta.get("namespace"), job) if isinstance(job, str) else None


def _list_calls(custom: client.CustomObjectsApi, core: client.CoreV1Api,
                ns: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The list functions for jobs and pods, in one namespace or ("") all of them."""
    if not ns:
        return (lambda **kw: custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL, **kw),
                core.list_pod_for_all_namespaces)
    return (lambda **kw: custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL, **kw),
            lambda **kw: core.list_namespaced_pod(ns, **kw))


def _workload_list(custom: client.CustomObjectsApi, ns: str) -> Callable[..., Any]:
    """Kueue Workloads in one namespace or ("") all of them."""
    if not ns:
        return lambda **kw: custom.list_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION, c.WORKLOADS, **kw)
    return lambda **kw: custom.list_namespaced_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION, ns, c.WORKLOADS, **kw)


def _kueue_cluster_list(custom: client.CustomObjectsApi, plural: str) -> Callable[..., Any]:
    return lambda **kw: custom.list_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION, plural, **kw)


class ClusterCache:
    """The informers, the lease probes and the node views; every read is memory only."""

    def __init__(self, api: client.ApiClient, namespaces: tuple[str, ...], notify: Notify,
                 kueue: bool = False) -> None:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        coordination = client.CoordinationV1Api(api)
        self.clock = OperatorClock()
        self._notify = notify
        self._probes = LeaseProbes()
        self._views: dict[str, NodeView] = {}
        self._views_lock = threading.Lock()
        self._expect_lock = threading.Lock()
        self._expected: dict[tuple[str, str, str], float] = {}  # (verb, namespace, name) -> monotonic
        self._services: set[tuple[str, str, str]] = set()  # (namespace, name, owner uid) known to exist
        self.jobs: list[Informer] = []
        self.pods: list[Informer] = []
        for ns in namespaces or ("",):
            job_list, pod_list = _list_calls(custom, core, ns)
            self.jobs.append(Informer(f"jobs{':' + ns if ns else ''}", job_list, transform=_strip_job,
                                      index=views.root_key, handler=self._handler("jobs")))
            self.pods.append(Informer(f"pods{':' + ns if ns else ''}", pod_list, label_selector=c.LABEL_JOB,
                                      index=_pod_job, transform=strip_pod, handler=self._on_pod))
        self.nodes = Informer("nodes", core.list_node, transform=_strip_node, handler=self._on_node)
        self.leases = Informer("leases", lambda **kw: coordination.list_namespaced_lease(NODE_LEASE_NAMESPACE, **kw),
                               handler=self._on_lease, on_recover=self._regrace)
        # Kueue: only when the integration is on and its API is served (handlers.startup checks), so a
        # cluster without Kueue never lists what does not exist. Workloads: only the operator's (by label).
        self.kueue = kueue
        self.workloads: list[Informer] = []
        self.kueue_cluster: list[Informer] = []
        if kueue:
            for ns in namespaces or ("",):
                self.workloads.append(Informer(f"workloads{':' + ns if ns else ''}", _workload_list(custom, ns),
                                               label_selector=c.LABEL_JOB, index=_pod_job,
                                               handler=self._on_workload))
            self.flavors = Informer("resourceflavors", _kueue_cluster_list(custom, c.RESOURCE_FLAVORS))
            self.priorities = Informer("workloadpriorityclasses",
                                       _kueue_cluster_list(custom, c.WORKLOAD_PRIORITY_CLASSES))
            self.kueue_cluster = [self.flavors, self.priorities]

    @property
    def informers(self) -> list[Informer]:
        return [*self.jobs, *self.pods, self.nodes, self.leases, *self.workloads, *self.kueue_cluster]

    def start(self) -> None:
        for inf in self.informers:
            inf.start()

    def wait_synced(self, timeout: float) -> bool:
        return wait_all_synced(self.informers, timeout)

    def stop(self) -> None:
        for inf in self.informers:
            inf.stop()

    # reads -------------------------------------------------------------------------------------
    def job(self, namespace: str, name: str) -> Obj | None:
        for inf in self.jobs:
            if (obj := inf.get((namespace, name))) is not None:
                return obj
        return None

    def job_keys(self) -> list[tuple[str, str]]:
        """(namespace, name) of every cached job (a new leader looks at each once)."""
        return [(j["metadata"]["namespace"], j["metadata"]["name"]) for inf in self.jobs for j in inf.items()]

    def jobs_with_root(self, root: str) -> list[Obj]:
        """Every cached job whose checkpoint root normalizes to `root` (views.root_key), in any namespace."""
        return [j for inf in self.jobs for j in inf.by_index(root)]

    def job_pods(self, namespace: str, name: str) -> list[Obj]:
        return [p for inf in self.pods for p in inf.by_index((namespace, name))]

    def job_workloads(self, namespace: str, name: str) -> list[Obj]:
        """The Workloads labelled for a job (ownership is checked by the caller, by uid)."""
        return [w for inf in self.workloads for w in inf.by_index((namespace, name))]

    def flavor(self, name: str) -> Obj | None:
        return self.flavors.get(("", name)) if self.kueue else None

    def priority_class(self, name: str) -> Obj | None:
        return self.priorities.get(("", name)) if self.kueue else None

    def wrote_workload(self, obj: Obj) -> None:
        """The Workload our status write returned: later reads see it even before the watch delivers it."""
        for inf in self.workloads:
            inf.store_if_newer(obj)

    def blind(self) -> bool:
        """The Lease watch is broken: node health cannot be judged now (renewals may be happening unseen)."""
        return not self.leases.watching.is_set()

    def node_views(self) -> dict[str, NodeView]:
        with self._views_lock:
            return dict(self._views)

    def wrote_job(self, obj: Obj) -> None:
        """The job our status write returned: later reads see it even before the watch delivers it."""
        for inf in self.jobs:
            inf.store_if_newer(obj)

    # expectations: do not repeat a create or delete the watch has not confirmed yet -------------
    def expect(self, verb: str, namespace: str, name: str) -> None:
        with self._expect_lock:
            self._expected[(verb, namespace, name)] = time.monotonic()

    def expected(self, verb: str, namespace: str, name: str) -> bool:
        with self._expect_lock:
            at = self._expected.get((verb, namespace, name))
            if at is not None and time.monotonic() - at > EXPECTATION_SECONDS:
                del self._expected[(verb, namespace, name)]
                return False
            return at is not None

    def _settle(self, namespace: str, name: str, *verbs: str) -> None:
        with self._expect_lock:
            for verb in verbs:
                self._expected.pop((verb, namespace, name), None)

    def service_known(self, namespace: str, name: str, owner_uid: str) -> bool:
        return (namespace, name, owner_uid) in self._services

    def service_exists(self, namespace: str, name: str, owner_uid: str) -> None:
        self._services.add((namespace, name, owner_uid))

    # informer handlers (informer threads) -------------------------------------------------------
    def _handler(self, resource: str) -> Callable[[str, Obj | None, Obj | None], None]:
        def handle(etype: str, old: Obj | None, new: Obj | None) -> None:
            if resource == "jobs" and etype == "DELETED" and old is not None:
                uid = old["metadata"].get("uid")
                self._services = {s for s in self._services if s[2] != uid}
            self._notify(resource, etype, old, new)
        return handle

    def _on_pod(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        if obj is not None:
            meta = obj["metadata"]
            if etype == "DELETED":
                self._settle(meta.get("namespace", ""), meta["name"], "create", "delete", "force-delete")
            else:
                self._settle(meta.get("namespace", ""), meta["name"], "create")
                if meta.get("deletionTimestamp"):
                    self._settle(meta.get("namespace", ""), meta["name"], "delete")
        self._notify("pods", etype, old, new)

    def _on_workload(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        if obj is not None:
            meta = obj["metadata"]
            gone = etype == "DELETED" or bool(meta.get("deletionTimestamp"))
            self._settle(meta.get("namespace", ""), meta["name"],
                         *(("create-workload", "delete-workload") if gone else ("create-workload",)))
        self._notify("workloads", etype, old, new)

    def _on_node(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        name, live = _named(etype, old, new)
        with self._views_lock:
            if live is None:
                self._views.pop(name, None)
            else:
                self._views[name] = views.node_view(live, self._probes.renewed(name))
        self._notify("nodes", etype, old, new)

    def _regrace(self) -> None:
        with self._views_lock:
            now = self.clock.now()
            self._probes.regrace(now)
            self._views = {name: dataclasses.replace(view, lease_renewed=self._probes.renewed(name))
                           for name, view in self._views.items()}
        log.info("the Lease watch is back: every node gets a full node-loss timeout from now")

    def _on_lease(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        name, live = _named(etype, old, new)
        with self._views_lock:
            if live is None:
                self._probes.forget(name)
                renewed = None
            else:
                renew_time = (live.get("spec") or {}).get("renewTime")
                if not self._probes.observe(name, renew_time if isinstance(renew_time, str) else None,
                                            self.clock.now()):
                    return  # unchanged (a re-list, or a holder change): not a renewal, nothing to tell
                renewed = self._probes.renewed(name)
            view = self._views.get(name)
            if view is not None:
                self._views[name] = dataclasses.replace(view, lease_renewed=renewed)
        self._notify("leases", etype, old, new)


def _named(etype: str, old: Obj | None, new: Obj | None) -> tuple[str, Obj | None]:
    """A cluster-scoped object's name, and the object as it is now (None: it is gone)."""
    obj = new or old
    assert obj is not None
    return obj["metadata"]["name"], None if etype == "DELETED" else new
