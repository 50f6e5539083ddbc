"""Kueue v0.17 on the local cluster: quota, queueing, preemption and partial admission, elastic sizes.

A real Kueue controller manager (e2e/kueue.py) runs beside the control plane; the operator is upgraded
with `kueue.enabled=true`. One ClusterQueue holds 4 nvidia.com/gpu on the training pool (w0..w3, one
GPU each) and two LocalQueues live in each test's namespace.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import kueue, scenarios, support
from e2e.localcluster.cluster import Cluster, wait_for
from e2e.support import CHART, HOST_DIR, MOUNT, OPERATOR_NS, RELEASE
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from resilient_operator import constants as c
from resilient_operator.core.timeutil import parse

pytestmark = [pytest.mark.cluster]
STEPS, TOLERANCE = 40, 1e-5


def _operator_with_kueue(cluster: Cluster, on: bool) -> None:
    cluster.helm("upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--reuse-values", "--wait",
                 "--timeout", "120s", "--set", f"kueue.enabled={str(on).lower()}")
    wait_for(lambda: on == any(e.name == "RTJ_KUEUE_ENABLED"
                               for e in support.wait_operator_ready(cluster).spec.containers[0].env or []),
             120, f"the operator with Kueue {'on' if on else 'off'}")


@pytest.fixture(scope="module")
def with_kueue(cluster: Cluster, operator: str, reference_run: Any) -> Iterator[Cluster]:
    """Kueue installed once for the module; the operator upgraded to manage queue-labelled jobs, and back
    afterwards (the later suites check the chart's default RBAC rule by rule). `reference_run` only
    starts the preemption test's reference training early."""
    kueue.install(cluster)
    _operator_with_kueue(cluster, True)
    yield cluster
    _operator_with_kueue(cluster, False)
    kueue.stop(cluster)


@pytest.fixture
def queues(with_kueue: Cluster, namespace: str) -> str:
    """LocalQueues team-a/team-b in the test's namespace; waits until the ClusterQueue is idle."""
    kueue.queues(with_kueue, namespace)

    def idle() -> bool:
        cq = with_kueue.kubectl("get", "clusterqueue", kueue.CLUSTER_QUEUE, "-o",
                                "jsonpath={.status.reservingWorkloads}", check=False).stdout.strip()
        return cq in ("", "0")

    wait_for(idle, 120, "the ClusterQueue holds no quota from earlier tests")
    return namespace


def queued(manifest: dict[str, Any], queue: str, priority: str | None = None) -> dict[str, Any]:
    labels = manifest["metadata"].setdefault("labels", {})
    labels[c.LABEL_QUEUE_NAME] = queue
    if priority:
        labels[c.LABEL_PRIORITY_CLASS] = priority
    return manifest


def until_done(ns: str, name: str) -> str:
    """A worker that runs until the test drops <root>.done, then exits 0 (the job succeeds)."""
    return f"while [ ! -f {MOUNT}/{ns}-{name}.done ]; do sleep 0.3; done; exit 0"


def finish(cluster: Cluster, ns: str, name: str) -> None:
    cluster.host_path(f"{HOST_DIR}/{ns}-{name}.done").touch()


def workload_of(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    (wl,) = [w for w in kueue.workloads(cluster, ns) if w["metadata"]["labels"].get(c.LABEL_JOB) == name
             and not w["metadata"].get("deletionTimestamp")]
    return wl


def cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((x for x in (obj.get("status") or {}).get("conditions") or [] if x["type"] == ctype), {})


def admitted_to_running(cluster: Cluster, ns: str, name: str, replicas: int, attempt: int = 1,
                        timeout: float = 120) -> float:
    """Seconds from Kueue admitting the job's Workload (its Admitted condition) to all workers running
    (the job's Running condition): both stamped by the controllers, 1 s resolution."""
    support.running_attempt(cluster, ns, name, attempt, replicas, timeout=timeout)
    admitted = cond(workload_of(cluster, ns, name), "Admitted")
    running = cond(support.get_job(cluster, ns, name), c.COND_RUNNING)
    assert admitted.get("status") == "True" and running.get("status") == "True"
    return (parse(running["lastTransitionTime"]) - parse(admitted["lastTransitionTime"])).total_seconds()


@pytest.mark.timeout(240)
def test_two_jobs_compete_for_quota_the_second_waits_queued(with_kueue: Cluster, queues: str) -> None:
    cl, ns = with_kueue, queues
    support.apply(cl, queued(support.job_manifest("first", ns, replicas=3, min_replicas=3,
                                                  script=until_done(ns, "first")), "team-a"))
    wait_s = admitted_to_running(cl, ns, "first", 3)
    support.apply(cl, queued(support.job_manifest("second", ns, replicas=3, min_replicas=3,
                                                  script=until_done(ns, "second")), "team-b"))
    status = support.wait_phase(cl, ns, "second", c.QUEUED, timeout=60)
    assert cond({"status": status}, c.COND_QUEUED)["status"] == "True"
    # Kueue looked at it and said no (1 GPU of quota is left, it needs 3): QuotaReserved=False, Pending
    wait_for(lambda: cond(workload_of(cl, ns, "second"), "QuotaReserved").get("reason") == "Pending", 30,
             "Kueue refusing the second job's quota")
    assert not support.job_pods(cl, ns, "second") and support.get_job(cl, ns, "second")["status"]["phase"] == c.QUEUED
    finish(cl, ns, "first")
    support.wait_phase(cl, ns, "first", c.SUCCEEDED, timeout=60)
    assert cond(workload_of(cl, ns, "first"), "Finished")["status"] == "True"
    second_s = admitted_to_running(cl, ns, "second", 3)
    print(f"\nadmission -> all workers running: first {wait_s:.1f}s, second {second_s:.1f}s")
    wl = workload_of(cl, ns, "second")
    assert wl["metadata"]["ownerReferences"][0]["kind"] == c.KIND
    assert {p.spec.node_selector.get("pool") for p in support.job_pods(cl, ns, "second")} == {"train"}  # the flavor
    finish(cl, ns, "second")
    support.wait_phase(cl, ns, "second", c.SUCCEEDED, timeout=60)


@pytest.mark.timeout(180)
def test_partial_admission_starts_at_the_minimum_when_quota_is_short(with_kueue: Cluster, queues: str) -> None:
    cl, ns = with_kueue, queues
    support.apply(cl, queued(support.job_manifest("holder", ns, replicas=2, min_replicas=2,
                                                  script=until_done(ns, "holder")), "team-a"))
    support.running_attempt(cl, ns, "holder", 1, 2)
    support.apply(cl, queued(support.job_manifest("elastic", ns, replicas=4, min_replicas=2,
                                                  script=until_done(ns, "elastic")), "team-b"))
    support.running_attempt(cl, ns, "elastic", 1, 2, timeout=90)
    wl = workload_of(cl, ns, "elastic")
    assert wl["spec"]["podSets"][0]["count"] == 4 and wl["spec"]["podSets"][0]["minCount"] == 2
    assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 2
    assert support.get_job(cl, ns, "elastic")["status"]["kueue"]["admittedReplicas"] == 2
    for name in ("holder", "elastic"):
        finish(cl, ns, name)
        support.wait_phase(cl, ns, name, c.SUCCEEDED, timeout=60)


@pytest.mark.timeout(240)
def test_node_loss_shrinks_an_admitted_job_without_requeue_and_grows_back_by_a_new_admission(
    with_kueue: Cluster, queues: str
) -> None:
    cl, ns = with_kueue, queues
    shrink = queued(support.job_manifest("shrink", ns, replicas=4, min_replicas=2, script=until_done(ns, "shrink"),
                                 badNodeSeconds=0), "team-a")  # the node may be used again once back
    support.apply(cl, shrink)
    pods = support.running_attempt(cl, ns, "shrink", 1, 4, timeout=90)  # the whole pool and the whole quota
    before = workload_of(cl, ns, "shrink")
    dead = support.node_of(pods, "1")
    cl.kill_node(dead)
    support.running_attempt(cl, ns, "shrink", 2, 3, timeout=90)
    after = workload_of(cl, ns, "shrink")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # the same admission: no requeue
    assert cond(after, "Admitted")["status"] == "True" and cond(after, "Evicted").get("status") != "True"
    assert cond(after, "Admitted")["lastTransitionTime"] == cond(before, "Admitted")["lastTransitionTime"]
    wait_for(lambda: (workload_of(cl, ns, "shrink")["status"].get("reclaimablePods") or [{}])[0].get("count") == 1,
             30, "the lost worker's quota released (reclaimablePods)")
    status = support.get_job(cl, ns, "shrink")["status"]
    assert status["restarts"]["infrastructure"] == 1 and status["restarts"]["planned"] == 0
    # the node returns: growing past the 3 workers' quota still held asks Kueue for a new admission,
    # at the first checkpoint written after the capacity came back
    cl.restore_node(dead)
    wait_for(lambda: support.get_job(cl, ns, "shrink")["status"].get("growBack"), 60, "grow-back noticed")
    support.make_checkpoint(scenarios.host_root(cl, shrink), step=10)
    support.wait_phase(cl, ns, "shrink", c.QUEUED, timeout=60)
    support.running_attempt(cl, ns, "shrink", 3, 4, timeout=90)
    regrown = workload_of(cl, ns, "shrink")
    assert regrown["metadata"]["uid"] != before["metadata"]["uid"]  # a new Workload, admitted for 4
    assert regrown["status"]["admission"]["podSetAssignments"][0]["count"] == 4
    assert support.get_job(cl, ns, "shrink")["status"]["resumedFrom"]["step"] == 10
    finish(cl, ns, "shrink")
    support.wait_phase(cl, ns, "shrink", c.SUCCEEDED, timeout=60)


@pytest.fixture(scope="module")
def reference_run(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], Path] | None]:
    """The same training without interruption (2 local processes), started in the background as the module
    begins (it overlaps Kueue's install and the first tests) when the preemption test is selected."""
    if not any(item.name.startswith("test_high_priority_preempts") for item in request.session.items):
        yield None
        return
    out = tmp_path_factory.mktemp("reference")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "resilient_trainer.examples.tiny_gpt", f"--steps={STEPS}", "--checkpoint-every=0",
           f"--checkpoint-root={out / 'ckpt'}", f"--dump-state={out / 'state.pt'}"]  # fmt: skip
    with (out / "log").open("wb") as log:  # a file, not a pipe nobody drains while the tests run
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    yield proc, out / "state.pt"
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def reference(reference_run: tuple[subprocess.Popen[bytes], Path] | None) -> dict[str, Any]:
    """The model a resumed job must end with."""
    import torch

    assert reference_run is not None
    proc, state = reference_run
    assert proc.wait(timeout=300) == 0, (state.parent / "log").read_text(errors="replace")[-2000:]
    return dict(torch.load(state, weights_only=False))


