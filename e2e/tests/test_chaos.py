"""Chaos: the operator keeps its promises when it is itself killed, when the control plane blips, when a
node flaps, and when many jobs lose nodes at once.

Faults are injected precisely: the operator process is frozen (SIGSTOP) at the stage under test and then
SIGKILLed or its pod force-deleted; the API server is stopped and started with the same flags; etcd is
frozen; a node agent is frozen (heartbeats stop, its pods keep running). Waits poll with timeouts.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.gates import (
    check_recovered,
    first_delete,
    gated_start,
    slow_stop_script,
    starting_with_all_pods,
    wait_starting_with_all_pods,
)  # fmt: skip
from e2e.localcluster.cluster import Cluster, wait_for
from e2e.support import (
    HOST_DIR,
    MOUNT,
    NODES,
    apply,
    assert_consistent_status,
    assert_single_attempt,
    core,
    delete_operator_pod,
    events,
    job_manifest,
    job_pods,
    job_status,
    job_statuses,
    make_checkpoint,
    node_of,
    operator_pid,
    pause_node_agent,
    restart_component,
    resume_node_agent,
    running_attempt,
    signal_component,
    tiny_job,
    wait_operator_ready,
    wait_phase,
)  # fmt: skip
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]


def freeze_operator(cl: Cluster) -> int:
    pid = wait_for(lambda: operator_pid(cl), 60, "the operator process")
    os.kill(pid, signal.SIGSTOP)
    return int(pid)


def kill_frozen_operator(cl: Cluster, pid: int) -> None:
    """SIGKILL the frozen process and wait for its container to come back (same pod)."""
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: operator_pid(cl) not in (None, pid), 90, "the operator container restarted")


# ---- 1. the operator killed at each stage of a recovery --------------------------------------------------
@pytest.mark.timeout(600)
def test_operator_killed_at_each_stage_of_a_recovery(cluster: Cluster, namespace: str) -> None:
    name = "stages"
    make_checkpoint(cluster.host_path(f"{HOST_DIR}/{namespace}/{name}"), step=7)
    gate = cluster.host_path(f"{HOST_DIR}/{namespace}-{name}.open")
    gate.touch()
    # badNodeSeconds=0: each stage deletes rank 1, and the scheduler may put rank 1 on one node twice; bad-node
    # memory would then (rightly) have the job avoid that node and restart smaller (2 workers, seen in CI),
    # while this test is about the operator's own crashes, each of which must end in the same 3-worker gang
    job = job_manifest(name, namespace, replicas=3, script=slow_stop_script(), badNodeSeconds=0)
    job["spec"]["template"]["spec"]["initContainers"] = [gated_start(f"{MOUNT}/{namespace}-{name}.open")]
    apply(cluster, job)
    running_attempt(cluster, namespace, name, 1, 3)

    # (a) the fault happens while the operator is down: the new process must find it from a fresh list
    pid = freeze_operator(cluster)
    first_delete(cluster, namespace, name, 1)
    time.sleep(1)  # the fault lands while the operator is frozen (injection timing, not a wait)
    kill_frozen_operator(cluster, pid)
    check_recovered(cluster, namespace, name, 2, 3, 7)

    # (b) right after detection: status says Restarting, the old pods are still terminating (slow stop)
    first_delete(cluster, namespace, name, 2)
    wait_phase(cluster, namespace, name, c.RESTARTING, timeout=60)
    delete_operator_pod(cluster)  # a force-deleted operator pod, as `kubectl delete --force` does
    wait_operator_ready(cluster)
    check_recovered(cluster, namespace, name, 3, 3, 7)

    # (c) after fencing, before the relaunch: freeze at Restarting, let the old pods go, then kill
    first_delete(cluster, namespace, name, 3)
    wait_phase(cluster, namespace, name, c.RESTARTING, timeout=60)
    pid = freeze_operator(cluster)
    assert job_status(cluster, namespace, name)["phase"] == c.RESTARTING
    wait_for(lambda: not job_pods(cluster, namespace, name), 60, "attempt 3 fenced while the operator is frozen")
    kill_frozen_operator(cluster, pid)
    check_recovered(cluster, namespace, name, 4, 3, 7)

    # (d) the new pods created, the attempt Starting (their init container holds them until the gate opens, so
    #     the freeze never races the operator's write of Running): freeze, remove one new pod behind its back
    #     (the state of a crash part-way through the creates), kill, open the gate
    gate.unlink()
    first_delete(cluster, namespace, name, 4)

    wait_starting_with_all_pods(cluster, namespace, name, 5, 3)
    # the same pass posts the attempt's event after its creates: a freeze between the two loses the event (CI),
    # as any controller's best-effort event is lost when it dies before the post; this stage is after it
    wait_for(lambda: sum(e.startswith(c.REASON_STARTED) for e in events(cluster, namespace, name)) == 5, 30,
             "attempt 5's event")
    pid = freeze_operator(cluster)
    new = starting_with_all_pods(cluster, namespace, name, 5, 3)
    assert new, "attempt 5 left Starting while its pods were held"
    victim = new[0].metadata.name
    core(cluster).delete_namespaced_pod(victim, namespace, grace_period_seconds=0)
    uid = new[0].metadata.uid
    wait_for(lambda: uid not in {p.metadata.uid for p in job_pods(cluster, namespace, name)}, 30, f"{victim} gone")
    kill_frozen_operator(cluster, pid)
    gate.touch()
    status = check_recovered(cluster, namespace, name, 5, 3, 7)
    assert [h["attempt"] for h in status["history"]] == [1, 2, 3, 4, 5]
    assert status["restarts"] == {"infrastructure": 4, "application": 0, "planned": 0}
    # events describe each restart once
    story = events(cluster, namespace, name)
    started = [e for e in story if e.startswith(c.REASON_STARTED)]
    assert len(started) == 5, started


# ---- 2. kube-apiserver restarted ------------------------------------------------------------------------
@pytest.mark.timeout(420)
def test_apiserver_restarted_while_running_and_during_recovery(cluster: Cluster, namespace: str) -> None:
    name = "apirs"
    flag = f"{MOUNT}/{namespace}-{name}.done"
    apply(cluster, job_manifest(name, namespace, replicas=2, script=slow_stop_script(flag),
                                nodeLossTimeoutSeconds=30))  # fmt: skip
    running_attempt(cluster, namespace, name, 1, 2)
    t0 = time.monotonic()
    restart_component(cluster, "kube-apiserver", down_seconds=3)
    print(f"\napiserver back after {time.monotonic() - t0:.1f}s")
    # the watches are back: a pod deleted now is noticed
    first_delete(cluster, namespace, name, 1)
    running_attempt(cluster, namespace, name, 2, 2, timeout=150)
    # restarted while a recovery is in progress
    first_delete(cluster, namespace, name, 2)
    wait_phase(cluster, namespace, name, c.RESTARTING, timeout=60)
    restart_component(cluster, "kube-apiserver", down_seconds=3)
    running_attempt(cluster, namespace, name, 3, 2, timeout=150)
    assert_single_attempt(cluster, namespace, name, 3, 2)
    status = job_status(cluster, namespace, name)
    assert_consistent_status(status)
    assert status["restarts"] == {"infrastructure": 2, "application": 0, "planned": 0}, status["restarts"]
    # and it completes
    cluster.host_path(f"{HOST_DIR}/{namespace}-{name}.done").touch()
    status = wait_phase(cluster, namespace, name, c.SUCCEEDED, timeout=90)
    assert status["attempt"] == 3


@pytest.mark.timeout(300)
def test_apiserver_outage_longer_than_node_loss_timeout_restarts_nothing(cluster: Cluster, namespace: str) -> None:
    """Heartbeats cannot be written while the API server is down; that is not node loss."""
    name = "apilong"
    apply(cluster, job_manifest(name, namespace, replicas=2, nodeLossTimeoutSeconds=6))
    running_attempt(cluster, namespace, name, 1, 2)
    restart_component(cluster, "kube-apiserver", down_seconds=8)
    # give the operator (and its watches) time to look at the stale-looking leases
    wait_for(lambda: all(cluster.node_ready(n) for n in NODES), 90, "nodes Ready again")
    time.sleep(8)  # a window for a spurious restart to show (nothing to wait for if none happens)
    status = job_status(cluster, namespace, name)
    assert status["attempt"] == 1 and status["restarts"]["infrastructure"] == 0, status.get("lastFailure")


# ---- 3. etcd frozen ---------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_etcd_frozen_briefly_then_job_recovers_and_completes(cluster: Cluster, namespace: str) -> None:
    name = "etcd"
    flag = f"{MOUNT}/{namespace}-{name}.done"
    apply(cluster, job_manifest(name, namespace, replicas=2, script=slow_stop_script(flag),
                                nodeLossTimeoutSeconds=30))  # fmt: skip
    running_attempt(cluster, namespace, name, 1, 2)
    signal_component(cluster, "etcd", signal.SIGSTOP)
    try:
        time.sleep(5)  # the outage being injected
    finally:
        signal_component(cluster, "etcd", signal.SIGCONT)
    wait_for(lambda: cluster.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 60, "API ready")
    first_delete(cluster, namespace, name, 1)
    # frozen again while the recovery runs
    wait_phase(cluster, namespace, name, c.RESTARTING, timeout=60)
    signal_component(cluster, "etcd", signal.SIGSTOP)
    try:
        time.sleep(4)
    finally:
        signal_component(cluster, "etcd", signal.SIGCONT)
    running_attempt(cluster, namespace, name, 2, 2, timeout=150)
    status = job_status(cluster, namespace, name)
    assert_consistent_status(status)
    assert status["restarts"]["infrastructure"] == 1
    cluster.host_path(f"{HOST_DIR}/{namespace}-{name}.done").touch()
    wait_phase(cluster, namespace, name, c.SUCCEEDED, timeout=90)


# ---- 4. a flapping node --------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_flapping_node_within_timeout_no_restart_past_it_exactly_one(cluster: Cluster, namespace: str) -> None:
    name = "flap"
    timeout = 15  # > the controller-manager's 8 s grace, so the node is seen NotReady and back in time
    apply(cluster, job_manifest(name, namespace, replicas=2, min_replicas=1, nodeLossTimeoutSeconds=timeout))
    pods = running_attempt(cluster, namespace, name, 1, 2)
    node = node_of(pods, "1")
    pause_node_agent(cluster, node)
    try:
        wait_for(lambda: not cluster.node_ready(node), 30, f"{node} NotReady")
    finally:
        resume_node_agent(cluster, node)
    wait_for(lambda: cluster.node_ready(node), 30, f"{node} Ready again")
    time.sleep(timeout - 6)  # past the moment a miscounted flap would have become a loss
    status = job_status(cluster, namespace, name)
    assert status["attempt"] == 1 and status["restarts"]["infrastructure"] == 0, status.get("lastFailure")
    assert_single_attempt(cluster, namespace, name, 1, 2)

    # now past the timeout: exactly one restart, even though the node comes back afterwards
    pause_node_agent(cluster, node)
    try:
        status = wait_for(lambda: (s := job_status(cluster, namespace, name))["restarts"]["infrastructure"] >= 1
                          and s, 60, "the loss recorded")  # fmt: skip
    finally:
        resume_node_agent(cluster, node)
    assert status["lastFailure"]["node"] == node
    assert status["lastFailure"]["reason"] in (c.REASON_NODE_LOST,)
    running_attempt(cluster, namespace, name, 2, 2, timeout=120)
    wait_for(lambda: cluster.node_ready(node), 30, f"{node} Ready again")
    time.sleep(3)  # a window for a second, spurious restart to show
    status = job_status(cluster, namespace, name)
    assert status["attempt"] == 2 and status["restarts"]["infrastructure"] == 1
    assert_consistent_status(status)


# ---- 5. many jobs, several nodes killed ---------------------------------------------------------------------
@pytest.mark.timeout(480)
def test_fifty_jobs_with_two_nodes_killed_each_recovers_or_waits(cluster: Cluster, namespace: str) -> None:
    """49 one-worker jobs and one job that needs 3 of the 4 GPU nodes; two of its nodes die. Every small
    job that had its worker there runs again on a live node, every other one is untouched, and the big one
    waits below its minimum until a node returns, then starts once."""
    small = [f"s{i:02d}" for i in range(49)]
    gpu = job_manifest("gpu", namespace, replicas=3, min_replicas=3, badNodeSeconds=0)  # returning nodes count
    cluster.apply([tiny_job(n, namespace) for n in small] + [gpu])
    t0 = time.monotonic()

    def all_running() -> bool:
        now = job_statuses(cluster, namespace)
        return len(now) == 50 and all(st.get("phase") == c.RUNNING for st in now.values())

    wait_for(all_running, 240, "all 50 jobs running", interval=1)
    print(f"\n50 jobs submitted -> all running: {time.monotonic() - t0:.1f}s")
    gpu_pods = running_attempt(cluster, namespace, "gpu", 1, 3)
    pods = core(cluster).list_namespaced_pod(namespace, label_selector=c.LABEL_JOB).items
    placed = {p.metadata.labels[c.LABEL_JOB]: p.spec.node_name for p in pods
              if p.metadata.labels[c.LABEL_JOB] in small}
    assert sorted(placed) == small, sorted(placed)
    dead = sorted({node_of(gpu_pods, "0"), node_of(gpu_pods, "1")})
    hit = sorted(n for n, node in placed.items() if node in dead)
    t0 = time.monotonic()
    for node in dead:
        cluster.kill_node(node)

    def settled() -> dict[str, dict[str, Any]] | None:
        now = job_statuses(cluster, namespace)
        if now["gpu"].get("phase") != c.WAITING_FOR_CAPACITY:
            return None
        if any(now[n].get("phase") != c.RUNNING or now[n].get("attempt", 0) < 2 for n in hit):
            return None
        live = core(cluster).list_namespaced_pod(namespace, label_selector=c.LABEL_JOB).items
        ok = all(p.spec.node_name not in dead and p.status.phase == "Running" for p in live)
        return now if ok else None

    final = wait_for(settled, 180, "every hit job running again on a live node, the big job waiting", interval=1)
    twice = [n for n in hit if final[n]["attempt"] > 2]
    print(f"killed {dead}: {len(hit)} small jobs lost their worker; all relaunched and the big job waiting after "
          f"{time.monotonic() - t0:.1f}s")  # fmt: skip
    # the second node went quiet with the first: no relaunch lands on it before its loss is due
    assert not twice, {n: final[n]["attempt"] for n in twice}
    cond = {x["type"]: x for x in final["gpu"]["conditions"]}[c.COND_CAPACITY]
    assert cond["status"] == "False" and cond["reason"] == c.REASON_BELOW_MIN
    for n in small:
        st = final[n]
        if n not in hit:
            assert st["attempt"] == 1, (n, st)  # an untouched job never restarts
        assert st["restarts"]["infrastructure"] == st["attempt"] - 1, (n, st)
        assert st["restarts"]["application"] == 0, (n, st["restarts"])
        assert_consistent_status(st)
    for n in hit:
        assert_single_attempt(cluster, namespace, n, final[n]["attempt"], 1)
    # capacity returns: the waiting job starts again, exactly once
    cluster.restore_node(dead[0])
    running_attempt(cluster, namespace, "gpu", 2, 3, timeout=150)
    assert_consistent_status(job_status(cluster, namespace, "gpu"))


# ---- 8. retention when a node dies during a save -----------------------------------------------------------
@pytest.mark.timeout(300)
def test_node_killed_during_saves_never_costs_newest_complete_or_resume_source(tmp_path: Path) -> None:
    """The real trainer (tiny_gpt, 2 ranks, gloo) saving every step with keep-last 1, all its processes
    SIGKILLed at once (the node dies) while saves are in flight, twice: the second run resumes from
    the first's checkpoint. Run as local processes, not pods: the same code and files, without the
    per-pod start-up that would not fit this suite's time on a 2-core machine."""
    import threading

    from resilient_contract import storage
    from tests.trainer.harness import SMALL_MODEL, Launcher, parse

    root = tmp_path / "ckpt"
    store = storage.LocalStore(str(root))
    common = [*SMALL_MODEL, "--global-batch", "8", "--micro-batch", "2", "--steps", "100000",
              "--checkpoint-every", "1", "--keep-last", "1", "--collective-timeout", "20",
              "--checkpoint-root", str(root)]  # fmt: skip
    seen: list[int] = []  # newest complete step observed while the run was alive
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                latest = storage.scan(store, storage.UNBOUNDED_SCAN).latest
            except OSError:
                latest = None
            if latest and (not seen or latest.step > seen[-1]):
                seen.append(latest.step)
            time.sleep(0.02)

    launcher = Launcher(tmp_path)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = launcher.start(2, common)
        wait_for(lambda: len(parse(run.output(0), "RTJ_CHECKPOINT")) >= 4, 180, "four saves", interval=0.1)
        run.kill()  # every rank at once, mid-save (it saves every step)
        time.sleep(0.2)  # let the watcher take one more look
        first = storage.scan(store, storage.UNBOUNDED_SCAN).latest
        assert first is not None and seen and first.step >= seen[-1], (seen, first)
        print(f"\nrun 1 killed: newest complete seen {seen[-1]}, on disk {first.step}, dirs {storage.step_dirs(store)}")

        resume = first.path
        run = launcher.start(2, [*common, "--resume-from", resume])
        wait_for(lambda: parse(run.output(0), "RTJ_RESUMED") and len(parse(run.output(0), "RTJ_CHECKPOINT")) >= 4,
                 180, "resumed and four more saves", interval=0.1)  # fmt: skip
        assert parse(run.output(0), "RTJ_RESUMED")[0]["from"] == resume
        for _ in range(3):  # and while it keeps saving: the resume source is never deleted
            assert storage.check_step(store, Path(resume).name).complete
            time.sleep(0.3)
        run.kill()
        time.sleep(0.2)
        second = storage.scan(store, storage.UNBOUNDED_SCAN).latest
        assert second is not None and second.step >= seen[-1] > first.step, (seen, second)
        assert storage.check_step(store, Path(resume).name).complete, "the resume source was deleted"
        print(f"run 2 killed: newest complete seen {seen[-1]}, on disk {second.step}, dirs {storage.step_dirs(store)}")
    finally:
        stop.set()
        launcher.cleanup()


