"""`python -m resilient_operator`: run the operator (standalone: one active replica, see the chart)."""

from __future__ import annotations

import logging
import os
import socket

import kopf
from kopf._core.engines.peering import Identity

from resilient_operator import handlers
from resilient_operator.kube import NODE_LEASE_NAMESPACE
from resilient_operator.settings import Settings


def main() -> None:
    settings = Settings.from_environ()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespaces = list(settings.namespaces)
    if namespaces and NODE_LEASE_NAMESPACE not in namespaces:
        namespaces.append(NODE_LEASE_NAMESPACE)  # node heartbeats live there
    kopf.run(
        standalone=True,
        # kopf would ask the passwd database for a user name; a pod's uid may have none (65532, OpenShift)
        identity=Identity(os.environ.get("POD_NAME") or socket.gethostname()),
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
        memo=kopf.Memo(state=handlers.State(settings=settings)),
    )


if __name__ == "__main__":
    main()
