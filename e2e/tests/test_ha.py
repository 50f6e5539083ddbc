"""High availability (issue 28): two operator replicas behind a Lease; a recovery in flight survives the loss
of the leader.

The session's operator runs the chart's default: 2 replicas, lease 15 s / renew deadline 10 s / retry 2 s.
The leader is found from the Lease's holderIdentity (e2e.support.operator_pod). Stages are made
deterministic as in test_chaos: the leader is frozen (SIGSTOP) at the stage, so it can neither finish nor
renew; the standby takes the Lease once it has seen it unchanged for the lease duration; then the frozen
process is SIGKILLed (its container restarts as a standby, the Lease naming the other pod) or thawed (it
must write nothing and exit). Each replica writes under its own field manager (its pod name, from its
user agent), so managedFields say which replica wrote a job's status or created a pod, and when.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from e2e.localcluster.cluster import Cluster, wait_for
from e2e.support import (
    CHART,
    HOST_DIR,
    MOUNT,
    OPERATOR_NS,
    RELEASE,
    apply,
    assert_single_attempt,
    core,
    custom,
    events,
    job_manifest,
    job_pods,
    job_status,
    leader_name,
    make_checkpoint,
    metric_samples,
    node_of,
    operator_metrics,
    operator_pod,
    operator_pods,
    pod_pid,
    process_rss_bytes,
    running_attempt,
    standby_pods,
    wait_operator_ready,
    wait_phase,
)  # fmt: skip
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from e2e.tests.test_chaos import check_recovered, first_delete, gated_start, slow_stop_script
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]
LEASE_SECONDS = 15  # the chart's default, which the session installs
TAKEOVER = LEASE_SECONDS + 2 * 2 + 10  # lease + two retry periods + slack for a loaded 2-core machine


def two_replicas(cl: Cluster) -> tuple[Any, Any]:
    """Both replicas running, one leading: (leader pod, standby pod)."""
    wait_for(lambda: len(operator_pods(cl)) == 2, 120, "exactly two live operator pods (a rollout finished)")
    leader = wait_operator_ready(cl)
    standbys = wait_for(lambda: [p for p in standby_pods(cl) if p.status.phase == "Running" and pod_pid(p)], 120,
                        "a standby replica running")  # fmt: skip
    return leader, standbys[0]


def freeze_leader(cl: Cluster) -> tuple[str, int, datetime]:
    """SIGSTOP the leading process: (its pod's name, its pid, when)."""
    pod = wait_for(lambda: (p := operator_pod(cl)) is not None and pod_pid(p) is not None and p, 60, "the leader")
    pid = pod_pid(pod)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    return pod.metadata.name, pid, datetime.now(UTC)


def wait_taken_over(cl: Cluster, old: str, since: float) -> str:
    """Until the Lease names another pod; returns it (and says how long it took)."""
    new = wait_for(lambda: (n := leader_name(cl)) not in (None, old) and n, TAKEOVER,
                   f"a standby taking over from {old}")
    print(f"\nLease taken over by {new} {time.monotonic() - since:.1f}s after {old} froze")
    return str(new)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def written_by(obj: dict[str, Any] | Any, manager: str) -> list[datetime]:
    """When `manager` last wrote each part of an object (its managedFields entries)."""
    fields = obj["metadata"].get("managedFields") if isinstance(obj, dict) else obj.metadata.managed_fields
    out = []
    for entry in fields or []:
        name = entry["manager"] if isinstance(entry, dict) else entry.manager
        when = entry["time"] if isinstance(entry, dict) else entry.time
        if name == manager:
            out.append(when if isinstance(when, datetime) else datetime.fromisoformat(when.replace("Z", "+00:00")))
    return out


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---- 1. the standby: warm caches, no reconciles, no lists ---------------------------------------------------
@pytest.mark.timeout(300)
def test_the_standby_is_warm_idle_and_only_watches(cluster: Cluster, namespace: str) -> None:
    name = "idle"
    apply(cluster, job_manifest(name, namespace, replicas=2))
    running_attempt(cluster, namespace, name, 1, 2)
    leader, standby = two_replicas(cluster)
    lead, stand = operator_metrics(cluster, pod=leader), operator_metrics(cluster, pod=standby)
    assert metric_samples(lead, "rtj_leader") == {"rtj_leader": 1.0}
    assert metric_samples(stand, "rtj_leader") == {"rtj_leader": 0.0}
    assert sum(metric_samples(stand, "rtj_reconcile_seconds_count").values()) == 0
    assert sum(metric_samples(lead, "rtj_reconcile_seconds_count").values()) > 0
    # warm: every resource listed (once at its start; again only if the API server lost its watches, as the
    # session cluster's earlier tests restart it), and watched since: the job's events reach it
    lists0 = metric_samples(stand, "rtj_informer_lists_total")
    assert lists0 and all(v >= 1 for v in lists0.values()), lists0
    first_delete(cluster, namespace, name, 1)  # activity: the standby sees it, does nothing, lists nothing
    running_attempt(cluster, namespace, name, 2, 2)
    stand = operator_metrics(cluster, pod=standby)
    assert metric_samples(stand, "rtj_informer_lists_total") == lists0
    assert sum(metric_samples(stand, "rtj_reconcile_seconds_count").values()) == 0
    assert any("pods" in k for k in metric_samples(stand, "rtj_informer_events_total")), "standby caches not fed"
    pid = pod_pid(standby)
    assert pid is not None
    print(f"\nstandby RSS {process_rss_bytes(pid) / 2**20:.0f} MiB; leader RSS "
          f"{process_rss_bytes(pod_pid(leader) or 0) / 2**20:.0f} MiB")  # fmt: skip
    # nothing the standby wrote: the job's status and pods are the leader's
    job = custom(cluster).get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.PLURAL, name)
    assert not written_by(job, standby.metadata.name)
    assert all(not written_by(p, standby.metadata.name) for p in job_pods(cluster, namespace, name))