# ---- 6. a node whose clock is wrong -----------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_skewed_node_clock_is_neither_lost_nor_immortal(cluster: Cluster, namespace: str) -> None:
    """One node writes renewTimes 60 s in the past, then 60 s in the future, while alive: no restart (the
    operator times renewals by its own clock). Then it dies: exactly one restart, within the timeout."""
    name = "skew"
    timeout = 10
    apply(cluster, job_manifest(name, namespace, replicas=2, min_replicas=1, nodeLossTimeoutSeconds=timeout))
    pods = running_attempt(cluster, namespace, name, 1, 2)
    node = node_of(pods, "1")
    skew = cluster.nodes[node].dir / "clock_skew_s"
    try:
        for seconds in (-60, 60):
            skew.write_text(str(seconds))
            time.sleep(timeout + 3)  # a window for a spurious loss to show (a renewTime 60 s old looks dead)
            status = job_status(cluster, namespace, name)
            assert status["attempt"] == 1 and status["restarts"]["infrastructure"] == 0, (seconds, status)
        t0 = time.monotonic()
        cluster.kill_node(node)  # its last renewTime claims it is alive for another 60 s
        status = wait_for(lambda: (s := job_status(cluster, namespace, name))["restarts"]["infrastructure"] >= 1
                          and s, timeout + 30, "the loss recorded")  # fmt: skip
        detected = time.monotonic() - t0
    finally:
        skew.unlink(missing_ok=True)
    print(f"\nskewed node {node} killed; loss recorded after {detected:.1f}s (timeout {timeout}s)")
    assert status["lastFailure"]["node"] == node
    assert detected <= timeout + 5, detected
    running_attempt(cluster, namespace, name, 2, 2, timeout=120)  # three pool nodes are left
    status = job_status(cluster, namespace, name)
    assert status["attempt"] == 2 and status["restarts"]["infrastructure"] == 1, status["restarts"]


