"""In place at an unchanged world size is bitwise exact: two pods' agents run the real example trainer (W=2,
gloo, DCP), both are handed attempt 2's plan (same size, same ranks, resume from the newest complete
checkpoint) while they train, and the final model equals an uninterrupted W=2 run's to the last bit.

Both kept pods are healthy when their plans arrive, as in a grow-back handled in place, and the second plan comes
late: the first agent to stop its workers makes the whole gang stop (the SIGTERM'd rank's preemption flag rides
the step's all-reduce, and every rank saves and exits 143), so the other pod's workers end before its own plan is
in. That pod must wait for its plan, not end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from resilient_contract import storage
from resilient_trainer import agent
from tests.trainer.harness import SMALL_MODEL, Launcher, free_port, parse, start_process, wait_for
from tests.trainer.test_agent import health, pod_env, post, signed

pytestmark = pytest.mark.multiproc

STEPS = 12
COMMON = [*SMALL_MODEL, "--global-batch", "16", "--micro-batch", "2", "--steps", str(STEPS), "--checkpoint-every", "4"]


def latest(root: Path) -> storage.Verdict | None:
    try:
        return storage.scan(storage.open_store(str(root)), storage.UNBOUNDED_SCAN).latest
    except storage.StorageError:
        return None


@pytest.mark.timeout(300)
def test_in_place_at_the_same_world_size_ends_bitwise_equal_to_an_uninterrupted_run(
    launcher: Launcher, tmp_path: Path
) -> None:
    reference = launcher.run(2, [*COMMON, "--checkpoint-root", str(tmp_path / "reference")])
    (want,) = parse(reference.output(), "RTJ_RESULT")

    root = tmp_path / "ckpt"  # pod_env's checkpoint root
    port, agent_ports, pods = free_port(), {}, {}
    for rank, pod in enumerate(("pod-a", "pod-b")):
        agent_ports[pod] = free_port()
        cmd = [sys.executable, "-m", "resilient_trainer.launch", "--", "-m", "resilient_trainer.examples.tiny_gpt",
               *COMMON, "--checkpoint-root", str(root), "--step-delay", "0.3"]
        env = pod_env(tmp_path, pod, port=port, agent_port=agent_ports[pod], node_rank=rank, nnodes=2)
        pods[pod] = start_process(launcher, cmd, env, pod)
    for pod, run in pods.items():
        assert wait_for(lambda p=agent_ports[pod]: health(p) is not None, 60), run.tail()  # type: ignore[misc]

    assert wait_for(lambda: latest(root) is not None, 120), pods["pod-a"].tail()
    resume = latest(root)
    assert resume is not None and resume.step < STEPS, "the plan came too late to test a resume"
    port2 = free_port()

    def hand(pod: str, rank: int) -> tuple[int, dict[str, object]]:
        return post(agent_ports[pod], signed(pod, 2, port=port2, nnodes=2, node_rank=rank, resume_from=resume.path))

    # pod-a's plan first; pod-b's only once its workers have stopped with the gang (a slow delivery)
    assert hand("pod-a", 0) == (200, {"attempt": 2, "state": "started"})
    b_worker_gone = lambda: (health(agent_ports["pod-b"]) or {}).get("state") != agent.RUNNING  # noqa: E731
    assert wait_for(b_worker_gone, 90), pods["pod-b"].tail()
    assert pods["pod-b"].ranks[0].poll() is None, f"pod-b ended before its plan came\n{pods['pod-b'].tail()}"
    assert hand("pod-b", 1) == (200, {"attempt": 2, "state": "started"})
    for run in pods.values():
        assert run.wait(180) == [0], run.tail()

    out = pods["pod-a"].output()
    assert parse(out, "RTJ_RESUMED")[-1] == {"from": resume.path, "step": str(resume.step)}
    (got,) = parse(out, "RTJ_RESULT")
    assert got["world_size"] == "2" and got["step"] == str(STEPS), got
    assert got["digest"] == want["digest"], f"in place: {got}, uninterrupted: {want}"
