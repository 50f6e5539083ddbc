"""The e2e suite uses the local-cluster fixtures (or the kind ones with RTJ_CLUSTER=kind)."""

from collections.abc import Iterator
from typing import Any

import pytest

from e2e import support
from e2e.localcluster.pytest_plugin import (  # noqa: F401  (fixtures and hooks re-exported for pytest)
    namespace,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    rtj_cluster,
)


@pytest.fixture(scope="session")
def operator_cluster(rtj_cluster: Any) -> Any:  # noqa: F811
    """The session cluster with the training pool and the operator installed by helm (once)."""
    return support.install_operator(rtj_cluster)


@pytest.fixture
def job_ns(operator_cluster: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace per test; afterwards every killed pool node is restored and its pods are gone."""
    yield from support.job_namespace(operator_cluster, request)
