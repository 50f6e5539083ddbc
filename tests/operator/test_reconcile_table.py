"""The decision core, one row per situation the operator must handle. No cluster, no clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from resilient_contract import completion, environment
from resilient_contract.storage import Listing, Verdict
from resilient_contract.storage.errors import REASON_DISCOVERY_BUSY
from resilient_operator import constants as c
from resilient_operator.core import Job, NodeView, PodView, reconcile, render
from resilient_operator.core.history import lineage_starts
from resilient_operator.core.timeutil import fmt
from tests.operator.builders import (
    CKPT_ROOT,
    NOW,
    gang,
    healthy,
    job,
    listing,
    node,
    nodes,
    pod,
    running_status,
)


@dataclass
class Row:
    name: str
    job: Job
    pods: list[PodView]
    nodes: dict[str, NodeView]
    listing: Listing = field(default_factory=listing)
    phase: str = c.RUNNING
    create_attempt: int | None = None  # a new gang of this attempt is created...
    create_replicas: int | None = None  # ...with this many workers
    create_count: int | None = None  # pods created, when not the whole gang
    resume_step: int | None = None
    delete: set[str] = field(default_factory=set)
    force: set[str] = field(default_factory=set)
    events: set[str] = field(default_factory=set)
    status: dict[str, Any] = field(default_factory=dict)  # dotted path -> expected value


def four_running(**overrides: Any) -> list[PodView]:
    return gang(1, 4, **overrides)


LOST_LEASE = {"n3": dict(lease_age=25.0)}
ALL4 = {f"demo-a1-{r}" for r in range(4)}
SUCCESS_MESSAGE = completion.format_message(completion.SUCCEEDED, step=40, attempt=1, world_size=4)
RESUMED_9 = (f"{CKPT_ROOT}/step-0000000009", 9)
BUSY = Listing(CKPT_ROOT, None, (), "every checkpoint discovery worker stayed busy for 5 s",
               reason=REASON_DISCOVERY_BUSY)


def nodes_with(count: int, **changes: dict[str, Any]) -> dict[str, NodeView]:
    return nodes(*(node(f"n{i}", **changes.get(f"n{i}", {})) for i in range(count)))


ROWS = [
    Row("fresh start", job(), [], healthy(4), phase=c.STARTING, create_attempt=1, create_replicas=4,
        events={c.REASON_STARTED}, status={"attempt": 1, "replicas": 4, "workers": "0/4"}),
    Row("fresh start resumes an existing complete checkpoint", job(), [], healthy(4), listing=listing(10, 20),
        phase=c.STARTING, create_attempt=1, create_replicas=4, resume_step=20,
        status={"resumedFrom.step": 20, "latestCheckpoint.step": 20}),
    Row("fresh start on short capacity starts smaller", job(), [], healthy(3), phase=c.STARTING,
        create_attempt=1, create_replicas=3),
    Row("all pods created and running", job(running_status(phase=c.STARTING)), four_running(), healthy(4),
        events={c.REASON_ALL_RUNNING}, status={"workers": "4/4", "conditions.Running": "True"}),
    Row("steady state does nothing", job(running_status()), four_running(), healthy(4), listing=listing(30),
        status={"latestCheckpoint.step": 30, "restartCount": 0}),
    Row("one worker's node NotReady past the timeout", job(running_status()), four_running(),
        nodes_with(4, n2=dict(ready="False", since=timedelta(seconds=30))), listing=listing(10),
        phase=c.RESTARTING, force={"demo-a1-2"}, delete={"demo-a1-0", "demo-a1-1", "demo-a1-3"},
        events={c.REASON_NODE_LOST}, status={"restarts.infrastructure": 1, "lastFailure.node": "n2"}),
    Row("NotReady within the timeout (flapping) is not a loss", job(running_status()), four_running(),
        nodes_with(4, n2=dict(ready="False", since=timedelta(seconds=5)))),
    Row("lease stale past the timeout while Ready=True", job(running_status()), four_running(),
        nodes_with(4, **LOST_LEASE), listing=listing(10), phase=c.RESTARTING, force={"demo-a1-3"},
        delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"}, events={c.REASON_NODE_LOST},
        status={"lastFailure.node": "n3", "lastFailure.kind": c.INFRASTRUCTURE, "restarts.infrastructure": 1,
                "conditions.Recovering": "True"}),
    Row("a node deleted", job(running_status()), four_running(), healthy(3), phase=c.RESTARTING,
        force={"demo-a1-3"}, delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"}, events={c.REASON_NODE_LOST},
        status={"lastFailure.node": "n3"}),
    Row("two nodes lost at once: one restart", job(running_status()), four_running(),
        nodes_with(4, n2=dict(lease_age=30.0), n3=dict(lease_age=22.0)), phase=c.RESTARTING,
        force={"demo-a1-2", "demo-a1-3"}, delete={"demo-a1-0", "demo-a1-1"},
        status={"restarts.infrastructure": 1, "lastFailure.node": "n2"}),
    Row("app failure: exit 1 with no infrastructure cause backs off", job(running_status()),
        four_running(r1=dict(phase="Failed", exit_code=1)), healthy(4), phase=c.BACKING_OFF,
        delete={f"demo-a1-{r}" for r in range(4)}, events={c.REASON_APP_FAILED, c.REASON_BACKOFF},
        status={"restarts.application": 1, "restarts.infrastructure": 0, "lastFailure.exitCode": 1,
                "nextRetryTime": fmt(NOW + timedelta(seconds=10))}),
    Row("backoff elapsed: relaunch", job(running_status(phase=c.BACKING_OFF, nextRetryTime=fmt(NOW),
        restarts={"infrastructure": 0, "application": 1, "planned": 0})), [], healthy(4), listing=listing(5),
        phase=c.STARTING, create_attempt=2, create_replicas=4, resume_step=5),
    Row("backoff not yet elapsed: wait", job(running_status(
        phase=c.BACKING_OFF, nextRetryTime=fmt(NOW + timedelta(seconds=30)))), [], healthy(4),
        phase=c.BACKING_OFF),
    Row("peer failures after a node loss are infrastructure", job(running_status()),
        four_running(r0=dict(phase="Failed", exit_code=1)), nodes_with(4, n3=dict(lease_age=40.0)),
        phase=c.RESTARTING, force={"demo-a1-3"}, delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"},
        status={"restarts.infrastructure": 1, "restarts.application": 0}),
    Row("a peer exits before the dead node's lease goes stale: not yet an application failure",
        job(running_status()), four_running(r0=dict(phase="Failed", exit_code=1, finished_ago=0.5)),
        nodes_with(4, n3=dict(lease_age=3.0)), status={"restarts.application": 0, "restarts.infrastructure": 0}),
    Row("every node renewed its lease after the exit: an application failure", job(running_status()),
        four_running(r0=dict(phase="Failed", exit_code=1, finished_ago=2.0)), nodes_with(4), phase=c.BACKING_OFF,
        delete=ALL4, status={"restarts.application": 1}),
    Row("the peer's exit, then the lease goes stale: one infrastructure failure", job(running_status()),
        four_running(r0=dict(phase="Failed", exit_code=1, finished_ago=5.0)), nodes_with(4, n3=dict(lease_age=21.0)),
        phase=c.RESTARTING, force={"demo-a1-3"}, delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"},
        status={"restarts.application": 0, "restarts.infrastructure": 1, "lastFailure.node": "n3"}),
    Row("every lease stale at once (control-plane outage): hold still", job(running_status()), four_running(),
        nodes_with(4, **{f"n{i}": dict(lease_age=35.0) for i in range(4)}), events={c.REASON_DISRUPTION},
        status={"restarts.infrastructure": 0, "conditions.NodesReporting": "False"}),
    Row("heartbeats back after the outage", job(running_status(conditions=[{"type": c.COND_NODES_REPORTING,
        "status": "False"}])), four_running(), healthy(4), status={"conditions.NodesReporting": "True"}),
    Row("a minority of nodes lost is a real loss", job(running_status()), four_running(),
        nodes(*(node(f"n{i}", lease_age=30.0 if i in (2, 3) else 1.0) for i in range(6))), phase=c.RESTARTING,
        force={"demo-a1-2", "demo-a1-3"}, delete={"demo-a1-0", "demo-a1-1"}),
    Row("evicted pod (DisruptionTarget)", job(running_status()),
        four_running(r2=dict(disruption="EvictionByEvictionAPI")), healthy(4), phase=c.RESTARTING, delete=ALL4,
        status={"lastFailure.reason": c.REASON_EVICTED, "restarts.infrastructure": 1}),
    Row("preempted pod", job(running_status()), four_running(r0=dict(disruption="PreemptionByScheduler",
        phase="Failed", exit_code=137)), healthy(4), phase=c.RESTARTING, delete=ALL4,
        status={"lastFailure.reason": c.REASON_PREEMPTED}),
    Row("pod deleted by someone", job(running_status()), four_running()[:3], healthy(4), phase=c.RESTARTING,
        delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"},
        status={"lastFailure.reason": c.REASON_POD_DELETED}),
    Row("a deleted pod that already exited on SIGTERM is still a deletion", job(running_status()),
        four_running(r2=dict(deleting=True, phase="Failed", exit_code=143)), healthy(4), phase=c.RESTARTING,
        delete={"demo-a1-0", "demo-a1-1", "demo-a1-3"},
        status={"lastFailure.reason": c.REASON_POD_DELETED, "restarts.application": 0}),
    Row("fenced pods still terminating: wait for them", job(running_status(phase=c.RESTARTING)),
        four_running(r0=dict(deleting=True), r1=dict(deleting=True)), healthy(4), phase=c.RESTARTING,
        delete={"demo-a1-2", "demo-a1-3"}),
    Row("another node quiet for half the timeout: wait to see whether it follows the lost one",
        job(running_status(phase=c.RESTARTING)), [], nodes_with(4, n2=dict(lease_age=12.0), **LOST_LEASE),
        phase=c.RESTARTING),
    Row("a node quiet for less than half the timeout is healthy: relaunch", job(running_status(phase=c.RESTARTING)),
        [], nodes_with(4, n2=dict(lease_age=9.0), **LOST_LEASE), listing=listing(10), phase=c.STARTING,
        create_attempt=2, create_replicas=3, resume_step=10),
    Row("capacity below minimum: wait with a condition", job(running_status(phase=c.RESTARTING)), [],
        healthy(1), phase=c.WAITING_FOR_CAPACITY, events={c.REASON_BELOW_MIN},
        status={"conditions.CapacityAvailable": "False"}),
    Row("capacity back while waiting: launch", job(running_status(phase=c.WAITING_FOR_CAPACITY)), [],
        healthy(2), listing=listing(40), phase=c.STARTING, create_attempt=2, create_replicas=2, resume_step=40),
    Row("world size rounded down to the allowed multiple",
        job(elasticPolicy={"minReplicas": 2, "replicasMultipleOf": 2}), [], healthy(3),
        phase=c.STARTING, create_attempt=1, create_replicas=2),
    Row("cordoned and tainted nodes are not capacity", job(), [],
        nodes(node("n0"), node("n1"), node("n2", unschedulable=True),
              node("n3", taints=[{"key": "maint", "effect": "NoSchedule"}])),
        phase=c.STARTING, create_attempt=1, create_replicas=2),
    Row("capacity back: grow-back waits for the next checkpoint", job(running_status(replicas=3)),
        gang(1, 3), healthy(4), listing=listing(50), events={c.REASON_GROW_BACK},
        status={"growBack.replicas": 4, "growBack.sinceStep": 50}),
    Row("grow back at the next checkpoint", job(running_status(replicas=3,
        growBack={"replicas": 4, "sinceStep": 50})), gang(1, 3), healthy(4), listing=listing(60),
        phase=c.RESTARTING, delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"}, events={c.REASON_GROW_BACK},
        status={"restarts.planned": 1, "restarts.infrastructure": 0}),
    Row("grow-back disabled: keep running smaller",
        job(running_status(replicas=3), elasticPolicy={"minReplicas": 2, "growBack": False}),
        gang(1, 3), healthy(4), listing=listing(60)),
    Row("infrastructure budget exhausted: Failed", job(running_status(
        restarts={"infrastructure": 10, "application": 0, "planned": 0})), four_running(),
        nodes_with(4, **LOST_LEASE), phase=c.FAILED, force={"demo-a1-3"}, delete=ALL4 - {"demo-a1-3"},
        events={c.REASON_INFRA_BUDGET}, status={"conditions.Failed": "True"}),
    Row("application budget exhausted: Failed", job(running_status(
        restarts={"infrastructure": 0, "application": 3, "planned": 0})),
        four_running(r0=dict(phase="Failed", exit_code=2)), healthy(4), phase=c.FAILED, delete=ALL4,
        events={c.REASON_APP_BUDGET}, status={"conditions.Failed": "True"}),
    Row("image cannot start is an application failure", job(running_status(phase=c.STARTING)),
        four_running(r1=dict(phase="Pending", waiting="ImagePullBackOff")), healthy(4), phase=c.BACKING_OFF,
        delete=ALL4,
        status={"lastFailure.reason": c.REASON_IMAGE_CANNOT_START}),
    Row("success", job(running_status()), gang(1, 4, phase="Succeeded"), healthy(4), phase=c.SUCCEEDED,
        events={c.REASON_COMPLETED}, status={"conditions.Succeeded": "True"}),
    Row("success recorded by the marker despite an abort at exit", job(running_status()),
        four_running(**{f"r{i}": dict(phase="Failed", exit_code=1, message=SUCCESS_MESSAGE)
                        for i in range(4)}), healthy(4), phase=c.SUCCEEDED),
    Row("suspend deletes the gang gracefully", job(running_status(), suspend=True), four_running(), healthy(4),
        phase=c.SUSPENDED, delete={f"demo-a1-{r}" for r in range(4)}, events={c.REASON_SUSPENDED},
        status={"conditions.Suspended": "True", "restarts.infrastructure": 0}),
    Row("resume after suspend", job(running_status(phase=c.SUSPENDED)), [], healthy(4), listing=listing(70),
        phase=c.STARTING, create_attempt=2, create_replicas=4, resume_step=70, events={c.REASON_RESUMED},
        status={"restarts.planned": 1, "conditions.Suspended": "False"}),
    Row("operator restarted mid-recovery: the newer attempt survives", job(running_status()),
        gang(1, 4, r3=dict(deleting=True)) + gang(2, 3, **{f"r{r}": dict(resume=RESUMED_9) for r in range(3)}),
        healthy(4), delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"},
        status={"attempt": 2, "replicas": 3, "resumedFrom.step": 9}),
    Row("status write lost after launch: missing ranks are created, not a new attempt",
        job(running_status(attempt=2, replicas=3, phase=c.STARTING)), gang(2, 3)[:1], healthy(4),
        phase=c.STARTING, create_attempt=2, create_replicas=3, create_count=2),
    Row("unreadable checkpoint root: no restart from scratch", job(running_status(phase=c.RESTARTING,
        latestCheckpoint={"path": "x", "step": 5})), [], healthy(4),
        listing=listing(error="checkpoint root /ckpt/demo is not readable (permission denied)"),
        phase=c.RESTARTING, events={c.REASON_STORAGE_UNREADABLE},
        status={"conditions.CheckpointStorageReady": "False"}),
    Row("discovery workers busy or starting: no launch, the storage condition untouched, no event",
        job(running_status(phase=c.RESTARTING, latestCheckpoint={"path": "x", "step": 5})), [], healthy(4),
        listing=BUSY, phase=c.RESTARTING, status={"conditions.CheckpointStorageReady": None}),
    Row("missing root after checkpoints were seen: wait", job(running_status(phase=c.RESTARTING,
        latestCheckpoint={"path": "x", "step": 5})), [], healthy(4),
        listing=listing(error="gone", missing=True), phase=c.RESTARTING),
    Row("checkpoints skipped are named in events", job(running_status(phase=c.RESTARTING)), [], healthy(4),
        listing=listing(10, skipped=((30, "no .metadata"), (20, "shard __0_0.distcp is truncated"))),
        phase=c.STARTING, create_attempt=2, create_replicas=4, resume_step=10,
        events={c.REASON_CHECKPOINT_SKIPPED, c.REASON_STARTED}),
    Row("finished job stays finished", job(running_status(phase=c.SUCCEEDED)), gang(1, 4, phase="Succeeded"),
        healthy(0), phase=c.SUCCEEDED),
    Row("an impostor pod with the job's labels and a higher attempt is not ours: ignored", job(running_status()),
        [*four_running(), pod(9, 0, node_name="n0", owner_uid=None, resume=("/elsewhere/step-0000000099", 99))],
        healthy(4), status={"attempt": 1, "replicas": 4}),
    Row("an impostor claiming another job's uid is ignored too", job(running_status()),
        [*four_running(), pod(9, 0, node_name="n0", owner_uid="uid-of-someone-else")], healthy(4),
        status={"attempt": 1}),
    Row("a malformed attempt label on one of ours: fenced as stale, no crash", job(running_status()),
        [*four_running(), pod(1, 9, node_name="n0", labels={c.LABEL_ATTEMPT: "x", c.LABEL_RANK: "y"})],
        healthy(4), delete={"demo-a1-9"}),
    Row("lost status + a pod annotated with a resume path outside the root: not injected again",
        job(running_status(phase=c.STARTING)), [pod(2, 0, node_name="n0", replicas=2,
        resume=("/checkpoints/other-tenant/step-0000000050", 50))], healthy(4), phase=c.STARTING,
        create_attempt=2, create_replicas=2, create_count=1, status={"attempt": 2, "resumedFrom": None}),
    Row("lost status + a genuine resume annotation is kept", job(running_status(phase=c.STARTING)),
        [pod(2, 0, node_name="n0", replicas=2, resume=RESUMED_9)], healthy(4), phase=c.STARTING,
        create_attempt=2, create_replicas=2, create_count=1, resume_step=9, status={"resumedFrom.step": 9}),
    Row("a node Ready again whose unreachable taint is about to go: the relaunch waits for it, bounded",
        job(running_status(phase=c.RESTARTING)), [],
        nodes(node("n0"), node("n1"), node("n2"), node("n3", since=timedelta(seconds=2), taints=[
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}])), listing=listing(10),
        phase=c.RESTARTING, events={c.REASON_SETTLING}, status={"settlingSince": fmt(NOW)}),
    Row("the settle wait is over: relaunch smaller", job(running_status(
        phase=c.RESTARTING, settlingSince=fmt(NOW - timedelta(seconds=16)))), [],
        nodes(node("n0"), node("n1"), node("n2"), node("n3", since=timedelta(seconds=2), taints=[
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}])), listing=listing(10),
        phase=c.STARTING, create_attempt=2, create_replicas=3, resume_step=10, status={"settlingSince": None}),
    Row("pods of a finished job still terminating: start at full size, the scheduler waits for them", job(),
        [pod(1, r, node_name=f"n{r}", phase="Succeeded", deleting=True, owner_uid="uid-of-a-finished-job")
         for r in range(4)], healthy(4), phase=c.STARTING, create_attempt=1, create_replicas=4),
    Row("a worker's node cordoned (drain): planned restart, the gang stopped gracefully, no budget spent",
        job(running_status()), four_running(), nodes_with(4, n2=dict(unschedulable=True)), listing=listing(10),
        phase=c.RESTARTING, delete=ALL4, events={c.REASON_DRAIN},
        status={"restarts.planned": 1, "restarts.infrastructure": 0, "lastDrain.nodes": ["n2"],
                "conditions.Recovering": "True", "goodput.open.kind": c.PLANNED}),
    Row("a spot interruption notice taint: the same planned restart", job(running_status()), four_running(),
        nodes_with(4, n1=dict(taints=[{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}])),
        phase=c.RESTARTING, delete=ALL4, events={c.REASON_DRAIN},
        status={"lastDrain.reason": "tainted aws-node-termination-handler/spot-itn", "restarts.planned": 1}),
    Row("a cordoned node with no worker of ours: nothing to do", job(running_status()), four_running(),
        nodes_with(5, n4=dict(unschedulable=True))),
    Row("a lost node that is also cordoned is a node loss, not a drain", job(running_status()), four_running(),
        nodes_with(4, n3=dict(unschedulable=True, lease_age=25.0)), phase=c.RESTARTING, force={"demo-a1-3"},
        delete={"demo-a1-0", "demo-a1-1", "demo-a1-2"}, status={"restarts.infrastructure": 1, "restarts.planned": 0}),
    Row("drained gang still saving its checkpoint: wait", job(running_status(phase=c.RESTARTING)),
        four_running(**{f"r{i}": dict(deleting=True) for i in range(4)}), nodes_with(4, n2=dict(unschedulable=True)),
        phase=c.RESTARTING),
    Row("after the drain: restart smaller from the SIGTERM checkpoint, without the cordoned node",
        job(running_status(phase=c.RESTARTING)), [], nodes_with(4, n2=dict(unschedulable=True)),
        listing=listing(10, 57), phase=c.STARTING, create_attempt=2, create_replicas=3, resume_step=57),
    Row("a drained node the template tolerates holds no capacity either",
        job(running_status(phase=c.RESTARTING), template={"spec": {"containers": [{"name": "t"}],
            "tolerations": [{"operator": "Exists"}]}}), [],
        nodes_with(4, n2=dict(taints=[{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}])),
        phase=c.STARTING, create_attempt=2, create_replicas=3),
    Row("a hang (the launcher's RTJ_HUNG message): its own kind, the infrastructure budget, the node avoided",
        job(running_status(), progressTimeoutSeconds=30), four_running(r1=dict(phase="Failed", exit_code=124,
            message=completion.format_message(completion.HUNG, step=41, rank=1, stalled_s=30.2, timeout_s=30,
                                              attempt=1))), healthy(4), listing=listing(40), phase=c.RESTARTING,
        delete=ALL4, events={c.REASON_HANG, c.REASON_AVOID_NODE},
        status={"lastFailure.kind": c.HANG, "restarts.infrastructure": 1, "restarts.application": 0}),
    Row("a template the core cannot use: SpecValid=False naming the field, no pods",
        job(template={"spec": {"containers": [{"name": "t", "env": ["A=1"]}]}}), [], healthy(4),
        phase=c.PENDING, events={c.REASON_INVALID_SPEC}, status={"conditions.SpecValid": "False"}),
]


def lookup(status: dict[str, Any], dotted: str) -> Any:
    head, _, rest = dotted.partition(".")
    if head == "conditions":
        conds = {cond["type"]: cond["status"] for cond in status.get("conditions", [])}
        return conds.get(rest)
    value = status.get(head)
    return lookup(value, rest) if rest and isinstance(value, dict) else value


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_reconcile(row: Row) -> None:
    plan = reconcile(row.job, row.pods, row.nodes, row.listing, NOW)
    assert plan.status["phase"] == row.phase
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    if row.create_attempt is None:
        assert not pods, [p["metadata"]["name"] for p in pods]
    else:
        assert {p["metadata"]["labels"][c.LABEL_ATTEMPT] for p in pods} == {str(row.create_attempt)}
        assert len(pods) == (row.create_count or row.create_replicas)
        assert plan.status["attempt"] == row.create_attempt
        for p in pods:
            env = {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}
            assert env[environment.NNODES] == str(row.create_replicas)
            if row.resume_step is None:
                assert env.get(environment.RESUME_FROM, "") == ""  # explicit and empty: envFrom cannot supply it
            else:
                assert env[environment.RESUME_FROM] == f"{CKPT_ROOT}/step-{row.resume_step:010d}"
    assert set(plan.delete) == row.delete
    assert set(plan.force_delete) == row.force
    assert row.events <= {e.reason for e in plan.events}, plan.events
    for path, expected in row.status.items():
        assert lookup(plan.status, path) == expected, (path, plan.status)
    assert not (set(plan.delete) & set(plan.force_delete))


def test_no_events_when_nothing_changes() -> None:
    """Reconciling the written status again is a fixed point: no duplicate events or creates."""
    row = next(r for r in ROWS if r.name.startswith("lease stale"))
    first = reconcile(row.job, row.pods, row.nodes, row.listing, NOW)
    again = job(first.status)
    deleting = [pod(1, r, node_name=f"n{r}", deleting=True) for r in range(4)]
    second = reconcile(again, deleting, row.nodes, row.listing, NOW)
    assert second.events == []
    assert second.create == []
    assert set(second.force_delete) == {"demo-a1-3"}  # still there: force again, idempotent
    assert second.status["restarts"]["infrastructure"] == 1


def test_recovery_sequence_ends_with_one_smaller_gang() -> None:
    """Loss -> fence -> relaunch across reconciles, as the shell would drive it."""
    j = job(running_status())
    lost = nodes_with(4, n3=dict(lease_age=25.0))
    plan = reconcile(j, four_running(), lost, listing(10), NOW)
    assert plan.status["phase"] == c.RESTARTING
    survivors = [pod(1, r, node_name=f"n{r}", deleting=True) for r in range(3)]
    plan = reconcile(job(plan.status), survivors, lost, listing(10), NOW)
    assert plan.create == [] and plan.status["phase"] == c.RESTARTING
    plan = reconcile(job(plan.status), [], lost, listing(10), NOW)
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["demo-a2-0", "demo-a2-1", "demo-a2-2"]
    assert any("restarted 4 -> 3 workers from step-0000000010" in e.message for e in plan.events)
    history = plan.status["history"]
    assert [h["attempt"] for h in history] == [1, 2]
    assert history[0]["endReason"] == c.REASON_NODE_LOST
    assert all("nodeName" not in p["spec"] for p in pods)  # placement is the scheduler's job...
    for p in pods:  # ...but not onto the node we know is dead, which Kubernetes may still call Ready
        terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n3"]}]}
        ]


def test_avoiding_lost_nodes_keeps_the_users_affinity() -> None:
    user = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a"]}]},
                                  {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["b"]}]}]}
    j = job(template={"spec": {"containers": [{"name": "t"}],
                               "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": user}}}})
    spec = render.pod_manifest(j, 2, 0, 3, None, ["n3"])["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term in terms:
        assert term["matchExpressions"][0]["key"] == "gpu"
        assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n3"]}]


def test_interrupted_launch_also_ensures_the_service() -> None:
    """Status says attempt 1 started but nothing was created: the Service and the attempt's disruption
    budget come before the pods."""
    plan = reconcile(job(running_status(phase=c.STARTING)), [], healthy(4), listing(), NOW)
    assert [m["kind"] for m in plan.manifests()] == ["Service", "PodDisruptionBudget", "Pod", "Pod", "Pod", "Pod"]


def test_lease_deadline_is_the_next_look() -> None:
    """A silent node sends no event: the plan asks to look again when its lease would go stale."""
    quiet = nodes_with(4, n1=dict(lease_age=15.0))
    plan = reconcile(job(running_status()), four_running(), quiet, listing(), NOW)
    assert plan.requeue_after == pytest.approx(5.0)


def test_unsettled_failure_asks_to_look_again_soon() -> None:
    pods = four_running(r0=dict(phase="Failed", exit_code=1, finished_ago=0.5))
    plan = reconcile(job(running_status()), pods, nodes_with(4, n3=dict(lease_age=3.0)), listing(), NOW)
    assert plan.requeue_after == pytest.approx(1.0)


def test_busy_discovery_asks_again_within_a_second_and_says_nothing() -> None:
    """The operator's own workers were busy: a relaunch waits about a second, not the storage retry's 15 s."""
    plan = reconcile(job(running_status(phase=c.RESTARTING)), [], healthy(4), BUSY, NOW)
    assert plan.requeue_after is not None and plan.requeue_after <= 1.0
    assert plan.events == []


def test_backoff_doubles() -> None:
    j = job(running_status(restarts={"infrastructure": 0, "application": 2, "planned": 0}))
    plan = reconcile(j, four_running(r1=dict(phase="Failed", exit_code=1)), healthy(4), listing(), NOW)
    assert plan.status["nextRetryTime"] == fmt(NOW + timedelta(seconds=40))


def test_core_never_plans_checkpoint_deletion() -> None:
    """Plans only name pods to delete; checkpoints are the trainer's to retire."""
    for row in ROWS:
        plan = reconcile(row.job, row.pods, row.nodes, row.listing, NOW)
        assert all(name.startswith("demo-a") for name in plan.delete + plan.force_delete)


