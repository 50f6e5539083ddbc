"""The e2e suite uses the local-cluster fixtures (or the kind ones with RTJ_CLUSTER=kind)."""

from e2e.localcluster.pytest_plugin import (  # noqa: F401  (fixtures and hooks re-exported for pytest)
    namespace,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    rtj_cluster,
)
