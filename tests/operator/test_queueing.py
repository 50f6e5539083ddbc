"""Kueue: the queueing policy (core/queueing.py) and one reconcile row per situation of the protocol."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator import views
from resilient_operator.core import Job, PodView, queueing, reconcile
from resilient_operator.core.model import OperatorConfig, WorkloadView
from resilient_operator.core.timeutil import fmt
from tests.operator.builders import NOW, gang, healthy, job_object, listing, node, pod, running_status

FLAVOR = {"metadata": {"name": "gpu-a"}, "spec": {"nodeLabels": {"pool": "a"},
                                                    "tolerations": [{"key": "gpu", "operator": "Exists"}]}}


def pool(count: int) -> dict[str, Any]:
    """Healthy nodes carrying the flavor's node label (others would hold no worker of an admitted job)."""
    return {n: dataclasses.replace(v, labels={**v.labels, "pool": "a"}) for n, v in healthy(count).items()}


def kjob(status: dict[str, Any] | None = None, queue: str = "team-a", **spec: Any) -> Job:
    obj = job_object(status=status, **spec)
    obj["metadata"]["labels"] = {c.LABEL_QUEUE_NAME: queue}
    return views.job_view(obj)


def cond(ctype: str, value: bool = True, reason: str = "R", message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": "True" if value else "False", "reason": reason, "message": message,
            "lastTransitionTime": fmt(NOW)}


def workload(*conditions: dict[str, Any], admitted: int | None = None, reclaimable: int = 0, count: int = 4,
             min_count: int | None = 2, deleting: bool = False) -> WorkloadView:
    pod_set: dict[str, Any] = {"name": "workers", "count": count}
    if min_count is not None:
        pod_set["minCount"] = min_count
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admitted is not None:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "workers", "count": admitted, "flavors": {c.GPU_RESOURCE: "gpu-a"}}]}
    if reclaimable:
        status["reclaimablePods"] = [{"name": "workers", "count": reclaimable}]
    meta: dict[str, Any] = {"name": "demo-rtj-uid-1-1", "resourceVersion": "7"}
    if deleting:
        meta["deletionTimestamp"] = fmt(NOW)
    return views.workload_view({"metadata": meta, "spec": {"podSets": [pod_set]}, "status": status},
                               {"gpu-a": FLAVOR})


def admitted(count: int = 4, *extra: dict[str, Any], **kw: Any) -> WorkloadView:
    return workload(cond("QuotaReserved"), cond("Admitted"), *extra, admitted=count, **kw)


EVICTED = cond("Evicted", reason="Preempted", message="Preempted to accommodate a higher priority Workload")


@dataclass
class Row:
    name: str
    job: Job
    workload: WorkloadView | None
    pods: list[PodView] = field(default_factory=list)
    nodes: int = 4
    phase: str = c.QUEUED
    create_pods: int = 0
    delete: set[str] = field(default_factory=set)
    creates_workload: bool = False
    deletes_workload: bool = False
    workload_status: dict[str, Any] | None = None  # key -> expected (conditions by type: status/reason)
    status: dict[str, Any] = field(default_factory=dict)
    events: set[str] = field(default_factory=set)


