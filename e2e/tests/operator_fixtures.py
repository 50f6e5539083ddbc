"""In the suites that run against the installed operator, a test's `namespace` is a job namespace.

Imported by those modules (not the conftest) because the substrate suite's `namespace` is a bare one.
"""

import pytest


@pytest.fixture
def namespace(job_ns: str) -> str:
    """`job_ns`: the operator is installed, and killed pool nodes are restored after the test."""
    return job_ns
