"""The e2e fixtures, for either backend (RTJ_CLUSTER=kind selects kind).

`cluster`: the session's cluster (nodes node-1..3, 8 CPU, 32Gi, 2 fake GPUs each). `namespace`: a fresh
namespace per test. `operator`: the operator installed by helm with its training pool (once per
session, on first use). `job_ns`: a namespace per test for jobs; afterwards every killed pool node is
restored and its pods are gone. The operator suites import `namespace` from operator_fixtures.py,
where it means `job_ns`.
"""

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import get_cluster, scenarios, support
from e2e.cluster import ClusterLike
from e2e.pytest_plugin import (  # noqa: F401  (hooks re-exported for pytest)
    failed_key,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
)

SESSION_NODES = ("node-1", "node-2", "node-3")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[ClusterLike]:
    """A session-wide cluster with three Ready nodes; its directory is kept when a test failed."""
    c = get_cluster("e2e", node_monitor_grace_period=os.environ.get("RTJ_NODE_GRACE", "8s"))
    try:
        for name in SESSION_NODES:
            c.add_node(name, gpus=2)
        yield c
    finally:
        c.stop()
        if request.session.stash.get(failed_key, False) or os.environ.get("RTJ_KEEP_CLUSTER"):
            print(f"\n[cluster] logs kept in {c.dir} (component logs in logs/, pods in nodes/*/pods/)")
        else:
            shutil.rmtree(c.dir, ignore_errors=True)


@pytest.fixture
def namespace(cluster: ClusterLike) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    yield from support.scratch_namespace(cluster)


@pytest.fixture(scope="session")
def operator(cluster: ClusterLike) -> str:
    """The training pool and the operator, installed by helm once; returns the release name."""
    support.install_operator(cluster)
    return support.RELEASE


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The failure-free reference run the training scenarios' final models are compared with (once)."""
    return scenarios.reference_run(tmp_path_factory.mktemp("reference"))


@pytest.fixture
def job_ns(cluster: ClusterLike, operator: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace per test; afterwards every killed pool node is restored and its pods are gone."""
    yield from support.job_namespace(cluster, request)
