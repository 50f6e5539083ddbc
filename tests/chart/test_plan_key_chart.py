"""The chart's side of in-place restarts: the plan-signing key's Secret (get by name, create, in the release
namespace only), the delivery settings, and the operator's egress to the agents' port."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from resilient_operator.settings import PLAN_KEY_SECRET, DeliverySettings, SettingsError, operator_config
from tests.chart.test_chart import (
    CHART,
    FULLNAME,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    by_kind,
    env_of,
    helm,  # noqa: F401  (fixture)
    one,
    render,
    run_helm,
)  # fmt: skip

PLAN_KEY = f"{FULLNAME}-plan-key"


def _plan_key_role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == PLAN_KEY]
    return role


def _secret_grants(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(kind/name, namespace) of every (Cluster)Role granting anything on Secrets."""
    return [(f"{d['kind']}/{d['metadata']['name']}", d["metadata"].get("namespace", ""))
            for kind in ("ClusterRole", "Role") for d in by_kind(docs, kind)
            if any("secrets" in r["resources"] for r in d["rules"])]


def _plain(env: dict[str, Any]) -> dict[str, str]:
    """The variables with a value (not a fieldRef), as the process would see them."""
    return {k: v for k, v in env.items() if isinstance(v, str)}


def test_the_key_secret_is_readable_by_name_and_creatable_in_the_release_namespace_only(
        helm: str, tmp_path: Path) -> None:  # noqa: F811
    for values in ({}, {"watchNamespaces": ["ml-a", "ml-b"]}, {"watchNamespaces": ["ml-a", NAMESPACE]}):
        docs = render(helm, tmp_path, values)
        assert _secret_grants(docs) == [(f"Role/{PLAN_KEY}", NAMESPACE)], values
        role = _plan_key_role(docs)
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [PLAN_KEY], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        ]  # fmt: skip
        (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == PLAN_KEY]
        assert binding["metadata"]["namespace"] == NAMESPACE
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PLAN_KEY}
        sa = one(docs, "ServiceAccount")["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]


def test_the_operator_reads_the_secret_the_role_names(helm: str, tmp_path: Path) -> None:  # noqa: F811
    env = env_of(render(helm, tmp_path))
    assert env["RTJ_PLAN_KEY_SECRET"] == PLAN_KEY
    assert DeliverySettings.from_environ(_plain(env)) == DeliverySettings(PLAN_KEY, "default", 64, 5.0)
    assert (env["RTJ_DELIVERY_WORKERS"], env["RTJ_DELIVERY_TIMEOUT_SECONDS"], env["RTJ_AGENT_PORT"]) == (
        "64", "5", "29401")
    docs = render(helm, tmp_path, {"planDelivery": {"keySecret": "team-signing", "workers": 3,
                                                    "timeoutSeconds": 2.5, "agentPort": 30000}})
    env = env_of(docs)
    assert _plan_key_role(docs)["rules"][0]["resourceNames"] == ["team-signing"]
    assert DeliverySettings.from_environ(_plain(env)) == DeliverySettings("team-signing", "default", 3, 2.5)
    assert operator_config(_plain(env)).agent_port == 30000  # injected into every worker pod as RTJ_AGENT_PORT
    with pytest.raises(SettingsError):
        operator_config({"RTJ_AGENT_PORT": "70000"})
    assert DeliverySettings.from_environ({}).plan_key_secret == PLAN_KEY_SECRET  # outside the chart


def test_no_key_rbac_when_rbac_is_off(helm: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, tmp_path, {"rbac": {"create": False}})
    assert _secret_grants(docs) == []
    assert env_of(docs)["RTJ_PLAN_KEY_SECRET"] == PLAN_KEY  # the admin's own RBAC must grant the same


def test_the_network_policy_lets_the_operator_reach_the_agents_port_only(helm: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, tmp_path, {"networkPolicy": {"enabled": True}, "planDelivery": {"agentPort": 30001}})
    egress = one(docs, "NetworkPolicy")["spec"]["egress"]
    to_pods = [rule for rule in egress if rule.get("to") == [{"namespaceSelector": {}}]]
    assert to_pods == [{"to": [{"namespaceSelector": {}}], "ports": [{"port": 30001, "protocol": "TCP"}]}]


BAD = [
    ("secret name", {"planDelivery": {"keySecret": "Plan_Key"}}, "/planDelivery/keySecret"),
    ("no workers", {"planDelivery": {"workers": 0}}, "/planDelivery/workers"),
    ("no timeout", {"planDelivery": {"timeoutSeconds": 0}}, "/planDelivery/timeoutSeconds"),
    ("port", {"planDelivery": {"agentPort": 70000}}, "/planDelivery/agentPort"),
    ("unknown key", {"planDelivery": {"retries": 3}}, "retries"),
]


@pytest.mark.parametrize(("case", "values", "where"), BAD, ids=[b[0] for b in BAD])
def test_bad_delivery_values_are_refused(helm: str, tmp_path: Path, case: str, values: dict[str, Any],  # noqa: F811
                                         where: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                      values=values, tmp=tmp_path)
    assert result.returncode != 0, f"{case}: rendered although the values are invalid"
    assert where in result.stderr, result.stderr


def test_the_operator_calls_nothing_else_on_secrets() -> None:
    """plankey.py reads one Secret by name and creates it: nothing else on Secrets anywhere in the operator."""
    code = "\n".join(p.read_text() for p in sorted((CHART.parents[1] / "operator").rglob("*.py")))
    assert sorted(set(re.findall(r"\.(\w+_secret\w*)\(", code))) == ["create_namespaced_secret",
                                                                     "read_namespaced_secret"]
