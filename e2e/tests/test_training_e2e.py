"""End to end: the real trainer loses nodes, shrinks, resumes from the right checkpoint, ends right.

Setup as a user does it: the operator installed with helm (session fixture), the example job from
examples/ applied with kubectl. The final model is compared with a failure-free reference run
(gathered full parameters; bitwise at equal world size, relative 1e-5 across world sizes, the
trainer's stated tolerance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e import scenarios, support
from e2e.cluster import ClusterLike, wait_for
from e2e.support import HOST_DIR, MOUNT, events, get_job, injected_env, job_pods, node_of, running_attempt, wait_phase
from resilient_contract import environment, lineage, storage
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]
STEPS, TOLERANCE = scenarios.STEPS, scenarios.TOLERANCE
relative_difference = scenarios.relative_difference


def submit(cluster: ClusterLike, ns: str, name: str, **kw: Any) -> dict[str, Any]:
    """The example job, dumping its final state beside its checkpoint root for comparison."""
    kw.setdefault("steps", STEPS)
    return scenarios.submit_example(cluster, ns, name, **kw)


@pytest.mark.timeout(600)
def test_node_loss_shrinks_resumes_and_ends_with_the_right_model(
    cluster: ClusterLike, job_ns: str, reference: dict[str, Any]
) -> None:
    import torch

    ns, name = job_ns, "tiny"
    job = submit(cluster, ns, name)
    pods = running_attempt(cluster, ns, name, 1, 4, timeout=180)
    first = scenarios.first_complete_checkpoint(cluster, job)
    timeline = scenarios.kill_and_time(cluster, ns, name, node_of(pods, "1"))
    print(f"\nrecovery timeline after killing {timeline.node}: {timeline.row()}")

    status = get_job(cluster, ns, name)["status"]
    failure = status["lastFailure"]
    assert failure["node"] == timeline.node and failure["reason"] == c.REASON_NODE_LOST
    assert timeline.detected <= job["spec"]["nodeLossTimeoutSeconds"] + 2
    assert timeline.attempt == 2 and timeline.replicas == 3
    # every pod of the broken attempt is gone, none left Terminating on the dead node
    assert all(p.metadata.labels[c.LABEL_ATTEMPT] == "2" for p in job_pods(cluster, ns, name))
    # status, the injected env and the trainer's log agree on the checkpoint resumed from
    resumed = status["resumedFrom"]
    assert resumed["step"] >= first.step and resumed["step"] == timeline.resumed_step
    new = running_attempt(cluster, ns, name, 2, 3)
    assert injected_env(new[0])[environment.RESUME_FROM] == resumed["path"]
    assert storage.parse_step_dir(Path(resumed["path"]).name) == resumed["step"]

    final = wait_phase(cluster, ns, name, c.SUCCEEDED, 300)
    assert final["restarts"]["infrastructure"] == 1 and final["restarts"]["application"] == 0
    rank0 = next(p.metadata.name for p in job_pods(cluster, ns, name) if p.metadata.labels[c.LABEL_RANK] == "0")
    result = scenarios.result_line(scenarios.trainer_log(cluster, ns, rank0))
    assert result and result["step"] == str(STEPS) and result["world_size"] == "3"
    state = torch.load(scenarios.host_root(cluster, job).with_suffix(".pt"), weights_only=False)
    diff = relative_difference(reference["model"], state["model"])
    print(f"final model vs failure-free reference: relative difference {diff:.2e} (tolerance {TOLERANCE})")
    assert diff <= TOLERANCE
    story = events(cluster, ns, name)
    assert any(e.startswith(c.REASON_NODE_LOST) and timeline.node in e for e in story), story
    assert any("restarted 4 -> 3 workers" in e for e in story), story
    # retention (spec.checkpoint.keep, injected) ran through the loss and never took the resume source
    store = storage.LocalStore(str(scenarios.host_root(cluster, job)))
    kept = [v for v in (storage.check_step(store, name) for _, name in storage.step_dirs(store)) if v.complete]
    source = storage.check_step(store, storage.step_dir_name(resumed["step"]))
    assert source.complete, source
    assert len(kept) <= job["spec"]["checkpoint"]["keep"] + 1, [v.path for v in kept]  # + the resume source


@pytest.mark.timeout(600)
def test_untrustworthy_checkpoints_are_never_injected(cluster: ClusterLike, job_ns: str) -> None:
    """A newer dir without .metadata and one with .metadata beside a truncated shard are skipped."""
    ns, name = job_ns, "planted"
    job = submit(cluster, ns, name, steps=200, step_delay=0.5)
    pods = running_attempt(cluster, ns, name, 1, 4, timeout=180)
    good = scenarios.first_complete_checkpoint(cluster, job)
    root = scenarios.host_root(cluster, job)
    partial = root / storage.step_dir_name(good.step + 1000)
    partial.mkdir()
    truncated = root / storage.step_dir_name(good.step + 2000)
    import shutil

    shutil.copytree(good.path, truncated)
    shard = sorted(truncated.glob("*.distcp"))[0]
    with shard.open("r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    cluster.kill_node(node_of(pods, "2"))
    new = running_attempt(cluster, ns, name, 2, 3, timeout=120)
    injected = injected_env(new[0])[environment.RESUME_FROM]
    assert Path(injected).name not in (partial.name, truncated.name)
    assert storage.parse_step_dir(Path(injected).name) >= good.step
    def skipped() -> list[str]:
        story = events(cluster, ns, name)
        return story if sum(e.startswith(c.REASON_CHECKPOINT_SKIPPED) for e in story) >= 2 else []

    story = wait_for(skipped, 30, "two CheckpointSkipped events")
    assert any("truncated" in e for e in story) and any("no .metadata" in e for e in story)


@pytest.mark.timeout(900)
def test_two_losses_then_capacity_returns_and_the_job_grows_back(
    cluster: ClusterLike, job_ns: str, reference: dict[str, Any]
) -> None:
    import torch

    ns, name = job_ns, "twice"
    # badNodeSeconds=0: the returning nodes are the capacity this test is about (bad-node memory would keep
    # the job off them for an hour; it has its own tests)
    job = submit(cluster, ns, name, steps=STEPS, checkpoint_every=3, step_delay=0.4, badNodeSeconds=0)
    pods = running_attempt(cluster, ns, name, 1, 4, timeout=180)
    scenarios.first_complete_checkpoint(cluster, job)
    first = scenarios.kill_and_time(cluster, ns, name, node_of(pods, "3"))
    assert (first.attempt, first.replicas) == (2, 3)
    second = scenarios.kill_and_time(cluster, ns, name, node_of(running_attempt(cluster, ns, name, 2, 3), "1"))
    print(f"\nfirst loss:  {first.row()}\nsecond loss: {second.row()}")
    assert (second.attempt, second.replicas) == (3, 2)
    assert second.resumed_step is not None and first.resumed_step is not None
    assert second.resumed_step >= first.resumed_step
    for node in (first.node, second.node):
        cluster.restore_node(node)
    grown = wait_phase(cluster, ns, name, c.SUCCEEDED, 600)
    history = grown["history"]
    assert [h["replicas"] for h in history][:3] == [4, 3, 2]
    assert history[-1]["replicas"] == 4, history  # grew back at a checkpoint once the nodes returned
    assert grown["restarts"]["infrastructure"] == 2 and grown["restarts"]["planned"] >= 1
    state = torch.load(scenarios.host_root(cluster, job).with_suffix(".pt"), weights_only=False)
    assert relative_difference(reference["model"], state["model"]) <= TOLERANCE


@pytest.mark.timeout(600)
def test_two_nodes_at_once_cost_one_restart(cluster: ClusterLike, job_ns: str) -> None:
    ns, name = job_ns, "pair"
    job = submit(cluster, ns, name, steps=200, step_delay=0.5)
    pods = running_attempt(cluster, ns, name, 1, 4, timeout=180)
    scenarios.first_complete_checkpoint(cluster, job)
    dead = {node_of(pods, "1"), node_of(pods, "2")}
    for node in dead:
        cluster.kill_node(node)
    new = running_attempt(cluster, ns, name, 2, 2, timeout=120)
    status = get_job(cluster, ns, name)["status"]
    # the second node's lease went stale while the first attempt was being fenced: still one restart
    assert status["restarts"]["infrastructure"] == 1 and status["attempt"] == 2
    assert not dead & {p.spec.node_name for p in new}


@pytest.mark.timeout(600)
def test_below_minimum_waits_with_a_condition_and_resumes_when_a_node_returns(
    cluster: ClusterLike, job_ns: str
) -> None:
    ns, name = job_ns, "short"
    job = submit(cluster, ns, name, steps=200, step_delay=0.5, min_replicas=3, badNodeSeconds=0)
    pods = running_attempt(cluster, ns, name, 1, 4, timeout=180)
    scenarios.first_complete_checkpoint(cluster, job)
    dead = [node_of(pods, "0"), node_of(pods, "3")]
    for node in dead:
        cluster.kill_node(node)
    waiting = wait_phase(cluster, ns, name, c.WAITING_FOR_CAPACITY, 60)
    cond = {x["type"]: x for x in waiting["conditions"]}[c.COND_CAPACITY]
    assert cond["status"] == "False" and cond["reason"] == c.REASON_BELOW_MIN
    assert "need at least 3 workers" in cond["message"]
    assert not job_pods(cluster, ns, name)  # nothing runs, nothing half-deleted
    cluster.restore_node(dead[0])
    running_attempt(cluster, ns, name, 2, 3, timeout=120)
    status = get_job(cluster, ns, name)["status"]
    assert status["restarts"]["infrastructure"] == 1


@pytest.mark.timeout(600)
def test_application_failure_spends_its_own_budget_then_fails(cluster: ClusterLike, job_ns: str) -> None:
    ns, name = job_ns, "buggy"
    failure = {"maxApplicationRestarts": 1, "applicationBackoffSeconds": 3, "maxInfrastructureRestarts": 5}
    scenarios.shared_claim(cluster, ns)
    crash = ("--fail-at-step=3", "--fail-rank=1", "--fail-exit-code=1")
    job = scenarios.example_job(name, ns, steps=20, extra_args=crash, failurePolicy=failure)
    cluster.apply(job)
    final = wait_phase(cluster, ns, name, c.FAILED, 400)
    assert final["restarts"] == {"infrastructure": 0, "application": 1, "planned": 0}
    assert final["lastFailure"]["kind"] == c.APPLICATION and final["lastFailure"]["exitCode"] == 1
    cond = {x["type"]: x for x in final["conditions"]}[c.COND_FAILED]
    assert cond["reason"] == c.REASON_APP_BUDGET and "checkpoints are kept" in cond["message"]
    history = final["history"]
    gap = (parse_time(history[1]["startTime"]) - parse_time(history[0]["endTime"])).total_seconds()
    assert gap >= failure["applicationBackoffSeconds"] - 1, history  # the backoff was observed


def parse_time(value: str) -> Any:
    from resilient_operator.core.timeutil import parse

    return parse(value)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("caught_before_commit", [True, False], ids=["rank0-held-before-commit", "gang-keeps-training"])
def test_a_cut_off_gang_never_corrupts_the_checkpoint_lineage(
    cluster: ClusterLike, job_ns: str, reference: dict[str, Any], caught_before_commit: bool
) -> None:
    """A partition, not a dead machine: the node's agent is frozen (no heartbeats, no kills), so the old gang
    (one pod, both ranks) keeps running after the operator fenced it and started attempt 2 elsewhere.

    rank0-held-before-commit: rank 0 is caught by a test hook between the shards and `.metadata` of a save;
    released after attempt 2 marked the root, it must not commit. gang-keeps-training: the old gang goes on
    training and saving. Either way the newest complete checkpoint is never the cut-off gang's after the
    fence, a FencedGangWriting event names the frozen node, and the job ends with the right model."""

    ns, name = job_ns, "cutoff"
    host = cluster.host_path(HOST_DIR)
    release = host / ns / f"{name}-release"
    release.parent.mkdir(parents=True, exist_ok=True)
    release.parent.chmod(0o1777)  # the namespace's area: the trainer (non-root) creates its root inside
    release.touch()  # no hold until the test removes it
    scenarios.shared_claim(cluster, ns)
    job = scenarios.example_job(name, ns, replicas=1, min_replicas=1, nprocPerNode=2, steps=STEPS,
                                checkpoint_every=4, step_delay=1.0 if caught_before_commit else 1.5,
                                extra_args=(f"--dump-state={MOUNT}/{ns}/{name}.pt",))
    if caught_before_commit:
        job["spec"]["template"]["spec"]["containers"][0].setdefault("env", []).append(
            {"name": "RTJ_TEST_HOLD_METADATA", "value": f"{MOUNT}/{ns}/{name}-release"})
    cluster.apply(job)
    pods = running_attempt(cluster, ns, name, 1, 1, timeout=180)
    uid = get_job(cluster, ns, name)["metadata"]["uid"]
    root = scenarios.host_root(cluster, job)
    first = scenarios.first_complete_checkpoint(cluster, job)
    node = node_of(pods, "0")
    if caught_before_commit:
        release.unlink()  # the next save's rank 0 holds before .metadata; wait until its shards are written

        def held() -> Path | None:
            for d in sorted(root.glob("step-*")):
                if storage.parse_step_dir(d.name) > first.step and list(d.glob("*.distcp")) and \
                        not (d / storage.METADATA_FILE).exists():
                    return d
            return None

        caught = wait_for(held, 60, "a save held before its .metadata")
    support.pause_node_agent(cluster, node)
    running_attempt(cluster, ns, name, 2, 1, timeout=120)
    mark = root / lineage.marker_name(uid, 2)
    wait_for(mark.exists, 120, "attempt 2's fence mark")
    if caught_before_commit:
        release.touch()
        wait_for((caught / lineage.REFUSED_FILE).exists, 60, "the held rank 0 to find the mark and refuse")
        assert not (caught / storage.METADATA_FILE).exists()
    else:
        wait_for(lambda: any(root.glob(f"step-*/{lineage.REFUSED_FILE}")), 120, "a refused save of the old gang")

    final, diff = scenarios.fenced_gang_outcome(cluster, ns, name, node, root, uid, reference["model"])
    print(f"\nafter a cut-off gang: final model vs reference {diff:.2e}; lateWrite {final['history'][0]}")
    assert diff <= TOLERANCE
