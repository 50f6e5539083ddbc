"""CI-sized scale run on KWOK: the operator reads from its caches (no LIST while nothing changes, none per
reconcile during a recovery), no hit job restarts twice, and the recoveries run in place: the stand-in agents
at the pods' IPs (e2e.kwokagents) take every plan, and only the lost pods are created again. Times are
printed, not asserted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.scale_bench import run_scale
from e2e.kwokcluster import KwokCluster

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster]
NODES, JOBS, WORKERS, KILL = 100, 200, 2, 10


@pytest.fixture(scope="module")
def kwok() -> Iterator[KwokCluster]:
    kc = KwokCluster.start("kwokci")
    try:
        kc.install_operator()
        yield kc
    finally:
        kc.stop(remove=True)


@pytest.mark.timeout(400)
def test_hundred_nodes_two_hundred_jobs_read_from_caches(kwok: KwokCluster) -> None:
    # nodeLossTimeout 30 s: three renew intervals. On a 2-core CI machine KWOK itself has been seen to renew a
    # Lease 21 s after the last one, which a 20 s timeout rightly calls a loss (a substrate artefact).
    result = run_scale(kwok, nodes=NODES, jobs=JOBS, workers=WORKERS, kill=KILL, loss_timeout=30, steady=10,
                       timeout=240)
    print("\n" + result.table())
    lists = {k: n for k, n in result.steady_requests.items() if k[0] == "list"}
    assert not lists, f"LIST calls in the steady state: {lists}"
    # a recovery re-lists nothing either: the jobs, pods, nodes and leases come from the watches
    recovery_lists = sum(n for (verb, _), n in result.recovery_requests.items() if verb == "list")
    assert recovery_lists == 0, result.recovery_requests
    assert result.hit > 0 and len(result.relaunch_s) == result.hit
    assert result.restarted_twice == 0 and result.spurious == 0
    # in place: every plan acknowledged, and the only pods created are the lost ones' replacements
    assert result.deliveries and set(result.deliveries) == {"acknowledged"}, result.deliveries
    assert result.plans_taken == result.deliveries["acknowledged"] == result.kept_pods > 0
    assert result.recovery_requests.get(("create", "pods"), 0) == result.lost_pods, result.recovery_requests
