"""The e2e lane on real nodes: real kubelets and containerd run the images built from our Dockerfiles.

One module-scoped cluster (e2e/realnodes/lane.py): three training nodes (w0..w2, one fake GPU each, the CPU
trainer image) and an `infra` node where the Helm chart runs the operator from its image as its pod. Every
namespace enforces Pod Security "restricted". What the process substrate cannot show is asserted here:
the operator really runs non-root on a read-only root filesystem, the kubelet refuses a root image under
runAsNonRoot, the trainer's limits are in its pod's cgroups, a killed machine's job restarts smaller from
the right checkpoint with the right model, and a partitioned node's gang (kubelet stopped, containers
alive) keeps training but can never commit a checkpoint after the fence.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import scenarios
from e2e.cluster import wait_for
from e2e.realnodes import lane as lanes
from e2e.support import (
    MOUNT,
    OPERATOR_NS,
    events,
    get_job,
    injected_env,
    job_pods,
    node_of,
    operator_pod,
    running_attempt,
    wait_phase,
)
from resilient_contract import environment, lineage, storage
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster,
              pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (namespaces, cgroups, containerd)")]
REAL_NODES = True  # e2e/pytest_plugin.py builds the node binaries and images at collection
IMAGES = ("operator", "trainer-cpu")  # ... and these images from our Dockerfiles (e2e/images.py)
STEPS, TOLERANCE = scenarios.STEPS, scenarios.TOLERANCE


@pytest.fixture(scope="module")
def lane(request: pytest.FixtureRequest) -> Iterator[lanes.Lane]:
    """The lane's cluster, kept (logs) when a test failed or RTJ_KEEP_CLUSTER is set."""
    started = time.monotonic()
    lane = lanes.start("lane")
    lane.timings["setup total"] = round(time.monotonic() - started, 1)
    try:
        yield lane
    finally:
        lane.stop()
        print(f"\n[lane] timings (s): {json.dumps(lane.timings)}")
        failed = request.session.testsfailed or os.environ.get("RTJ_KEEP_CLUSTER")
        if failed:
            print(f"[lane] logs kept in {lane.cluster.dir} (nodes/*/logs, nodes/*/machine/var-log/pods)")
        else:
            shutil.rmtree(lane.cluster.dir, ignore_errors=True)


@pytest.fixture
def ns(lane: lanes.Lane, request: pytest.FixtureRequest) -> Iterator[str]:
    with lanes.job_namespace(lane, "t-" + lanes.safe_name(request.node.name)) as name:
        yield name


def submit(lane: lanes.Lane, ns: str, name: str, **kw: Any) -> dict[str, Any]:
    """The example job (its cpu/memory limits kept), dumping its final state beside its checkpoint root."""
    scenarios.shared_claim(lane.cluster, ns)
    kw.setdefault("steps", STEPS)
    extra = (*kw.pop("extra_args", ()), f"--dump-state={MOUNT}/{ns}/{name}.pt")
    job = lanes.lane_job(name, ns, extra_args=extra, **kw)
    lane.cluster.apply(job)
    return job


def exec_in(lane: lanes.Lane, ns: str, pod: str, *cmd: str) -> Any:
    return lane.cluster.kubectl("exec", "-n", ns, pod, "--", *cmd, check=False)


