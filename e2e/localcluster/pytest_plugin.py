"""pytest fixtures for the local cluster.

Use with `-p e2e.localcluster.pytest_plugin` (or `from e2e.localcluster.pytest_plugin import *` in a
conftest). Tests that need a cluster carry the `cluster` marker. The binaries are built (or found in
the cache) once at collection time, outside any per-test timeout. One cluster serves the whole
session; its directory (component, agent and pod logs) is kept and printed when a test fails.

Environment: RTJ_CLUSTER=kind selects the kind backend; RTJ_KEEP_CLUSTER=1 keeps the directory
even after a green run; RTJ_NODE_GRACE sets --node-monitor-grace-period (default 8s).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from . import get_cluster
from .binaries import ensure_binaries

SESSION_NODES = ("node-1", "node-2", "node-3")
_failed_key = pytest.StashKey[bool]()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Build the binaries before any test runs when cluster tests are selected (no timeout applies)."""
    wanted = [i for i in items if i.get_closest_marker("cluster")]
    if not wanted or os.environ.get("RTJ_CLUSTER", "local") == "kind":
        return
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="the local cluster needs root (network and mount namespaces)")
        for item in wanted:
            item.add_marker(skip)
        return
    ensure_binaries()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """Remember whether anything failed, to keep the cluster's logs."""
    report = yield
    if report.failed:
        item.session.stash[_failed_key] = True
    return report


@pytest.fixture(scope="session")
def rtj_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A session-wide cluster with three Ready nodes (node-1..3, 8 CPU, 32Gi, 2 fake GPUs each)."""
    cluster = get_cluster("e2e", node_monitor_grace_period=os.environ.get("RTJ_NODE_GRACE", "8s"))
    try:
        for name in SESSION_NODES:
            cluster.add_node(name, gpus=2)
        yield cluster
    finally:
        cluster.stop()
        failed = request.session.stash.get(_failed_key, False)
        if failed or os.environ.get("RTJ_KEEP_CLUSTER"):
            print(f"\n[localcluster] logs kept in {cluster.dir} (component logs in logs/, pods in nodes/*/pods/)")
        else:
            shutil.rmtree(cluster.dir, ignore_errors=True)


@pytest.fixture
def namespace(rtj_cluster: Any) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    rtj_cluster.kubectl("create", "namespace", name)
    rtj_cluster.wait_for_default_sa(name)
    yield name
    rtj_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