@pytest.mark.timeout(420)
def test_high_priority_preempts_low_which_checkpoints_requeues_and_resumes(
    with_kueue: Cluster, queues: str, reference: dict[str, Any]
) -> None:
    import torch

    from e2e.tests.test_training_e2e import relative_difference

    cl, ns = with_kueue, queues
    scenarios.shared_claim(cl, ns)
    low = scenarios.example_job("low", ns, replicas=2, min_replicas=2, steps=STEPS, step_delay=0.4,
                                extra_args=(f"--dump-state={MOUNT}/{ns}/low.pt",))
    cl.apply(queued(low, "team-a", "low"))
    support.running_attempt(cl, ns, "low", 1, 2, timeout=180)
    scenarios.first_complete_checkpoint(cl, low)
    support.apply(cl, queued(support.job_manifest("high", ns, replicas=4, min_replicas=4,
                                                  script=until_done(ns, "high")), "team-b", "high"))
    status = support.wait_phase(cl, ns, "low", c.QUEUED, timeout=60)
    assert cond({"status": status}, c.COND_QUEUED)["reason"] == "Preempted"
    high_s = admitted_to_running(cl, ns, "high", 4, timeout=120)
    status = support.get_job(cl, ns, "low")["status"]
    assert status["phase"] == c.QUEUED and not support.job_pods(cl, ns, "low")
    assert status["restarts"] == {"infrastructure": 0, "application": 0, "planned": 0}  # no budget spent
    saved = status["latestCheckpoint"]["step"]
    finish(cl, ns, "high")
    support.wait_phase(cl, ns, "high", c.SUCCEEDED, timeout=60)
    resumed_s = admitted_to_running(cl, ns, "low", 2, attempt=2, timeout=120)
    print(f"\npreemptor admitted -> running {high_s:.1f}s; preempted job re-admitted -> running {resumed_s:.1f}s")
    status = support.get_job(cl, ns, "low")["status"]
    assert status["attempt"] == 2 and status["resumedFrom"]["step"] >= saved
    final = support.wait_phase(cl, ns, "low", c.SUCCEEDED, timeout=240)
    assert final["restarts"] == {"infrastructure": 0, "application": 0, "planned": 1}
    story = support.events(cl, ns, "low")
    assert any(e.startswith(c.REASON_EVICTED_BY_KUEUE) for e in story), story
    assert any(e.startswith(c.REASON_QUOTA_RELEASED) for e in story), story
    state = torch.load(scenarios.host_root(cl, low).with_suffix(".pt"), weights_only=False)
    diff = relative_difference(reference["model"], state["model"])
    print(f"final model vs uninterrupted reference: relative difference {diff:.2e}")
    assert diff <= TOLERANCE