GANG = {f"demo-a1-{r}" for r in range(4)}
ROWS = [
    Row("no Workload yet: create it and hold the job", kjob(), None, creates_workload=True,
        status={"kueue.workload": "demo-rtj-uid-1-1", "conditions.Queued": "True"}),
    Row("Workload waits for quota: nothing starts", kjob(), workload(cond("QuotaReserved", False, "Pending"))),
    Row("admitted in full: start all workers with the flavor", kjob(), admitted(4), phase=c.STARTING,
        create_pods=4, status={"kueue.admittedReplicas": 4, "kueue.clusterQueue": "cq"},
        workload_status={"PodsReady": ("False", "WaitForStart")}),
    Row("partial admission: start at the admitted count and give nothing back", kjob(), admitted(2),
        phase=c.STARTING, create_pods=2, status={"replicas": 2}),
    Row("admitted but capacity short: start smaller, free the unused quota", kjob(), admitted(4), nodes=3,
        phase=c.STARTING, create_pods=3, workload_status={"reclaimablePods": [{"name": "workers", "count": 1}]}),
    Row("gang running: PodsReady", kjob(running_status()), admitted(4), pods=gang(1, 4), phase=c.RUNNING,
        workload_status={"PodsReady": ("True", "PodsReady")}),
    Row("node lost: shrink inside the admission, no requeue, quota freed",
        kjob(running_status(attempt=2, replicas=3)), admitted(4, cond("PodsReady")), pods=gang(2, 3),
        nodes=3, phase=c.RUNNING, workload_status={"reclaimablePods": [{"name": "workers", "count": 1}]}),
    Row("relaunch after a loss stays within what is still held",
        kjob({**running_status(replicas=3), "phase": c.RESTARTING}), admitted(4, reclaimable=1), nodes=4,
        phase=c.STARTING, create_pods=3),
    Row("evicted (preempted): stop the gang gracefully, no budget", kjob(running_status()),
        admitted(4, EVICTED), pods=gang(1, 4), delete=GANG, events={c.REASON_EVICTED_BY_KUEUE},
        status={"conditions.Queued": "True", "restarts.infrastructure": 0, "restarts.application": 0,
                "goodput.open.kind": c.QUEUED}),
    Row("evicted and the gang is gone: release the quota, Requeued", kjob({**running_status(), "phase": c.QUEUED}),
        admitted(4, EVICTED, reclaimable=1), events={c.REASON_QUOTA_RELEASED},
        workload_status={"QuotaReserved": ("False", "Pending"), "Requeued": ("True", "Preempted"),
                         "Admitted": ("False", "NoReservation"), "admission": None, "reclaimablePods": None}),
    Row("evicted, released, waiting: nothing to do", kjob({**running_status(), "phase": c.QUEUED}),
        workload(EVICTED, cond("QuotaReserved", False, "Pending"))),
    Row("admitted again: resume from the checkpoint as a planned restart",
        kjob({**running_status(), "phase": c.QUEUED}), admitted(2), phase=c.STARTING, create_pods=2,
        status={"restarts.planned": 1, "attempt": 2, "resumedFrom.step": 9}, events={c.REASON_ADMITTED}),
    Row("admission withdrawn while running: stop", kjob(running_status()),
        workload(cond("QuotaReserved", False, "Pending")), pods=gang(1, 4), delete=GANG),
    Row("job succeeded: the Workload is finished", kjob({**running_status(), "phase": c.SUCCEEDED}),
        admitted(4), phase=c.SUCCEEDED, workload_status={"Finished": ("True", "Succeeded")}),
    Row("job changed size while queued: replace the Workload", kjob(replicas=3), workload(count=4),
        deletes_workload=True, status={"kueue.generation": 2, "kueue.replace": True}),
    Row("capacity back past the held quota, new checkpoint: stop and ask for a new admission",
        kjob(running_status(replicas=3, growBack={"replicas": 4, "sinceStep": 5})),
        admitted(4, cond("PodsReady"), reclaimable=1), pods=gang(1, 3), phase=c.QUEUED,
        delete={f"demo-a1-{r}" for r in range(3)}, status={"kueue.replace": True, "kueue.generation": 2,
                                                           "goodput.open.kind": c.PLANNED},
        events={c.REASON_REQUEUED_TO_GROW}),
    Row("replacement pending and the gang gone: delete the old Workload",
        kjob({**running_status(replicas=3), "phase": c.QUEUED, "kueue": {"generation": 2, "replace": True}}),
        admitted(4, reclaimable=1), deletes_workload=True),
    Row("old Workload gone: create the next one", kjob({**running_status(replicas=3), "phase": c.QUEUED,
                                                        "kueue": {"generation": 2, "replace": True}}),
        None, creates_workload=True, status={"kueue.workload": "demo-rtj-uid-1-2"}),
]


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if part in ("conditions",) and isinstance(obj, dict):
            obj = {cnd["type"]: cnd["status"] for cnd in obj.get("conditions") or []}
            continue
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_kueue_protocol(row: Row) -> None:
    plan = reconcile(row.job, row.pods, pool(row.nodes), listing(9), NOW, workload=row.workload)
    assert plan.status["phase"] == row.phase
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    assert len(pods) == row.create_pods
    for manifest in pods:  # the assigned flavor's node labels and tolerations
        assert manifest["spec"]["nodeSelector"]["pool"] == "a"
        assert {"key": "gpu", "operator": "Exists"} in manifest["spec"]["tolerations"]
    assert set(plan.delete) | set(plan.force_delete) == row.delete
    assert (plan.workload_create is not None) == row.creates_workload
    assert bool(plan.workload_delete) == row.deletes_workload
    if row.workload_status is not None:
        assert plan.workload_status is not None
        got = {cnd["type"]: (cnd["status"], cnd["reason"]) for cnd in plan.workload_status.get("conditions", [])}
        for key, want in row.workload_status.items():
            assert (got.get(key) if key[0].isupper() else plan.workload_status.get(key, "absent")) == want, key
    for path, want in row.status.items():
        assert _dig(plan.status, path) == want, path
    assert row.events <= {e.reason for e in plan.events}
    if plan.workload_status is not None:
        assert plan.workload_ref == ("demo-rtj-uid-1-1", "7")


