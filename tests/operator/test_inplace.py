"""restartStrategy InPlace: which pods stay, their new ranks, when to recreate instead, and the handover as the
reconcile carries it out (plans for kept pods, no new pod before they took them, replacement when they don't)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from resilient_contract import environment
from resilient_operator import constants as c
from resilient_operator.core import inplace, reconcile
from resilient_operator.core.model import OperatorConfig, PodView, Progress
from resilient_operator.core.timeutil import fmt
from tests.operator.builders import (
    NOW,
    assess,
    gang,
    healthy,
    job,
    listing,
    node,
    nodes,
    pod,
    running_status,
)

CONFIG = OperatorConfig(plan_public_key="operator-public-key", in_place_ack_seconds=10.0)
IN_PLACE = {"restartStrategy": "InPlace"}
RECREATE = {"restartStrategy": "Recreate"}
HASH = inplace.template_hash(job().spec.template)


@dataclass
class Row:
    name: str
    pods: list[PodView]
    kept: list[str]
    health: Any = None
    avoid: tuple[str, ...] = ()
    replicas: int = 4
    ranks: dict[str, int] = field(default_factory=dict)
    new_ranks: tuple[int, ...] = ()


ROWS = [
    Row("every running pod on a healthy node stays, ranks unchanged", gang(1, 4),
        ["demo-a1-0", "demo-a1-1", "demo-a1-2", "demo-a1-3"],
        ranks={"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-2": 2, "demo-a1-3": 3}),
    Row("a lost node's pod goes; survivors close ranks, lowest old rank becomes rank 0",
        gang(1, 4), ["demo-a1-1", "demo-a1-2", "demo-a1-3"],
        health=assess(node("n0", lease_age=30.0), node("n1"), node("n2"), node("n3")), replicas=3,
        ranks={"demo-a1-1": 0, "demo-a1-2": 1, "demo-a1-3": 2}),
    Row("a partitioned node (lease stale, containers alive) is replaced, never reused", gang(1, 2), ["demo-a1-0"],
        health=assess(node("n0"), node("n1", lease_age=25.0)), replicas=2, ranks={"demo-a1-0": 0}, new_ranks=(1,)),
    Row("a failed, a deleting and a pending pod go", gang(1, 4, r0=dict(phase="Failed", exit_code=1),
                                                      r1=dict(deleting=True), r2=dict(phase="Pending")),
        ["demo-a1-3"], ranks={"demo-a1-3": 0}, new_ranks=(1, 2, 3)),
    Row("a pod from another template goes", gang(1, 2, r1=dict(template="0123456789abcdef")), ["demo-a1-0"],
        replicas=2, ranks={"demo-a1-0": 0}, new_ranks=(1,)),
    Row("a pod without our template annotation goes", gang(1, 2, r1=dict(template=None)), ["demo-a1-0"],
        replicas=2, ranks={"demo-a1-0": 0}, new_ranks=(1,)),
    Row("a pod on an avoided or draining node goes", gang(1, 3), ["demo-a1-1"], avoid=("n0", "n2"), replicas=3,
        ranks={"demo-a1-1": 0}, new_ranks=(1, 2)),
    Row("growing back: all stay, the new rank gets a new pod", gang(1, 3), ["demo-a1-0", "demo-a1-1", "demo-a1-2"],
        replicas=4, ranks={"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-2": 2}, new_ranks=(3,)),
    Row("more kept pods than the new size (multipleOf): the highest old ranks go", gang(1, 3),
        ["demo-a1-0", "demo-a1-1", "demo-a1-2"], replicas=2, ranks={"demo-a1-0": 0, "demo-a1-1": 1}),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_which_pods_stay_and_their_new_ranks(row: Row) -> None:
    health = row.health or assess(*healthy(4).values())
    keep = inplace.keepable(row.pods, health, row.avoid, HASH)
    assert [p.name for p in keep] == row.kept
    arrangement = inplace.arrange(row.pods, keep, row.replicas)
    assert arrangement.kept == row.ranks
    assert arrangement.new_ranks == row.new_ranks
    assert set(arrangement.replaced) == {p.name for p in row.pods} - set(row.ranks)


@pytest.mark.parametrize(("spec", "config", "why"), [
    (RECREATE, CONFIG, "spec.restartStrategy is Recreate"),
    (IN_PLACE, OperatorConfig(), "the operator has no plan signing key"),
    (IN_PLACE, CONFIG, None),
    ({}, CONFIG, None),  # unset: InPlace, the CRD's default (a job the API server did not default, e.g. old)
])  # fmt: skip
def test_when_to_recreate(spec: dict[str, Any], config: OperatorConfig, why: str | None) -> None:
    assert inplace.recreate_reason(job(**spec), config) == why


def lost_n3() -> dict[str, Any]:
    return nodes(node("n0"), node("n1"), node("n2"), node("n3", lease_age=25.0))


def moved(attempt: int, old: list[PodView], ranks: dict[str, int], replicas: int) -> list[PodView]:
    """Kept pods after their agents took the plan: relabelled into `attempt` (same names, nodes)."""
    return [pod(attempt, ranks[p.name], node_name=p.node_name, name=p.name, replicas=replicas)
            for p in old if p.name in ranks]


def test_node_loss_in_place_fences_the_lost_pod_and_hands_the_survivors_their_plans_in_one_pass() -> None:
    """The lost pod is force-deleted (gone once the delete is answered), so the same plan starts the next
    attempt: one pass, one status write, no wait for the deletion's watch event."""
    spec = dict(IN_PLACE, nodeLossTimeoutSeconds=20)
    first = reconcile(job(running_status(), **spec), gang(1, 4), lost_n3(), listing(40), NOW, config=CONFIG)
    st = first.status
    assert first.force_delete == ["demo-a1-3"] and first.delete == []  # survivors are not fenced
    assert st["attempt"] == 2 and st["replicas"] == 3 and st["phase"] == c.STARTING
    assert st["lastFailure"]["node"] == "n3" and st["restarts"]["infrastructure"] == 1
    assert [m["kind"] for m in first.manifests()] == ["Service", "PodDisruptionBudget"]  # no pod yet
    assert {d.pod: d.plan.node_rank for d in first.deliver} == {"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-2": 2}
    plan = first.deliver[1].plan
    assert (plan.attempt, plan.nnodes, plan.job_uid, plan.pod_uid) == (2, 3, "uid-1", "uid-demo-a1-1")
    assert plan.master_addr == "demo-a1-0.demo.ml.svc" and plan.resume_from.endswith("step-0000000040")
    assert first.deliver[1].labels == {c.LABEL_ATTEMPT: "2", c.LABEL_RANK: "1"}
    assert first.deliver[1].address == "10.1.1.1" and first.deliver[1].port == CONFIG.agent_port
    entry = st["history"][-1]
    assert entry["restart"] == "InPlace" and entry["kept"] == ["demo-a1-0", "demo-a1-1", "demo-a1-2"]
    assert entry["replaced"] == ["demo-a1-3"]
    assert st["inPlace"]["pods"] == {"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-2": 2}
    assert any("in place (kept 3 pods; new pods for ranks none)" in e.message for e in first.events)
    # The next pass, before the deletion shows and before any acknowledgement: the plans are sent again and
    # the lost pod's delete is asked again (the shell skips it while its earlier one is unconfirmed).
    pods = gang(1, 4)
    again = reconcile(job(st, **spec), pods, lost_n3(), listing(40), NOW + timedelta(seconds=1), config=CONFIG)
    assert len(again.deliver) == 3 and again.delete == [] and again.force_delete == ["demo-a1-3"]
    assert [m for m in again.manifests() if m["kind"] == "Pod"] == [] and again.status["attempt"] == 2
    # All three took their plans: attempt 2 runs on the same pods, and nothing is created or sent.
    survivors = gang(1, 3)
    done = reconcile(job(st, **spec), moved(2, survivors, st["inPlace"]["pods"], 3), lost_n3(), listing(40),
                     NOW + timedelta(seconds=2), config=CONFIG)
    assert done.status["phase"] == c.RUNNING and done.deliver == [] and list(done.manifests()) == []
    assert done.delete == [] and done.force_delete == []


