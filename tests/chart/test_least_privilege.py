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


# ---- the example admission policy: the Pod Security baseline, and no inline network volumes ------------------
def _hostile() -> list[tuple[str, dict[str, Any], str]]:
    from tests.chart.test_tenancy import with_container, with_pod

    def annotated(value: str) -> dict[str, Any]:
        job = with_pod()
        job["spec"]["template"].setdefault("metadata", {}).setdefault("annotations", {})[
            "container.apparmor.security.beta.kubernetes.io/trainer"] = value
        return job

    return [
        ("inline nfs", with_pod(volumes=[{"name": "n", "nfs": {"server": "10.0.0.5", "path": "/exports/other-ns"}}]),
         "inline network volumes"),
        ("inline iscsi", with_pod(volumes=[{"name": "i", "iscsi": {"targetPortal": "10.0.0.6:3260",
                                                                  "iqn": "iqn.x", "lun": 0}}]), "inline network"),
        ("inline cephfs", with_pod(volumes=[{"name": "c", "cephfs": {"monitors": ["10.0.0.7"]}}]), "inline network"),
        ("gitRepo", with_pod(volumes=[{"name": "g", "gitRepo": {"repository": "https://x"}}]), "inline network"),
        ("hostProcess", with_pod(securityContext={"windowsOptions": {"hostProcess": True}}), "hostProcess"),
        ("unconfined seccomp (pod)", with_pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
         "seccompProfile"),
        ("unconfined seccomp (container)", with_container(securityContext={"seccompProfile": {"type": "Unconfined"}}),
         "seccompProfile"),
        ("unconfined AppArmor", with_container(securityContext={"appArmorProfile": {"type": "Unconfined"}}),
         "appArmorProfile"),
        ("unconfined AppArmor annotation", annotated("unconfined"), "AppArmor"),
        ("SELinux spc_t", with_container(securityContext={"seLinuxOptions": {"type": "spc_t"}}), "seLinuxOptions"),
        ("SELinux user", with_pod(securityContext={"seLinuxOptions": {"user": "system_u"}}), "seLinuxOptions"),
        ("unmasked /proc", with_container(securityContext={"procMount": "Unmasked"}), "procMount"),
        ("unsafe sysctl", with_pod(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
         "sysctls"),
    ]


def _compliant() -> list[tuple[str, dict[str, Any]]]:
    from tests.chart.test_tenancy import with_container, with_pod

    return [
        ("a PVC volume", with_pod(volumes=[{"name": "ck", "persistentVolumeClaim": {"claimName": "ckpt"}}])),
        ("RuntimeDefault seccomp", with_pod(securityContext={"seccompProfile": {"type": "RuntimeDefault"}})),
        ("container_t", with_container(securityContext={"seLinuxOptions": {"type": "container_t"}})),
        ("a safe sysctl", with_pod(securityContext={"sysctls": [{"name": "net.ipv4.tcp_keepalive_time",
                                                                 "value": "60"}]})),
        ("Default procMount", with_container(securityContext={"procMount": "Default"})),
    ]


def test_policy_refuses_the_baseline_and_inline_network_volumes(helm: str, tmp_path: Path) -> None:  # noqa: F811
    from tests.chart.test_tenancy import admission_docs, refusals

    policy, _ = admission_docs(helm, tmp_path)
    for case, job, field in _hostile():
        found = refusals(policy, job)
        assert len(found) == 1 and field in found[0], (case, found)
    for case, job in _compliant():
        assert refusals(policy, job) == [], case