# ---- 2. the leader lost at each stage of a recovery ----------------------------------------------------------
@pytest.mark.timeout(720)
def test_leader_lost_at_each_stage_of_a_recovery_the_standby_finishes_it(cluster: Cluster, namespace: str) -> None:
    """Frozen at the stage, the Lease taken by the standby, then SIGKILLed: (a) right after detection (Restarting,
    the old pods still terminating), (b) after the fence, before the relaunch, (c) after the creates (Starting,
    the pods held by an init-container gate; one of them removed behind the operators' backs, as if the crash
    had come part-way through the creates). Each time: exactly one new attempt, the budget counted once."""
    name = "hastages"
    make_checkpoint(cluster.host_path(f"{HOST_DIR}/{namespace}/{name}"), step=7)
    gate = cluster.host_path(f"{HOST_DIR}/{namespace}-{name}.open")
    gate.touch()
    job = job_manifest(name, namespace, replicas=3, script=slow_stop_script(), badNodeSeconds=0)
    job["spec"]["template"]["spec"]["initContainers"] = [gated_start(f"{MOUNT}/{namespace}-{name}.open")]
    apply(cluster, job)
    running_attempt(cluster, namespace, name, 1, 3)
    leaders = []

    # (a) detected, the broken attempt's pods still stopping (3 s each): the leader freezes there
    two_replicas(cluster)
    first_delete(cluster, namespace, name, 1)
    wait_phase(cluster, namespace, name, c.RESTARTING, timeout=60)
    old, pid, _ = freeze_leader(cluster)
    t0 = time.monotonic()
    assert job_status(cluster, namespace, name)["phase"] == c.RESTARTING
    leaders.append(wait_taken_over(cluster, old, t0))
    kill(pid)
    check_recovered(cluster, namespace, name, 2, 3, 7)

    # (b) fenced, not relaunched: frozen at Restarting, the old pods gone while nobody leads
    two_replicas(cluster)
    first_delete(cluster, namespace, name, 2)
    wait_phase(cluster, namespace, name, c.RESTARTING, timeout=60)
    old, pid, _ = freeze_leader(cluster)
    t0 = time.monotonic()
    assert job_status(cluster, namespace, name)["phase"] == c.RESTARTING
    wait_for(lambda: not job_pods(cluster, namespace, name) or leader_name(cluster) != old, 60,
             "attempt 2 fenced while the leader is frozen")  # fmt: skip
    leaders.append(wait_taken_over(cluster, old, t0))
    kill(pid)
    check_recovered(cluster, namespace, name, 3, 3, 7)

    # (c) the new attempt's pods created and held Pending by the gate (Starting): frozen there
    two_replicas(cluster)
    gate.unlink()
    first_delete(cluster, namespace, name, 3)

    def starting_with_all_pods() -> list[Any] | None:
        st = job_status(cluster, namespace, name)
        new = [p for p in job_pods(cluster, namespace, name) if p.metadata.labels[c.LABEL_ATTEMPT] == "4"]
        return new if st.get("phase") == c.STARTING and st.get("attempt") == 4 and len(new) == 3 else None

    wait_for(starting_with_all_pods, 90, "attempt 4 Starting with its 3 pods created (held by the gate)")
    old, pid, _ = freeze_leader(cluster)
    t0 = time.monotonic()
    new = starting_with_all_pods()
    assert new, "attempt 4 left Starting while its pods were held"
    uid = new[0].metadata.uid
    core(cluster).delete_namespaced_pod(new[0].metadata.name, namespace, grace_period_seconds=0)
    wait_for(lambda: uid not in {p.metadata.uid for p in job_pods(cluster, namespace, name)}, 30, "a rank gone")
    leaders.append(wait_taken_over(cluster, old, t0))
    kill(pid)
    gate.touch()
    status = check_recovered(cluster, namespace, name, 4, 3, 7)
    assert [h["attempt"] for h in status["history"]] == [1, 2, 3, 4]
    assert status["restarts"] == {"infrastructure": 3, "application": 0, "planned": 0}
    started = [e for e in events(cluster, namespace, name) if e.startswith(c.REASON_STARTED)]
    assert len(started) == 4, started
    # and both replicas are back: the killed one restarted as a standby
    two_replicas(cluster)
    print(f"leaders after each stage: {leaders}")


