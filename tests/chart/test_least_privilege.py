"""Least privilege, proven (issue 25, item 6): no right the code does not use, Leases only in
kube-node-lease, no node patching where it can never run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.chart.test_chart import (
    CHART,
    NODE_LEASES_ROLE,
    by_kind,
    granted,
    helm,  # noqa: F401  (fixture)
    node_lease_role,
    one,
    render,
)  # fmt: skip

OPERATOR = CHART.parents[1] / "operator" / "resilient_operator"


def lease_grants(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(kind, namespace) of every (Cluster)Role granting anything on Leases."""
    out = []
    for kind in ("ClusterRole", "Role"):
        for role in by_kind(docs, kind):
            if any(r["resources"] == ["leases"] or "leases" in r["resources"] for r in role["rules"]):
                out.append((kind, role["metadata"].get("namespace", "")))
    return out


def test_node_leases_are_readable_in_kube_node_lease_only(helm: str, tmp_path: Path) -> None:  # noqa: F811
    for values in ({}, {"watchNamespaces": ["ml-a", "ml-b"]}, {"watchNamespaces": ["ml-a", "kube-node-lease"]}):
        docs = render(helm, tmp_path, values)
        assert not any(kind == "ClusterRole" for kind, _ in lease_grants(docs)), values
        role = node_lease_role(docs)
        assert set(granted(role)[("coordination.k8s.io", "leases")]) == {"list", "watch"}
        others = [ns for kind, ns in lease_grants(docs) if kind == "Role" and ns == "kube-node-lease"]
        assert others == ["kube-node-lease"], values  # nothing else grants Leases there


def test_no_node_patch_in_namespace_mode_even_with_cluster_tainting_on(helm: str, tmp_path: Path) -> None:  # noqa: F811
    def node_verbs(docs: list[dict[str, Any]]) -> set[str]:
        return {v for r in one(docs, "ClusterRole")["rules"] if "nodes" in r["resources"] for v in r["verbs"]}

    taint = {"badNodes": {"clusterTaint": {"enabled": True}}}
    assert node_verbs(render(helm, tmp_path, {**taint, "watchNamespaces": ["ml-a"]})) == {"list", "watch"}
    assert node_verbs(render(helm, tmp_path, taint)) == {"get", "list", "watch", "patch"}
    assert node_verbs(render(helm, tmp_path)) == {"list", "watch"}
    assert NODE_LEASES_ROLE


def _code() -> str:
    return "\n".join(p.read_text() for p in sorted(OPERATOR.rglob("*.py")))


def test_the_verbs_dropped_have_no_caller() -> None:
    """What the chart no longer grants, nothing in the operator calls (the kubernetes client's method names)."""
    code = _code()
    for call in ("read_namespaced_pod(", "read_namespaced_service(", "get_namespaced_custom_object(",
                 "get_namespaced_custom_object_status(", "get_cluster_custom_object(", "patch_namespaced_event(",
                 "replace_namespaced_event(", "list_lease_for_all_namespaces(", "read_namespaced_pod_status("):
        assert call not in code, call
    # node reads by name and node patches only where tainting happens
    assert {m for m in re.findall(r"\.(read_node|patch_node)\(", code)} <= {"read_node", "patch_node"}
    assert code.count(".patch_node(") == 1 and code.count(".read_node(") == 1
    # node Leases: listed and watched in kube-node-lease only
    assert re.findall(r"list_namespaced_lease\(([A-Z_]+)", code) == ["NODE_LEASE_NAMESPACE"]