def test_recreate_waits_for_graceful_deletions_but_not_for_force_deleted_pods() -> None:
    """Recreate after a node loss: the survivors are deleted gracefully, and the next attempt waits until their
    kubelets confirm (no old worker beside a new one). A gang whose every pod was on lost nodes has nothing to
    wait for: it is fenced and relaunched in one pass."""
    spec = dict(RECREATE, nodeLossTimeoutSeconds=20)
    first = reconcile(job(running_status(), **spec), gang(1, 4), lost_n3(), listing(40), NOW, config=CONFIG)
    assert first.force_delete == ["demo-a1-3"] and first.delete == ["demo-a1-0", "demo-a1-1", "demo-a1-2"]
    assert first.status["phase"] == c.RESTARTING and first.status["attempt"] == 1
    assert list(first.manifests()) == [] and first.requeue_after is not None
    one = gang(1, 1, r0=dict(node_name="n3"))
    alone = reconcile(job(running_status(replicas=1), replicas=1, elasticPolicy={"minReplicas": 1}, **spec),
                      one, lost_n3(), listing(40), NOW, config=CONFIG)
    assert alone.force_delete == ["demo-a1-0"] and alone.delete == [] and alone.status["attempt"] == 2
    assert [m["metadata"]["name"] for m in alone.manifests() if m["kind"] == "Pod"] == ["demo-a2-0"]


