"""pytest hooks for the process-node clusters (the fixtures live in e2e/tests/conftest.py, for every backend).

Tests that need a cluster carry the `cluster` marker. The binaries are built (or found in the cache)
once at collection time, outside any per-test timeout; without root the local cluster cannot run,
so those tests are skipped. A failed test marks the session so the cluster's directory (component,
agent and pod logs) is kept.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from e2e.controlplane.binaries import ensure_binaries

failed_key = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)  # after `-m` deselection: a lane without cluster tests builds nothing
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
    if os.environ.get("RTJ_CLUSTER") == "real" or any(getattr(getattr(i, "module", None), "REAL_NODES", False)
                                                       for i in wanted):
        from e2e.realnodes.binaries import ensure_images, ensure_node_binaries

        ensure_node_binaries()  # kubelet, kube-proxy, CoreDNS, pause (e2e/realnodes)
        ensure_images()
    # Images from our Dockerfiles a module names in IMAGES (a cold build takes minutes: not in a test's timeout).
    wanted_images = sorted({n for i in wanted for n in getattr(getattr(i, "module", None), "IMAGES", ())})
    if wanted_images:
        from e2e import images

        images.ensure_images(wanted_images)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """Remember whether anything failed, to keep the cluster's logs."""
    report = yield
    if report.failed:
        item.session.stash[failed_key] = True
    return report
