"""Short fixture names for the suites that run against the installed operator.

Imported by those modules (not the conftest) because `namespace` there means a job namespace that is
cleaned up after each test, while the substrate suite's `namespace` is a bare one.
"""

import pytest

from e2e.localcluster.cluster import Cluster


@pytest.fixture
def cluster(operator_cluster: Cluster) -> Cluster:
    return operator_cluster


@pytest.fixture
def namespace(job_ns: str) -> str:
    return job_ns