def test_an_acknowledgement_costs_no_status_write() -> None:
    """Kept pods move into the new attempt one by one; until the last has moved the status stays as the launch
    wrote it, so the API server sees one status write for the handover, not one per kept pod."""
    spec = dict(IN_PLACE, nodeLossTimeoutSeconds=20)
    launch = reconcile(job(running_status(), **spec), gang(1, 4), lost_n3(), listing(40), NOW, config=CONFIG)
    survivors = gang(1, 3)  # the lost pod's deletion has shown
    st, ranks = launch.status, launch.status["inPlace"]["pods"]
    writes = 0
    for i in range(1, 4):  # after the i-th acknowledgement
        now = NOW + timedelta(seconds=i)
        pods = moved(2, survivors[:i], ranks, 3) + survivors[i:]
        after = reconcile(job(st, **spec), pods, lost_n3(), listing(40), now, config=CONFIG)
        writes += after.status != st
        if i < 3:
            assert after.status == st and len(after.deliver) == 3 - i  # only the waiting ones are resent
        st = after.status
    assert st["phase"] == c.RUNNING and writes == 1  # the last move: the attempt runs


def test_an_agent_that_does_not_answer_is_replaced_by_a_new_pod_for_its_rank() -> None:
    spec = dict(IN_PLACE)
    status = running_status(attempt=2, replicas=3, phase=c.STARTING,
                            inPlace={"attempt": 2, "since": fmt(NOW), "master": "demo-a1-0",
                                     "pods": {"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-2": 2}},
                            history=[{"attempt": 2, "replicas": 3, "startTime": fmt(NOW), "restart": "InPlace",
                                      "kept": ["demo-a1-0", "demo-a1-1", "demo-a1-2"], "replaced": []}],
                            resumedFrom={"path": "/ckpt/demo/step-0000000040", "step": 40})
    took = moved(2, gang(1, 2), {"demo-a1-0": 0, "demo-a1-1": 1}, 3)
    silent = pod(1, 2, node_name="n2", replicas=4)
    early = reconcile(job(status, **spec), [*took, silent], healthy(3), listing(40), NOW + timedelta(seconds=5),
                      config=CONFIG)
    assert [d.pod for d in early.deliver] == ["demo-a1-2"] and early.delete == []
    late = reconcile(job(status, **spec), [*took, silent], healthy(3), listing(40), NOW + timedelta(seconds=11),
                     config=CONFIG)
    assert late.delete == ["demo-a1-2"] and late.deliver == []
    assert any(e.reason == c.REASON_IN_PLACE_FALLBACK for e in late.events)
    created = [m for m in late.manifests() if m["kind"] == "Pod"]
    assert [m["metadata"]["name"] for m in created] == ["demo-a2-2"]
    env = {e["name"]: e.get("value") for e in created[0]["spec"]["containers"][0]["env"]}
    assert env[environment.MASTER_ADDR] == "demo-a1-0.demo.ml.svc"  # the kept rank 0 is the rendezvous host
    assert env[environment.NODE_RANK] == "2" and env[environment.ATTEMPT] == "2"
    entry = late.status["history"][-1]
    assert entry["kept"] == ["demo-a1-0", "demo-a1-1"] and entry["replaced"] == ["demo-a1-2"] and entry["fallback"]


