"""restartStrategy InPlace on a real control plane: a node loss keeps the surviving pods (same pods, same
uids), their agents take the operator's signed plan, the job resumes smaller from the newest complete
checkpoint without a single new pod, grows back in place when the node returns (one new pod) and ends with
the right model; pods with no agent are replaced at once;
a plan the operator did not sign is refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from e2e import scenarios, support
from e2e.cluster import ClusterLike, HasNetns, wait_for
from e2e.support import events, get_job, job_pods, node_of, running_attempt, wait_phase
from resilient_contract import lineage, storage
from resilient_contract import plan as agent_plan
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]
IN_PLACE = {"restartStrategy": c.RestartStrategy.IN_PLACE.value}


@pytest.mark.timeout(600)
def test_node_loss_then_grow_back_in_place_keep_the_survivors_and_end_with_the_right_model(
    cluster: ClusterLike, job_ns: str, reference: dict[str, Any]
) -> None:
    """4 -> 3 in place after a node loss (no pod created), then the node returns and the job grows back to 4 in
    place at its next checkpoint: the same 3 pods carry on and exactly one pod is created, for rank 3."""
    import torch

    ns, name = job_ns, "inplace"
    # badNodeSeconds=0: the returning node is the capacity the grow-back is about (bad-node memory has its own
    # tests); saves every 3 steps and 0.8 s steps leave the grow-back a checkpoint to happen at
    job = scenarios.submit_example(cluster, ns, name, steps=scenarios.STEPS, checkpoint_every=3, step_delay=0.8,
                                   badNodeSeconds=0, **IN_PLACE)
    pods = running_attempt(cluster, ns, name, 1, 4, timeout=180)
    uids = {p.metadata.name: p.metadata.uid for p in pods}
    scenarios.first_complete_checkpoint(cluster, job)
    refuses_a_forged_plan(cluster, ns, name, pods)  # the same job: a second training job would cost a minute
    lost_node = node_of(pods, "1")
    lost_pod = next(p.metadata.name for p in pods if p.spec.node_name == lost_node)
    timeline = scenarios.kill_and_time(cluster, ns, name, lost_node)
    print(f"\nin-place recovery timeline after killing {lost_node}: {timeline.row()}")
    assert timeline.attempt == 2 and timeline.replicas == 3

    status = get_job(cluster, ns, name)["status"]
    entry = next(e for e in status["history"] if e["attempt"] == 2)
    kept = sorted(set(uids) - {lost_pod})
    assert entry["restart"] == "InPlace" and entry["kept"] == kept, entry
    now = running_attempt(cluster, ns, name, 2, 3)
    # the same pods (same uids), relabelled: not one pod was created for the recovery
    assert {p.metadata.name: p.metadata.uid for p in now} == {n: uids[n] for n in kept}
    assert sorted(p.metadata.labels[c.LABEL_RANK] for p in now) == ["0", "1", "2"]

    cluster.restore_node(lost_node)
    grown = running_attempt(cluster, ns, name, 3, 4, timeout=180)
    entry = next(e for e in get_job(cluster, ns, name)["status"]["history"] if e["attempt"] == 3)
    assert entry["restart"] == "InPlace" and entry["kept"] == kept and entry["replaced"] == [], entry
    created = {p.metadata.name: p.metadata.labels[c.LABEL_RANK] for p in grown if p.metadata.name not in uids}
    assert list(created.values()) == ["3"], created  # the one new pod takes the new rank
    assert {p.metadata.name: p.metadata.uid for p in grown if p.metadata.name in uids} == {n: uids[n] for n in kept}

    final = wait_phase(cluster, ns, name, c.SUCCEEDED, 300)
    assert final["restarts"]["infrastructure"] == 1 and final["restarts"]["planned"] == 1
    rank0 = next(p.metadata.name for p in job_pods(cluster, ns, name) if p.metadata.labels[c.LABEL_RANK] == "0")
    result = scenarios.result_line(scenarios.trainer_log(cluster, ns, rank0))
    assert result and result["step"] == str(scenarios.STEPS) and result["world_size"] == "4"
    state = torch.load(scenarios.host_root(cluster, job).with_suffix(".pt"), weights_only=False)
    diff = scenarios.relative_difference(reference["model"], state["model"])
    print(f"final model vs failure-free reference: relative difference {diff:.2e}")
    assert diff <= scenarios.TOLERANCE
    assert any("in place (kept 3 pods" in e for e in events(cluster, ns, name))


@pytest.mark.timeout(600)
def test_a_partitioned_pod_is_replaced_never_reused_and_the_lineage_stays_clean(
    cluster: ClusterLike, job_ns: str, reference: dict[str, Any]
) -> None:
    """A partition in place: rank 1's node stops reporting but its container runs on (its kubelet is frozen).
    Its pod is on a lost node, so it is never kept: the survivor (same uid) takes the plan and rank 1 gets a
    new pod elsewhere. The cut-off worker is still alive when the survivor's agent stops the old workers, so
    the whole old gang sees the stop (the preemption flag rides the step's all-reduce) and may save on its way
    out; whatever it wrote, the newest complete checkpoint at the end is the new lineage's and the model is
    right."""
    import torch

    ns, name = job_ns, "cutoff"
    job = scenarios.submit_example(cluster, ns, name, replicas=2, min_replicas=1, steps=scenarios.STEPS,
                                   checkpoint_every=3, step_delay=0.8, **IN_PLACE)
    pods = running_attempt(cluster, ns, name, 1, 2, timeout=180)
    uid = get_job(cluster, ns, name)["metadata"]["uid"]
    scenarios.first_complete_checkpoint(cluster, job)
    node = node_of(pods, "1")
    cut_off = next(p.metadata.name for p in pods if p.spec.node_name == node)
    survivor = next(p for p in pods if p.metadata.name != cut_off)
    support.pause_node_agent(cluster, node)
    now = running_attempt(cluster, ns, name, 2, 2, timeout=120)
    by_name = {p.metadata.name: p for p in now}
    assert cut_off not in by_name and node not in {p.spec.node_name for p in now}  # replaced, never reused
    assert by_name[survivor.metadata.name].metadata.uid == survivor.metadata.uid
    entry = next(e for e in get_job(cluster, ns, name)["status"]["history"] if e["attempt"] == 2)
    assert entry["restart"] == "InPlace" and entry["kept"] == [survivor.metadata.name], entry

    final = wait_phase(cluster, ns, name, c.SUCCEEDED, 300)
    assert final["attempt"] == 2, final["history"]
    root = scenarios.host_root(cluster, job)
    latest = storage.discover(str(root), job=uid).latest
    assert latest is not None
    writer = lineage.parse_writer((Path(latest.path) / lineage.WRITER_FILE).read_bytes())
    assert writer == (uid, 2), (latest, writer)
    state = torch.load(root.with_suffix(".pt"), weights_only=False)
    diff = scenarios.relative_difference(reference["model"], state["model"])
    print(f"\nin place after a partition: final model vs reference {diff:.2e}")
    assert diff <= scenarios.TOLERANCE


@pytest.mark.timeout(300)
def test_pods_without_an_agent_are_replaced_as_soon_as_the_plan_finds_no_one(cluster: ClusterLike,
                                                                             job_ns: str) -> None:
    """restartStrategy left to the CRD's default (InPlace) on pods that run no agent (a plain shell): the plans
    find nothing listening, so the next pass replaces the kept pods at once (not after the 20 s bound), says
    why, and the job runs again on new pods."""
    ns, name = job_ns, "silent"
    manifest = support.job_manifest(name, ns, replicas=3, min_replicas=2)
    del manifest["spec"]["restartStrategy"]
    cluster.apply(manifest)
    assert get_job(cluster, ns, name)["spec"]["restartStrategy"] == c.RestartStrategy.IN_PLACE
    pods = running_attempt(cluster, ns, name, 1, 3, timeout=120)
    cluster.kill_node(node_of(pods, "2"))

    def fallback() -> str | None:
        return next((e for e in events(cluster, ns, name) if e.startswith(c.REASON_IN_PLACE_FALLBACK)), None)

    message = wait_for(fallback, 90, "the in-place fallback event")
    assert "nothing listens on the agent port" in message and "within" not in message, message
    now = running_attempt(cluster, ns, name, 2, 3, timeout=120)  # 3 of the 4 pool nodes are left
    assert all(p.metadata.name.startswith(f"{name}-a2-") for p in now)  # new pods for every rank
    entry = next(e for e in get_job(cluster, ns, name)["status"]["history"] if e["attempt"] == 2)
    assert entry["restart"] == "InPlace" and entry["kept"] == [] and entry.get("fallback"), entry


def refuses_a_forged_plan(cluster: ClusterLike, ns: str, name: str, pods: list[Any]) -> None:
    """An impostor with the job's labels and a key of its own tells an agent to restart: 403, nothing moves."""
    target = pods[0]
    forged = agent_plan.Plan(job_uid=get_job(cluster, ns, name)["metadata"]["uid"], pod_uid=target.metadata.uid,
                             attempt=9, nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                             resume_from="")
    body = agent_plan.sign(forged, agent_plan.new_private_key())
    url = f"http://{target.status.pod_ip}:{agent_plan.DEFAULT_AGENT_PORT}{agent_plan.PATH}"

    def post() -> int:
        request = urllib.request.Request(url, data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def reach(fn: Any) -> Any:  # pod addresses live in the cluster's network namespace
        return cluster.in_netns(fn, timeout=15) if isinstance(cluster, HasNetns) else fn()

    assert reach(post) == 403
    health = f"http://{target.status.pod_ip}:{agent_plan.DEFAULT_AGENT_PORT}/healthz"

    def running_attempt_of_agent() -> int:
        with urllib.request.urlopen(health, timeout=5) as answer:
            return int(json.loads(answer.read())["attempt"])

    assert reach(running_attempt_of_agent) == 1
    assert get_job(cluster, ns, name)["status"]["attempt"] == 1
    assert {p.metadata.uid for p in running_attempt(cluster, ns, name, 1, 4)} == {p.metadata.uid for p in pods}