# ---- 3. the leader frozen past its lease: the standby recovers, the old leader thaws and writes nothing ----
@pytest.mark.timeout(420)
def test_frozen_leader_is_replaced_and_when_it_thaws_writes_nothing_and_exits(cluster: Cluster,
                                                                              namespace: str) -> None:  # fmt: skip
    name = "thaw"
    apply(cluster, job_manifest(name, namespace, replicas=3, script=slow_stop_script()))
    running_attempt(cluster, namespace, name, 1, 3)
    two_replicas(cluster)
    old, pid, frozen_at = freeze_leader(cluster)
    t0 = time.monotonic()
    first_delete(cluster, namespace, name, 1)  # the failure lands while the leader is frozen
    new = wait_taken_over(cluster, old, t0)
    pods = running_attempt(cluster, namespace, name, 2, 3, timeout=150)
    recovered = time.monotonic() - t0
    before = job_status(cluster, namespace, name)
    assert before["attempt"] == 2 and before["restarts"]["infrastructure"] == 1
    job = custom(cluster).get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.PLURAL, name)
    assert written_by(job, new), "the new leader wrote the status"
    assert all(written_by(p, new) for p in pods), "the new leader created the pods"

    os.kill(pid, signal.SIGCONT)  # the old leader thaws, its clock past the renew deadline
    wait_for(lambda: not process_alive(pid), 60, "the thawed leader exiting")
    print(f"\nrecovered by {new} {recovered:.1f}s after the freeze; {old} thawed and exited")
    wait_for(lambda: (p := next((q for q in operator_pods(cluster) if q.metadata.name == old), None)) is not None
             and pod_pid(p) not in (None, pid), 90, "the old leader's container restarted (as a standby)")  # fmt: skip
    assert leader_name(cluster) == new
    # it wrote nothing after the freeze: not the status, not a pod, not an event
    job = custom(cluster).get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.PLURAL, name)
    stale = [t for t in written_by(job, old) if t > frozen_at]
    assert not stale, f"{old} wrote the job after it froze: {stale}"
    for pod in job_pods(cluster, namespace, name):
        assert not [t for t in written_by(pod, old) if t > frozen_at], pod.metadata.name
    evs = core(cluster).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    late = [e.reason for e in evs if e.reporting_instance == old and e.metadata.creation_timestamp > frozen_at]
    assert not late, late
    assert_single_attempt(cluster, namespace, name, 2, 3)
    after = job_status(cluster, namespace, name)
    assert after["attempt"] == 2 and after["restarts"] == before["restarts"] and after["history"] == before["history"]
    two_replicas(cluster)