def test_workload_manifest_partial_admission_priority_and_owner() -> None:
    from resilient_operator.core.model import WorkloadPriority

    j = kjob(replicas=4, elasticPolicy={"minReplicas": 2})
    j = type(j)(**{**j.__dict__, "priority": WorkloadPriority("high", 1000)})
    wl = queueing.workload_manifest(j, queueing.workload_name(j, 1))
    (pod_set,) = wl["spec"]["podSets"]
    assert (pod_set["count"], pod_set["minCount"]) == (4, 2)
    assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {c.GPU_RESOURCE: "8"}
    assert wl["spec"]["queueName"] == "team-a" and wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"]["name"] == "high"
    (owner,) = wl["metadata"]["ownerReferences"]
    assert owner["controller"] is True and owner["uid"] == "uid-1"
    rigid = kjob(replicas=2, elasticPolicy={"minReplicas": 2})
    assert "minCount" not in queueing.workload_manifest(rigid, "x")["spec"]["podSets"][0]


def test_reclaimable_never_decreases_while_admitted() -> None:
    wl = admitted(4, cond("PodsReady"), reclaimable=2)
    assert queueing.running_status(wl, 3, True, fmt(NOW), 1) is None  # 4-3=1 < 2 already reported


def test_jobs_without_a_queue_name_never_touch_kueue() -> None:
    from tests.operator.builders import job

    plan = reconcile(job(), [], healthy(4), listing(), NOW, workload=None)
    assert plan.status["phase"] == c.STARTING and "kueue" not in plan.status
    assert plan.workload_create is None and plan.workload_status is None and plan.workload_delete is None


def test_gate_reads_the_workload() -> None:
    assert queueing.gate(None).action == queueing.HOLD
    assert queueing.gate(admitted(3, reclaimable=1)).held == 2
    assert queueing.gate(admitted(4, EVICTED)).action == queueing.STOP
    assert queueing.gate(workload(EVICTED)).action == queueing.HOLD  # released already
    assert queueing.gate(admitted(4, deleting=True)).action == queueing.HOLD


def test_an_admitted_job_counts_only_the_flavor_nodes() -> None:
    plan = reconcile(kjob(), [], healthy(4), listing(), NOW, workload=admitted(4))  # no node carries pool=a
    assert plan.status["phase"] == c.WAITING_FOR_CAPACITY and not list(plan.manifests())
    assert pod(1, 0).attempt == 1


def test_every_status_field_the_kueue_rows_write_is_declared() -> None:
    from tests.contracts.test_crd import schema, status_paths

    status_schema = schema()["properties"]["status"]
    for row in ROWS:
        plan = reconcile(row.job, row.pods, pool(row.nodes), listing(9), NOW, workload=row.workload)
        assert status_paths(plan.status, status_schema) == [], row.name


