"""Hangs on the local cluster: one rank of the real trainer stops for good; the job is restarted within the
progress timeout plus a few seconds and ends with the right model, recreated or in place (the agents keep
their pods and report the verdict; only the pod whose rank stopped first is replaced). A slow job that keeps
stepping, beside it, is never touched.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e import scenarios
from e2e.cluster import ClusterLike, wait_for
from e2e.scenarios import STEPS, TOLERANCE, relative_difference
from e2e.support import events, get_job, running_attempt, wait_phase
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]
TIMEOUT = 20  # spec.progressTimeoutSeconds (the first step gets four times this: torch imports on a busy machine)
HANG_STEP = 10


def submit(cluster: ClusterLike, ns: str, name: str, **kw: Any) -> dict[str, Any]:
    return scenarios.submit_example(cluster, ns, name, progressTimeoutSeconds=TIMEOUT, **kw)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("restart", [c.RestartStrategy.RECREATE.value, c.RestartStrategy.IN_PLACE.value])
def test_a_hung_rank_is_restarted_in_time_and_the_job_ends_right(
    cluster: ClusterLike, job_ns: str, reference: dict[str, Any], restart: str
) -> None:
    import torch

    ns = job_ns
    job = submit(cluster, ns, "hang", replicas=3, steps=STEPS, checkpoint_every=4, grow_back=False,
                 restart_strategy=restart, extra_args=(f"--hang-at-step={HANG_STEP}", "--hang-rank=1"))
    if restart == c.RestartStrategy.RECREATE.value:  # the slow job's check needs doing once
        submit(cluster, ns, "slow", replicas=1, min_replicas=1, steps=5, checkpoint_every=0, step_delay=4.0)
    old = running_attempt(cluster, ns, "hang", 1, 3, timeout=180)
    uids = {p.metadata.name: p.metadata.uid for p in old}
    rank1 = next(p.metadata.name for p in old if p.metadata.labels[c.LABEL_RANK] == "1")
    hung_node = next(p.spec.node_name for p in old if p.metadata.name == rank1)
    wait_for(lambda: "RTJ_HANGING" in scenarios.trainer_log(cluster, ns, rank1), 180, "the rank to hang")
    t_hang = time.monotonic()

    def detected() -> dict[str, Any] | None:
        failure = get_job(cluster, ns, "hang")["status"].get("lastFailure") or {}
        return failure if failure.get("kind") == c.HANG else None

    failure = wait_for(detected, TIMEOUT + 30, "the hang in status.lastFailure")
    latency = time.monotonic() - t_hang
    print(f"\nhang at step {HANG_STEP} on {hung_node}: detected {latency:.1f}s after the rank stopped "
          f"(timeout {TIMEOUT}s): {failure['message']}")
    assert latency <= TIMEOUT + 5
    assert f"step {HANG_STEP - 1}" in failure["message"] and "rank 1" in failure["message"]
    assert failure["node"] == hung_node
    # The event goes out after the status write that recorded the failure: wait for it, bounded.
    wait_for(lambda: any(e.startswith(c.REASON_HANG) and rank1 in e for e in events(cluster, ns, "hang")), 30,
             "the Hang event naming the hung rank's pod")

    new = running_attempt(cluster, ns, "hang", 2, 3, timeout=180)
    assert hung_node not in {p.spec.node_name for p in new}  # the node that hung is avoided
    kept = {p.metadata.name for p in new if uids.get(p.metadata.name) == p.metadata.uid}
    entry = next(e for e in get_job(cluster, ns, "hang")["status"]["history"] if e["attempt"] == 2)
    if restart == c.RestartStrategy.IN_PLACE.value:  # the two pods whose ranks did not stop carry on
        assert kept == set(uids) - {rank1} and entry["restart"] == restart and sorted(entry["kept"]) == sorted(kept)
    else:
        assert not kept and entry["restart"] == restart
    final = wait_phase(cluster, ns, "hang", c.SUCCEEDED, 300)
    assert final["restarts"] == {"infrastructure": 1, "application": 0, "planned": 0}
    assert final["badNodes"][0]["node"] == hung_node
    state = torch.load(scenarios.host_root(cluster, job).with_suffix(".pt"), weights_only=False)
    diff = relative_difference(reference["model"], state["model"])
    gp = final["goodput"]
    print(f"final model vs reference: {diff:.2e}; goodput {gp['ratio']}, lost {gp['lost']}, "
          f"steps recomputed {gp['stepsRecomputed']}")
    assert diff <= TOLERANCE
    assert gp["recoveries"] == 1 and gp["lost"]["detection"] >= TIMEOUT - 1

    if restart == c.RestartStrategy.RECREATE.value:
        done = wait_phase(cluster, ns, "slow", c.SUCCEEDED, 120)  # 4 s a step, never a hang
        assert done["restartCount"] == 0 and done["attempt"] == 1 and "lastFailure" not in done