def test_a_pod_without_an_agent_is_replaced_on_the_next_pass_not_after_the_bound() -> None:
    """The delivery found nothing listening in one kept pod (its container does not run the launcher): the
    next pass replaces it and says why, a second into a 10 s bound; the pods whose agents answer keep waiting."""
    spec = dict(IN_PLACE, nodeLossTimeoutSeconds=20)
    launch = reconcile(job(running_status(), **spec), gang(1, 4), lost_n3(), listing(40), NOW, config=CONFIG)
    survivors = gang(1, 3)  # the lost pod's deletion has shown
    later = NOW + timedelta(seconds=1)
    took = moved(2, survivors[:2], launch.status["inPlace"]["pods"], 3)
    after = reconcile(job(launch.status, **spec), [*took, survivors[2]], lost_n3(), listing(40), later,
                      config=CONFIG, undeliverable={"uid-demo-a1-2": "unreachable"})
    assert after.delete == ["demo-a1-2"] and after.deliver == []
    fallback = next(e for e in after.events if e.reason == c.REASON_IN_PLACE_FALLBACK)
    assert "demo-a1-2" in fallback.message and "resilient_trainer.launch" in fallback.message
    entry = after.status["history"][-1]
    assert entry["kept"] == ["demo-a1-0", "demo-a1-1"] and entry["replaced"] == ["demo-a1-2", "demo-a1-3"]
    assert entry["fallback"]
    created = [m["metadata"]["name"] for m in after.manifests() if m["kind"] == "Pod"]
    assert created == ["demo-a2-2"]  # its rank, once the pod is gone from the cache (here: at once)


def test_growing_back_in_place_keeps_the_gang_and_creates_only_the_new_rank_after_the_handover() -> None:
    spec = dict(IN_PLACE)
    status = running_status(attempt=1, replicas=3, growBack={"replicas": 4, "sinceStep": 30},
                            latestCheckpoint={"path": "/ckpt/demo/step-0000000040", "step": 40})
    # Nothing to fence, so the stop and the in-place start are one pass.
    start = reconcile(job(status, **spec), gang(1, 3), healthy(4), listing(40), NOW, config=CONFIG)
    assert start.delete == [] and start.force_delete == [] and start.status["phase"] == c.STARTING
    assert start.status["attempt"] == 2 and start.status["replicas"] == 4 and len(start.deliver) == 3
    assert [m for m in start.manifests() if m["kind"] == "Pod"] == []
    after = reconcile(job(start.status, **spec), moved(2, gang(1, 3), start.status["inPlace"]["pods"], 4),
                      healthy(4), listing(40), NOW + timedelta(seconds=1), config=CONFIG)
    assert [m["metadata"]["name"] for m in after.manifests() if m["kind"] == "Pod"] == ["demo-a2-3"]


def test_recreate_is_unchanged_and_says_so_in_the_history() -> None:
    first = reconcile(job(running_status(), **RECREATE), gang(1, 4), lost_n3(), listing(40), NOW, config=CONFIG)
    assert sorted(first.delete + first.force_delete) == [f"demo-a1-{r}" for r in range(4)]
    second = reconcile(job(first.status, **RECREATE), [], lost_n3(), listing(40), NOW, config=CONFIG)
    assert second.deliver == [] and len([m for m in second.manifests() if m["kind"] == "Pod"]) == 3
    assert second.status["history"][-1]["restart"] == "Recreate"