# ---- 4. helm upgrade while a job recovers -------------------------------------------------------------------
@pytest.mark.timeout(480)
def test_helm_upgrade_while_a_job_recovers(cluster: Cluster, namespace: str) -> None:
    """A new ReplicaSet rolls out (maxUnavailable 0: a new pod is Ready before an old one stops; the stopping
    leader releases the Lease) while the job is between its failure and its relaunch: one new attempt, the
    budget counted once, and the new pods lead afterwards."""
    import json

    name = "upgrade"
    make_checkpoint(cluster.host_path(f"{HOST_DIR}/{namespace}/{name}"), step=7)
    apply(cluster, job_manifest(name, namespace, replicas=3, script=slow_stop_script(), badNodeSeconds=0))
    running_attempt(cluster, namespace, name, 1, 3)
    old = {p.metadata.name for p in two_replicas(cluster)}
    revision = json.loads(cluster.helm("status", RELEASE, "--namespace", OPERATOR_NS, "-o", "json").stdout)["version"]
    first_delete(cluster, namespace, name, 1)
    wait_phase(cluster, namespace, name, c.RESTARTING, timeout=60)
    t0 = time.monotonic()
    try:
        cluster.helm("upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--reuse-values", "--wait",
                     "--timeout", "180s", "--set", f"podAnnotations.rollout=r{revision}", timeout=240)  # fmt: skip
        print(f"\nrolled out in {time.monotonic() - t0:.1f}s")
        check_recovered(cluster, namespace, name, 2, 3, 7)
        leader, standby = two_replicas(cluster)
        assert not old & {leader.metadata.name, standby.metadata.name}, "the old pods still run"
        status = job_status(cluster, namespace, name)
        assert status["restarts"] == {"infrastructure": 1, "application": 0, "planned": 0}
        started = [e for e in events(cluster, namespace, name) if e.startswith(c.REASON_STARTED)]
        assert len(started) == 2, started
    finally:
        cluster.helm("rollback", RELEASE, str(revision), "--namespace", OPERATOR_NS, "--wait", "--timeout", "180s",
                     timeout=240)  # fmt: skip
    two_replicas(cluster)


# ---- 5. a node lost while the leader is down -----------------------------------------------------------------
@pytest.mark.timeout(420)
def test_node_lost_while_the_leader_is_down_the_job_recovers_once_and_succeeds(cluster: Cluster,
                                                                                namespace: str) -> None:  # fmt: skip
    """The leader freezes, then a worker's node dies; the standby takes the Lease (its node-Lease clock has run
    all along, so the loss is due at once), the frozen leader is SIGKILLed; one restart, on the three nodes
    left, from the checkpoint; the job then completes."""
    name = "nodeloss"
    flag = f"{MOUNT}/{namespace}-{name}.done"
    make_checkpoint(cluster.host_path(f"{HOST_DIR}/{namespace}/{name}"), step=7)
    apply(cluster, job_manifest(name, namespace, replicas=3, script=slow_stop_script(flag)))
    pods = running_attempt(cluster, namespace, name, 1, 3)
    two_replicas(cluster)
    old, pid, _ = freeze_leader(cluster)
    t0 = time.monotonic()
    dead = node_of(pods, "1")
    cluster.kill_node(dead)
    wait_taken_over(cluster, old, t0)
    kill(pid)
    status = check_recovered(cluster, namespace, name, 2, 3, 7)
    print(f"node {dead} lost with the leader frozen: attempt 2 running {time.monotonic() - t0:.1f}s after")
    assert status["lastFailure"]["node"] == dead
    assert all(p.spec.node_name != dead for p in job_pods(cluster, namespace, name))
    cluster.host_path(f"{HOST_DIR}/{namespace}-{name}.done").touch()
    final = wait_phase(cluster, namespace, name, c.SUCCEEDED, timeout=90)
    assert final["attempt"] == 2 and final["restarts"] == {"infrastructure": 1, "application": 0, "planned": 0}
    two_replicas(cluster)