# ---- 7. the operator's caches after time away ---------------------------------------------------------------
@pytest.mark.timeout(120)
def test_informer_relist_reports_what_was_deleted_while_it_was_not_watching(cluster: Cluster, namespace: str) -> None:
    """kopf replays objects after a re-list but cannot say what vanished; our informer's re-list can."""
    from kubernetes import client

    from resilient_operator.informer import Informer

    api = client.CoreV1Api(cluster.api_client())
    events_seen: list[tuple[str, str]] = []
    inf = Informer("test-pods", lambda **kw: api.list_namespaced_pod(namespace, **kw), label_selector=c.LABEL_JOB,
                   handler=lambda t, old, new: events_seen.append((t, (new or old or {})["metadata"]["name"])))
    for name in ("a", "b"):  # never scheduled (no such node label): plain objects for the cache
        api.create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": {c.LABEL_JOB: "x"}}, "spec": {
            "nodeSelector": {"nowhere": "x"}, "containers": [{"name": "c", "image": "busybox"}]}})
    inf.relist()  # as at start-up; the watch is not running (the informer is "away")
    assert {k[1] for k in inf._store} == {"a", "b"} and sorted(events_seen) == [("ADDED", "a"), ("ADDED", "b")]
    api.delete_namespaced_pod("a", namespace, grace_period_seconds=0)
    wait_for(lambda: len(api.list_namespaced_pod(namespace, label_selector=c.LABEL_JOB).items) == 1, 30, "a gone")
    events_seen.clear()
    inf.relist()  # as after a 410 or an API-server restart
    assert inf.get((namespace, "a")) is None and inf.get((namespace, "b")) is not None
    # "b" may come back MODIFIED (the scheduler writes its Unschedulable condition at any time); nothing else may
    assert [e for e in events_seen if e != ("MODIFIED", "b")] == [("DELETED", "a")], events_seen
