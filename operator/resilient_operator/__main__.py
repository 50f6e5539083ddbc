"""`python -m resilient_operator`: run the operator (replicas elect a leader on a Lease: leader.py).

It takes no arguments: it is configured by environment variables, which the Helm chart sets from its
values (charts/resilient-training/values.yaml says what each means), and it finds the API server the
way the kubernetes client does (in-cluster service account, else $KUBECONFIG or ~/.kube/config).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import re
import socket
import sys
from collections.abc import Sequence

import kopf
from kopf._core.engines.peering import Identity

from resilient_operator import handlers, leader, settings
from resilient_operator.kube import NODE_LEASE_NAMESPACE
from resilient_operator.settings import Settings


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Only --help: the settings are the environment's (read in settings.py, where each name is defined)."""
    try:
        source = "".join(inspect.getsource(m) for m in (settings, leader, handlers))
        names = sorted(set(re.findall(r"\b(RTJ_[A-Z0-9_]+)", source)))
    except OSError:  # installed without sources
        names = ["(the RTJ_* names in resilient_operator/settings.py)"]
    parser = argparse.ArgumentParser(
        prog="python -m resilient_operator", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment variables read (see resilient_operator/settings.py):\n  " + "\n  ".join(names))
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> None:
    parse_args(sys.argv[1:] if argv is None else argv)
    config = Settings.from_environ()
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespaces = list(config.namespaces)
    if namespaces and NODE_LEASE_NAMESPACE not in namespaces:
        namespaces.append(NODE_LEASE_NAMESPACE)  # node heartbeats live there
    kopf.run(
        standalone=True,
        # kopf would ask the passwd database for a user name; a pod's uid may have none (65532, OpenShift)
        identity=Identity(os.environ.get("POD_NAME") or socket.gethostname()),
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{config.health_port}/healthz",
        memo=kopf.Memo(state=handlers.State(settings=config)),
    )


if __name__ == "__main__":
    main()
