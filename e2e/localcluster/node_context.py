"""What a pod worker and the kubelet API may see of their node: a narrow context, not the agent itself.

`node_agent.NodeAgent` satisfies `NodeContext`; `pod_runtime` and `kubelet_api` are typed against it, so
neither imports the agent and the three modules form no import cycle.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from .kubeapi import Api


class PodHandle(Protocol):
    """A pod worker as the kubelet API sees it: where its logs are, and whether it was removed."""

    dir: Path
    removed: threading.Event

    def stopped(self, container: str) -> bool: ...


class NodeContext(Protocol):
    """The node a pod runs on: its config, API client, DNS records, hostPath root and pod book."""

    cfg: dict[str, Any]
    node: str
    dir: Path
    netns_prefix: str
    api: Api

    def dns_records(self, ns: str) -> list[str]: ...
    def host_path(self, path: str) -> Path: ...
    def pod_finished(self, uid: str) -> None: ...
    def runtime_for(self, ns: str, name: str) -> PodHandle | None: ...