def test_kept_pods_carry_the_agent_settings_and_recreated_ones_too() -> None:
    plan = reconcile(job({}, **IN_PLACE), [], healthy(4), listing(), NOW, config=CONFIG)
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["RTJ_PLAN_PUBLIC_KEY"]["value"] == "operator-public-key"
    assert env["RTJ_AGENT_PORT"]["value"] == str(CONFIG.agent_port)
    assert env["RTJ_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert float(env["RTJ_AGENT_LINGER_SECONDS"]["value"]) >= 2 * 20
    assert pods[0]["metadata"]["annotations"][c.ANNOTATION_TEMPLATE_HASH] == HASH


def test_a_silent_rendezvous_host_takes_the_whole_attempt_with_it() -> None:
    """Every plan names rank 0's pod as the rendezvous host: when that pod is replaced, the kept pods that took
    their plans would wait for a host that is gone, so they are replaced too, and rank 0 is a new pod."""
    status = running_status(attempt=2, replicas=3, phase=c.STARTING,
                            inPlace={"attempt": 2, "since": fmt(NOW), "master": "demo-a1-0",
                                     "pods": {"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-2": 2}},
                            history=[{"attempt": 2, "replicas": 3, "startTime": fmt(NOW), "restart": "InPlace",
                                      "kept": ["demo-a1-0", "demo-a1-1", "demo-a1-2"], "replaced": []}])
    took = moved(2, gang(1, 3)[1:], {"demo-a1-1": 1, "demo-a1-2": 2}, 3)
    silent = pod(1, 0, node_name="n0", replicas=4)
    late = reconcile(job(status, **IN_PLACE), [silent, *took], healthy(3), listing(40),
                     NOW + timedelta(seconds=11), config=CONFIG)
    assert sorted(late.delete) == ["demo-a1-0", "demo-a1-1", "demo-a1-2"]
    assert "master" not in late.status["inPlace"]
    assert late.status["history"][-1]["kept"] == []
    # once they are gone, every rank gets a new pod, and rank 0's own pod is the rendezvous host
    after = reconcile(job(late.status, **IN_PLACE), [], healthy(3), listing(40), NOW + timedelta(seconds=12),
                      config=CONFIG)
    created = [m for m in after.manifests() if m["kind"] == "Pod"]
    assert [m["metadata"]["name"] for m in created] == ["demo-a2-0", "demo-a2-1", "demo-a2-2"]
    env = {e["name"]: e.get("value") for e in created[1]["spec"]["containers"][0]["env"]}
    assert env[environment.MASTER_ADDR] == "demo-a2-0.demo.ml.svc"


def test_a_rendezvous_host_without_an_agent_takes_the_waiting_pods_with_it() -> None:
    """Rank 0's kept pod has no agent, and another kept pod has not answered yet: its plan names that host, so
    it is not sent again; every kept pod is replaced on this pass and no plan goes out."""
    status = running_status(attempt=2, replicas=3, phase=c.STARTING,
                            inPlace={"attempt": 2, "since": fmt(NOW), "master": "demo-a1-0",
                                     "pods": {"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-2": 2}},
                            history=[{"attempt": 2, "replicas": 3, "startTime": fmt(NOW), "restart": "InPlace",
                                      "kept": ["demo-a1-0", "demo-a1-1", "demo-a1-2"], "replaced": []}])
    took = moved(2, [pod(1, 1, node_name="n1")], {"demo-a1-1": 1}, 3)
    old = [pod(1, 0, node_name="n0", replicas=4), pod(1, 2, node_name="n2", replicas=4)]
    plan = reconcile(job(status, **IN_PLACE), [*old, *took], healthy(3), listing(40), NOW + timedelta(seconds=1),
                     config=CONFIG, undeliverable={"uid-demo-a1-0": "unreachable"})
    assert sorted(plan.delete) == ["demo-a1-0", "demo-a1-1", "demo-a1-2"] and plan.deliver == []
    assert plan.status["inPlace"]["pods"] == {} and "master" not in plan.status["inPlace"]


def test_a_drain_in_place_deletes_only_the_draining_pod_and_waits_for_the_gangs_checkpoint() -> None:
    """n1 is cordoned: only its pod is deleted (gracefully: its SIGTERM stops the whole gang at its step, and
    every rank saves). The kept pods stay; the launch waits until a checkpoint at least as new as the step the
    gang had reached is complete, then hands the three kept pods their plans from it, and creates nothing."""
    spec = dict(IN_PLACE)
    cordoned = nodes(node("n0"), node("n1", unschedulable=True), node("n2"), node("n3"))
    reports = [Progress(f"demo-a1-{r}", 1, 42, NOW) for r in range(4)]
    stop = reconcile(job(running_status(), **spec), gang(1, 4), cordoned, listing(40), NOW, progress=reports,
                     config=CONFIG)
    assert stop.delete == ["demo-a1-1"] and stop.force_delete == []  # graceful, and only the draining pod
    assert stop.status["phase"] == c.RESTARTING and stop.status["lastDrain"]["step"] == 42
    kept = [p for p in gang(1, 4) if p.name != "demo-a1-1"]
    early = reconcile(job(stop.status, **spec), kept, cordoned, listing(40), NOW + timedelta(seconds=1),
                      config=CONFIG)
    assert early.status["attempt"] == 1 and early.deliver == []  # its checkpoint is not complete yet
    assert early.requeue_after is not None and early.requeue_after <= 1.0
    go = reconcile(job(stop.status, **spec), kept, cordoned, listing(40, 43), NOW + timedelta(seconds=2),
                   config=CONFIG)
    assert go.status["attempt"] == 2 and go.status["resumedFrom"]["step"] == 43
    assert {d.pod for d in go.deliver} == {"demo-a1-0", "demo-a1-2", "demo-a1-3"}
    assert [m for m in go.manifests() if m["kind"] == "Pod"] == []
    assert go.status["history"][-1]["restart"] == "InPlace"
    # a save that never completes: after the pods' grace period (30 s by default) the launch goes on
    renewing = nodes(*(node(n, lease_age=-30.0, unschedulable=n == "n1") for n in ("n0", "n1", "n2", "n3")))
    late = reconcile(job(stop.status, **spec), kept, renewing, listing(40), NOW + timedelta(seconds=31),
                     config=CONFIG)
    assert late.status["attempt"] == 2 and late.status["resumedFrom"]["step"] == 40


def test_a_hang_in_place_replaces_only_the_pod_whose_rank_stopped_first() -> None:
    """In-place agents keep their pods on a hang and put the verdict in their progress reports: the operator
    waits for the gang's verdicts, blames the rank that stopped first (its node avoided), deletes only that
    pod, hands the others their plans and creates one pod for the missing rank once they moved."""
    from resilient_contract.progress import Hang

    spec = dict(IN_PLACE, progressTimeoutSeconds=20, badNodeSeconds=600)

    def verdict(rank: int, step: int, stalled: float, ago: float) -> Progress:
        return Progress(f"demo-a1-{rank}", 1, step, NOW - timedelta(seconds=ago), hung=Hang(step, rank, stalled, 20))

    pods = gang(1, 4)  # on n0..n3; n4 is spare
    early = [verdict(0, 42, 20.0, 1.0)]  # one verdict, three pods still training: gather first
    plan = reconcile(job(running_status(), **spec), pods, healthy(5), listing(40), NOW, progress=early,
                     config=CONFIG)
    assert "lastFailure" not in plan.status and plan.requeue_after is not None and plan.requeue_after <= 1.0
    every = [verdict(0, 42, 20.0, 1.0), verdict(1, 42, 20.1, 1.0), verdict(2, 41, 20.0, 1.0),
             verdict(3, 42, 20.0, 0.5)]
    first = reconcile(job(running_status(), **spec), pods, healthy(5), listing(40), NOW, progress=every,
                      config=CONFIG)
    failure = first.status["lastFailure"]
    assert failure["kind"] == c.HANG and failure["node"] == "n2" and "hang at step 41; rank 2" in failure["message"]
    assert first.delete == ["demo-a1-2"] and first.force_delete == []  # only the pod that stopped first
    rest = [p for p in pods if p.name != "demo-a1-2"]
    second = reconcile(job(first.status, **spec), rest, healthy(5), listing(40), NOW, config=CONFIG)
    st = second.status
    assert st["attempt"] == 2 and st["replicas"] == 4 and st["history"][-1]["restart"] == "InPlace"
    assert {d.pod: d.plan.node_rank for d in second.deliver} == {"demo-a1-0": 0, "demo-a1-1": 1, "demo-a1-3": 2}
    assert [m for m in second.manifests() if m["kind"] == "Pod"] == []  # not before the kept pods moved
    done = reconcile(job(st, **spec), moved(2, rest, st["inPlace"]["pods"], 4), healthy(5), listing(40),
                     NOW + timedelta(seconds=1), config=CONFIG)
    (new,) = [m for m in done.manifests() if m["kind"] == "Pod"]
    assert new["metadata"]["labels"][c.LABEL_RANK] == "3"
    assert "n2" in str(new["spec"]["affinity"])  # the blamed node is avoided