def proc_status(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


@pytest.mark.timeout(1500)  # the first test pays for the module's cluster: nodes, image imports, helm install
def test_operator_runs_from_its_image_non_root_read_only_under_restricted(lane: lanes.Lane, ns: str) -> None:
    cl = lane.cluster
    pod = operator_pod(cl)
    assert pod is not None and pod.spec.node_name == lanes.INFRA
    assert pod.spec.containers[0].image == lane.images["operator"].ref
    namespace = cl.get("namespace", OPERATOR_NS) or {}
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # From inside the running container, as the kernel sees it.
    assert lanes.operator_exec(cl, "id", "-u").stdout.strip() == "65532"
    # /var/tmp is world-writable (1777) in the image: only the read-only mount stops the write.
    write = lanes.operator_exec(cl, "sh", "-c", "echo x > /var/tmp/probe")
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    root_mount = next(line.split() for line in lanes.operator_exec(cl, "cat", "/proc/self/mountinfo").stdout
                      .splitlines() if line.split()[4] == "/")
    assert "ro" in root_mount[5].split(","), root_mount
    assert lanes.operator_exec(cl, "sh", "-c", "echo x > /tmp/probe").returncode == 0  # its emptyDir
    status = proc_status(lanes.operator_exec(cl, "cat", "/proc/1/status").stdout)
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2", status
    assert int(status["CapEff"], 16) == 0, status["CapEff"]
    # Admission refuses what restricted forbids; the kubelet refuses a root image under runAsNonRoot.
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged", "namespace": ns},
                  "spec": {"containers": [{"name": "c", "image": cl.images["busybox"],
                                           "securityContext": {"privileged": True}}]}}
    refused = cl.kubectl("apply", "-f", "-", input=json.dumps(privileged), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr, refused.stderr
    root_image = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root-image", "namespace": ns},
                  "spec": {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                           "containers": [{"name": "c", "image": cl.images["busybox"], "command": ["sleep", "60"],
                                           "securityContext": {"allowPrivilegeEscalation": False,
                                                               "capabilities": {"drop": ["ALL"]}}}]}}
    cl.apply(root_image)

    def kubelet_refused() -> str:
        got = cl.get("pod", "root-image", ns) or {}
        for st in got.get("status", {}).get("containerStatuses", []):
            waiting = st.get("state", {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerConfigError":
                return str(waiting.get("message", ""))
        return ""

    message = wait_for(kubelet_refused, 60, "the kubelet to refuse a root image under runAsNonRoot")
    assert "runAsNonRoot" in message and "root" in message, message


@pytest.mark.timeout(420)
def test_node_loss_with_the_trainer_image_restarts_smaller_with_the_right_model(
    lane: lanes.Lane, ns: str, reference: dict[str, Any]
) -> None:
    import torch

    cl, name = lane.cluster, "tiny"
    job = submit(lane, ns, name, replicas=3, min_replicas=2)
    t = time.monotonic()
    pods = running_attempt(cl, ns, name, 1, 3, timeout=180)
    lane.timings["job submit -> 3 workers Running"] = round(time.monotonic() - t, 1)
    assert_runs_confined_with_its_limits(lane, ns, pods[0].metadata.name)
    first = scenarios.first_complete_checkpoint(cl, job)
    timeline = scenarios.kill_and_time(cl, ns, name, node_of(pods, "1"))
    print(f"\nreal nodes: recovery timeline after killing {timeline.node}: {timeline.row()}")
    lane.timings.update({f"kill -> {s}": round(getattr(timeline, s), 2) for s in timeline.STAGES})

    status = get_job(cl, ns, name)["status"]
    assert status["lastFailure"]["node"] == timeline.node and status["lastFailure"]["reason"] == c.REASON_NODE_LOST
    assert (timeline.attempt, timeline.replicas) == (2, 2), timeline
    resumed = status["resumedFrom"]
    assert resumed["step"] >= first.step and resumed["step"] == timeline.resumed_step
    new = running_attempt(cl, ns, name, 2, 2)
    assert injected_env(new[0])[environment.RESUME_FROM] == resumed["path"]
    assert timeline.node not in {p.spec.node_name for p in new}
    final = wait_phase(cl, ns, name, c.SUCCEEDED, 240)
    assert final["restarts"]["infrastructure"] == 1 and final["restarts"]["application"] == 0
    rank0 = next(p.metadata.name for p in job_pods(cl, ns, name) if p.metadata.labels[c.LABEL_RANK] == "0")
    result = scenarios.result_line(scenarios.trainer_log(cl, ns, rank0))
    assert result and result["step"] == str(STEPS) and result["world_size"] == "2", result
    source = storage.check_step(storage.LocalStore(str(scenarios.host_root(cl, job))),
                               storage.step_dir_name(resumed["step"]))
    assert source.complete, source
    state = torch.load(scenarios.host_root(cl, job).with_suffix(".pt"), weights_only=False)
    diff = scenarios.relative_difference(reference["model"], state["model"])
    print(f"final model vs failure-free reference: relative difference {diff:.2e} (tolerance {TOLERANCE})")
    assert diff <= TOLERANCE
    assert any("restarted 3 -> 2 workers" in e for e in events(cl, ns, name))


@pytest.mark.timeout(1500)  # run alone, this test pays for the module's cluster (images, nodes, helm)
def test_node_loss_in_place_on_real_nodes_keeps_the_survivors_with_the_right_model(
    lane: lanes.Lane, ns: str, reference: dict[str, Any]
) -> None:
    """restartStrategy InPlace on real kubelets and containers: the surviving pods (same uids) take the
    operator's signed plan over the pod network, no pod is created, and the model is right."""
    import torch

    cl, name = lane.cluster, "inplace"
    job = submit(lane, ns, name, replicas=3, min_replicas=2, restartStrategy=c.RestartStrategy.IN_PLACE.value)
    pods = running_attempt(cl, ns, name, 1, 3, timeout=180)
    uids = {p.metadata.name: p.metadata.uid for p in pods}
    scenarios.first_complete_checkpoint(cl, job)
    timeline = scenarios.kill_and_time(cl, ns, name, node_of(pods, "1"))
    print(f"\nreal nodes, in place: recovery timeline after killing {timeline.node}: {timeline.row()}")
    lane.timings.update({f"in place: kill -> {s}": round(getattr(timeline, s), 2) for s in timeline.STAGES})
    assert (timeline.attempt, timeline.replicas) == (2, 2), timeline
    kept = running_attempt(cl, ns, name, 2, 2)
    assert {p.metadata.name: p.metadata.uid for p in kept} == {p.metadata.name: uids[p.metadata.name] for p in kept}
    entry = next(e for e in get_job(cl, ns, name)["status"]["history"] if e["attempt"] == 2)
    assert entry["restart"] == "InPlace" and len(entry["kept"]) == 2, entry
    final = wait_phase(cl, ns, name, c.SUCCEEDED, 240)
    assert final["restarts"]["infrastructure"] == 1
    state = torch.load(scenarios.host_root(cl, job).with_suffix(".pt"), weights_only=False)
    diff = scenarios.relative_difference(reference["model"], state["model"])
    print(f"final model vs failure-free reference: relative difference {diff:.2e} (tolerance {TOLERANCE})")
    assert diff <= TOLERANCE


def assert_runs_confined_with_its_limits(lane: lanes.Lane, ns: str, pod: str) -> None:
    """The trainer runs as its image's user, no new privileges, seccomp on; its limits are in its cgroups."""
    assert exec_in(lane, ns, pod, "id", "-u").stdout.strip() == "1000"
    status = proc_status(exec_in(lane, ns, pod, "cat", "/proc/1/status").stdout)
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2", status
    mem, cpu = lane.cluster.pod_cgroup(ns, pod, "memory"), lane.cluster.pod_cgroup(ns, pod, "cpu")
    assert mem is not None and cpu is not None, "no cgroup for the trainer pod"
    assert int((mem / "memory.limit_in_bytes").read_text()) == 2 * 2**30  # limits.memory 2Gi
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == int((cpu / "cpu.cfs_period_us").read_text())  # cpu 1
    node = lane.cluster.nodes[(lane.cluster.get("pod", pod, ns) or {})["spec"]["nodeName"]]
    assert node.cgroup.strip("/") in str(mem)  # under its node's cgroup root, not the host's


@pytest.mark.timeout(420)
def test_a_partitioned_gang_keeps_training_but_never_commits_after_the_fence(
    lane: lanes.Lane, ns: str, reference: dict[str, Any]
) -> None:
    """The kubelet is stopped (SIGSTOP), the containers keep running: the operator fences the old gang and
    relaunches elsewhere; the old gang's next save finds attempt 2's mark and is refused, a
    FencedGangWriting event names the node, and the lineage's newest checkpoint is attempt 2's."""

    cl, name = lane.cluster, "cutoff"
    job = submit(lane, ns, name, replicas=1, min_replicas=1, nprocPerNode=2, checkpoint_every=4, step_delay=1.5,
                 cpu="2")
    pods = running_attempt(cl, ns, name, 1, 1, timeout=180)
    uid = get_job(cl, ns, name)["metadata"]["uid"]
    root = scenarios.host_root(cl, job)
    scenarios.first_complete_checkpoint(cl, job)
    node = node_of(pods, "0")
    old_pids = cl.container_pids(ns, pods[0].metadata.name)
    t = time.monotonic()
    cl.partition_node(node)
    running_attempt(cl, ns, name, 2, 1, timeout=120)
    lane.timings["partition -> attempt 2 Running"] = round(time.monotonic() - t, 1)
    assert old_pids and all(Path(f"/proc/{p}").exists() for p in old_pids), "the cut-off gang died with its kubelet"
    wait_for((root / lineage.marker_name(uid, 2)).exists, 120, "attempt 2's fence mark")
    wait_for(lambda: any(root.glob(f"step-*/{lineage.REFUSED_FILE}")), 120, "a refused save of the old gang")
    _, diff = scenarios.fenced_gang_outcome(cl, ns, name, node, root, uid, reference["model"])
    print(f"\nafter a partitioned gang on real nodes: final model vs reference {diff:.2e}")
    assert diff <= TOLERANCE