@pytest.mark.parametrize("status", [
    {"admission": "x"}, {"admission": {"podSetAssignments": ["x", None]}}, {"conditions": "x"},
    {"admission": {"podSetAssignments": [{"name": "workers", "count": "many", "flavors": ["x"]}]}},
    {"reclaimablePods": [{"name": "workers", "count": None}]},
])
def test_a_malformed_workload_is_read_without_crashing(status: dict[str, Any]) -> None:
    wl = views.workload_view({"metadata": {"name": "w"}, "spec": {"podSets": "x"}, "status": status}, {"f": "x"})
    assert isinstance(views.workload_flavors({"status": status}), set)
    assert queueing.gate(wl).action in (queueing.HOLD, queueing.RUN)


def test_without_kueues_api_a_labelled_job_waits_and_says_why() -> None:
    """The integration is on but Kueue is not installed: hold the job, create no Workload (no error loop)."""
    plan = reconcile(kjob(), [], pool(4), listing(), NOW, workload=None, kueue_ready=False)
    assert plan.status["phase"] == c.QUEUED and not list(plan.manifests())
    assert plan.workload_create is None and plan.workload_status is None and plan.workload_delete is None
    (queued,) = [x for x in plan.status["conditions"] if x["type"] == c.COND_QUEUED]
    assert (queued["status"], queued["reason"]) == ("True", c.REASON_KUEUE_UNAVAILABLE)


def test_a_drain_restarts_inside_the_admission_and_frees_the_drained_quota() -> None:
    """The drain policy (core/drain.py) still applies to an admitted job: a planned restart without the
    draining node, at the size the admission and the remaining flavor nodes allow, no requeue."""
    nodes = pool(4)
    nodes["n1"] = dataclasses.replace(nodes["n1"], unschedulable=True)
    wl = admitted(4, cond("PodsReady"))
    plan = reconcile(kjob(running_status()), gang(1, 4), nodes, listing(9), NOW, workload=wl)
    assert plan.status["phase"] == c.RESTARTING and set(plan.delete) == GANG
    assert plan.status["restarts"] == {"infrastructure": 0, "application": 0, "planned": 1}
    assert plan.workload_create is None and plan.workload_delete is None
    relaunch = reconcile(kjob(plan.status), [], nodes, listing(9), NOW, workload=wl)
    pods = [m for m in relaunch.manifests() if m["kind"] == "Pod"]
    assert relaunch.status["phase"] == c.STARTING and len(pods) == 3
    assert all(p["spec"]["nodeSelector"]["pool"] == "a" for p in pods)
    assert relaunch.workload_status is not None
    assert relaunch.workload_status["reclaimablePods"] == [{"name": "workers", "count": 1}]


def test_a_node_loss_in_place_shrinks_inside_the_admission_keeping_the_survivors() -> None:
    """restartStrategy InPlace (the default) with Kueue: the survivors take their plans, no pod is created, the
    Workload keeps its admission and frees the lost worker's quota (only growing past the quota held needs a
    new admission)."""
    config = OperatorConfig(plan_public_key="operator-public-key")
    nodes = pool(4)
    nodes["n3"] = dataclasses.replace(node("n3", lease_age=25.0), labels=nodes["n3"].labels)  # lost, in the pool
    wl = admitted(4, cond("PodsReady"))
    spec = {"restartStrategy": "InPlace", "nodeLossTimeoutSeconds": 20}
    first = reconcile(kjob(running_status(), **spec), gang(1, 4), nodes, listing(40), NOW, config=config, workload=wl)
    assert first.force_delete == ["demo-a1-3"] and first.delete == []  # the survivors are not fenced
    second = reconcile(kjob(first.status, **spec), gang(1, 3), nodes, listing(40), NOW, config=config, workload=wl)
    assert second.status["attempt"] == 2 and second.status["replicas"] == 3
    assert {d.pod for d in second.deliver} == {"demo-a1-0", "demo-a1-1", "demo-a1-2"}
    assert [m for m in second.manifests() if m["kind"] == "Pod"] == []
    assert second.workload_create is None and second.workload_delete is None  # the same admission
    assert second.workload_status is not None
    assert second.workload_status["reclaimablePods"] == [{"name": "workers", "count": 1}]
    assert second.status["history"][-1]["restart"] == "InPlace"