def test_each_lost_node_gets_its_own_field_requirement() -> None:
    """The API accepts one value per metadata.name requirement (found against the real API server)."""
    spec = render.pod_manifest(job(), 2, 0, 2, None, ["n2", "n1"])["spec"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
                                   {"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]


def test_nodes_that_die_together_cost_one_restart() -> None:
    """n3's loss comes due while n2, dead too but renewed later, has only been quiet for 12 s: the relaunch
    waits until n2 either renews or comes due, so one restart avoids both."""
    j = job(running_status())
    both = nodes_with(4, n3=dict(lease_age=25.0), n2=dict(lease_age=12.0))
    plan = reconcile(j, four_running(), both, listing(10), NOW)
    assert plan.status["phase"] == c.RESTARTING and plan.status["lastFailure"]["node"] == "n3"
    plan = reconcile(job(plan.status), [], both, listing(10), NOW)
    assert plan.create == [] and plan.status["phase"] == c.RESTARTING
    assert 0 < plan.requeue_after <= 1.0  # look again soon: n2's next renewal or its deadline
    # 9 s later: n0 and n1 renewed as usual, n2 never did and is past the 20 s timeout as well
    later = nodes_with(4, n3=dict(lease_age=34.0), n2=dict(lease_age=21.0))
    plan = reconcile(job(plan.status), [], later, listing(10), NOW)
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["demo-a2-0", "demo-a2-1"]
    assert plan.status["restarts"]["infrastructure"] == 1
    avoided = pods[0]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = avoided["nodeSelectorTerms"]
    assert {v for rule in term["matchFields"] for v in rule["values"]} == {"n2", "n3"}


def test_a_fenced_gang_seen_saving_is_told_once_and_kept_in_history() -> None:
    """Discovery refused a checkpoint that attempt 1's cut-off gang committed after attempt 2 started."""
    late = Verdict(30, f"{CKPT_ROOT}/step-0000000030", False, "written by attempt 1 after attempt 2 fenced it",
                   fenced_writer=1)
    history = [{"attempt": 1, "replicas": 4, "startTime": fmt(NOW), "nodes": ["n3"]},
               {"attempt": 2, "replicas": 3, "startTime": fmt(NOW), "resumedFromStep": 20}]
    seen = Listing(CKPT_ROOT, Verdict(20, f"{CKPT_ROOT}/step-0000000020", True), (late,))
    plan = reconcile(job(running_status(attempt=2, replicas=3, history=history)), gang(2, 3), healthy(4), seen, NOW)
    warned = [e for e in plan.events if e.reason == c.REASON_FENCED_WRITER]
    assert len(warned) == 1 and "n3" in warned[0].message and "step-0000000030" in warned[0].message
    assert plan.status["history"][0]["lateWrite"]["step"] == 30
    assert plan.status["latestCheckpoint"]["step"] == 20
    again = reconcile(job(plan.status), gang(2, 3), healthy(4), seen, NOW)
    assert not [e for e in again.events if e.reason == c.REASON_FENCED_WRITER]
    assert lineage_starts(plan.status) == [(1, None), (2, 20)]

def avoided(pod: dict[str, Any]) -> set[str]:
    terms = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {"nodeSelectorTerms": []}
    return {v for t in terms["nodeSelectorTerms"] for r in t.get("matchFields", []) for v in r["values"]}


def test_drain_relaunch_releases_the_old_budget_and_leaves_the_cordoned_node_to_the_scheduler() -> None:
    j = job(running_status(phase=c.RESTARTING))
    plan = reconcile(j, [], nodes_with(4, n2=dict(unschedulable=True)), listing(57), NOW)
    manifests = list(plan.manifests())
    pdb = next(m for m in manifests if m["kind"] == "PodDisruptionBudget")
    assert pdb["metadata"]["name"] == "demo-a2" and pdb["spec"]["maxUnavailable"] == 0
    assert pdb["spec"]["selector"]["matchLabels"][c.LABEL_ATTEMPT] == "2"
    assert plan.release == ["demo-a1"]
    pods = [m for m in manifests if m["kind"] == "Pod"]
    assert pods and all(avoided(p) == set() for p in pods)  # the scheduler never places on a cordoned node


TOLERATE_ALL = {"spec": {"tolerations": [{"operator": "Exists"}], "containers": [
    {"name": "trainer", "image": "trainer:1", "resources": {"limits": {c.GPU_RESOURCE: "8"}}}]}}


@pytest.mark.parametrize(
    ("name", "template", "changes", "expected"),
    [
        ("cordoned, not tolerated: the scheduler skips it", None, {"n2": dict(unschedulable=True)}, set()),
        ("cordoned, but the template tolerates everything", TOLERATE_ALL, {"n2": dict(unschedulable=True)}, {"n2"}),
        ("lost, Kubernetes still calls it Ready", None, {"n3": dict(lease_age=25.0)}, {"n3"}),
        ("lost and tainted unreachable: the scheduler skips it", None,
         {"n3": dict(lease_age=60.0, ready="Unknown", since=timedelta(seconds=50),
                     taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}])}, set()),
        ("lost and tainted unreachable, tolerated by the template", TOLERATE_ALL,
         {"n3": dict(lease_age=60.0, ready="Unknown", since=timedelta(seconds=50),
                     taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}])}, {"n3"}),
        ("lost, and too small for a worker anyway", None, {"n3": dict(lease_age=25.0, gpus=4)}, set()),
    ],
)
def test_only_nodes_the_scheduler_could_still_pick_get_an_avoid_rule(
    name: str, template: dict[str, Any] | None, changes: dict[str, dict[str, Any]], expected: set[str]
) -> None:
    """Each rule is copied into every pod: a rack lost for good must not put hundreds into each one."""
    spec = {"template": template} if template else {}
    plan = reconcile(job(running_status(phase=c.RESTARTING), **spec), [], nodes_with(5, **changes), listing(57), NOW)
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    assert pods, name
    assert all(avoided(p) == expected for p in pods), name


def test_finished_jobs_release_their_budget() -> None:
    plan = reconcile(job(running_status()), gang(1, 4, phase="Succeeded"), healthy(4), listing(), NOW)
    assert plan.status["phase"] == c.SUCCEEDED and plan.release == ["demo-a1"]
