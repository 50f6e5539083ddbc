"""The chart's tenancy promises: narrowed RBAC, the operator's NetworkPolicy, the discovery sandbox's values
and the memory they need, and the example ValidatingAdmissionPolicy (rendered, schema-checked, and its CEL
evaluated on hostile and compliant templates).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from tests.chart.test_chart import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    NODE_LEASES_ROLE,
    RBAC,
    RBAC_CLUSTER,
    RBAC_NAMESPACED,
    RELEASE,
    by_kind,
    container,
    env_of,
    granted,
    helm,  # noqa: F401  (fixture)
    node_lease_role,
    one,
    render,
    run_helm,
)  # fmt: skip

ROOT = CHART.parents[1]
NODE_LEASE_NS = "kube-node-lease"
# What kopf's job and pod watches need in kube-node-lease (added to the watched list for the Leases).
RBAC_NODE_LEASE_NS = {("training.resilient.dev", "resilienttrainingjobs"): {"list", "watch"},
                      ("", "pods"): {"list", "watch"}}  # fmt: skip


def render_fails(helm: str, tmp: Path, values: dict[str, Any]) -> str:  # noqa: F811
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, values=values, tmp=tmp)
    assert result.returncode != 0, f"rendered although {values} is inconsistent"
    return result.stderr


# ---- RBAC narrowed to the watched namespaces ----------------------------------------------------------
def test_watched_namespaces_get_roles_and_the_cluster_keeps_only_node_facts(helm: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, tmp_path, {"watchNamespaces": ["ml-a", "ml-b"]})
    cluster_role = one(docs, "ClusterRole")
    assert granted(cluster_role) == RBAC_CLUSTER  # nodes and Leases, read-only
    assert all(set(verbs) <= {"get", "list", "watch"} for verbs in granted(cluster_role).values())
    leader = "rtj-resilient-training-operator-leader"  # leader election's Role, in the release namespace
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role") if r["metadata"]["name"] != leader
             and not r["metadata"]["name"].endswith((NODE_LEASES_ROLE, "-plan-key"))}  # plan key: its own test
    assert set(roles) == {"ml-a", "ml-b", NODE_LEASE_NS}
    node_lease_role(docs)  # the Leases: only there
    for ns in ("ml-a", "ml-b"):
        assert granted(roles[ns]) == RBAC_NAMESPACED, ns
    assert granted(roles[NODE_LEASE_NS]) == RBAC_NODE_LEASE_NS
    # nothing beyond the cluster-wide table, only split
    assert granted(roles["ml-a"]) | granted(cluster_role) == RBAC

    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] != leader
                and not b["metadata"]["name"].endswith((NODE_LEASES_ROLE, "-plan-key"))}
    assert set(bindings) == set(roles)
    for ns, binding in bindings.items():
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": roles[ns]["metadata"]["name"]}  # fmt: skip
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == cluster_role["metadata"]["name"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_watching_kube_node_lease_itself_gets_the_full_role_once(helm: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, tmp_path, {"watchNamespaces": ["ml-a", NODE_LEASE_NS]})
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith(
        ("-leader", NODE_LEASES_ROLE, "-plan-key"))}  # leader election's, the node Leases' and the plan key's aside
    assert sorted(roles) == ["kube-node-lease", "ml-a"]  # no duplicate Role (the install would fail)
    assert granted(roles[NODE_LEASE_NS]) == RBAC_NAMESPACED


def test_every_namespace_watched_keeps_one_cluster_role(helm: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, tmp_path)
    assert granted(one(docs, "ClusterRole")) == RBAC
    # only leader election's Role and binding (the one Lease), the plan key's (release namespace), node Leases'
    node_lease_role(docs)
    assert sorted(r["metadata"]["name"] for r in by_kind(docs, "Role") + by_kind(docs, "RoleBinding")) == [
        "rtj-resilient-training-operator-leader"] * 2 + ["rtj-resilient-training-operator-node-leases"] * 2 + [
        "rtj-resilient-training-operator-plan-key"] * 2


# ---- the discovery sandbox's values --------------------------------------------------------------------
def test_sandbox_values_reach_the_operator_as_env(helm: str, tmp_path: Path) -> None:  # noqa: F811
    env = env_of(render(helm, tmp_path, {"checkpointStorage": {"existingClaim": "ck"}}))
    assert env["RTJ_CHECKPOINT_MOUNT"] == "/checkpoints"
    assert json.loads(env["RTJ_STORAGE_AREAS"]) == {}  # default: <mount>/<namespace>/
    assert env["RTJ_DISCOVERY_TIMEOUT_SECONDS"] == "5"
    assert env["RTJ_METADATA_MAX_BYTES"] == "33554432"
    assert env["RTJ_DISCOVERY_MAX_STEPS"] == "32"
    assert env["RTJ_DISCOVERY_MEMORY_BYTES"] == "536870912"
    assert env["RTJ_DISCOVERY_WORKERS"] == "2"

    values = {"checkpointStorage": {"existingClaim": "ck", "mountPath": "/data/ckpt",
                                    "namespaceAreas": {"ml-a": "/data/ckpt/teams/a", "ml-b": "/data/ckpt/b/"}},
              "discovery": {"timeoutSeconds": 30, "metadataMaxBytes": 268435456, "maxStepDirs": 100,
                            "workerMemoryBytes": 2147483648, "workers": 4},
              "resources": {"limits": {"memory": "9Gi"}}}  # fmt: skip
    env = env_of(render(helm, tmp_path, values))
    assert json.loads(env["RTJ_STORAGE_AREAS"]) == {"ml-a": "/data/ckpt/teams/a", "ml-b": "/data/ckpt/b/"}
    assert env["RTJ_DISCOVERY_TIMEOUT_SECONDS"] == "30" and env["RTJ_METADATA_MAX_BYTES"] == "268435456"
    assert env["RTJ_DISCOVERY_MAX_STEPS"] == "100" and env["RTJ_DISCOVERY_MEMORY_BYTES"] == "2147483648"
    assert env["RTJ_DISCOVERY_WORKERS"] == "4"
    # --set gives integers another type inside Helm: the env must read the same
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                      "--set", "discovery.workerMemoryBytes=268435456", "--set", "discovery.workers=3")
    assert result.returncode == 0, result.stderr
    env = env_of([d for d in yaml.safe_load_all(result.stdout) if d])
    assert env["RTJ_DISCOVERY_MEMORY_BYTES"] == "268435456" and env["RTJ_DISCOVERY_WORKERS"] == "3"


def test_default_memory_limit_holds_the_operator_and_every_worker(helm: str, tmp_path: Path) -> None:  # noqa: F811
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    limit = container(render(helm, tmp_path))["resources"]["limits"]["memory"]
    assert limit == "1536Mi"
    workers = values["discovery"]["workers"] * values["discovery"]["workerMemoryBytes"]
    assert 256 * 2**20 + workers + 128 * 2**20 <= 1536 * 2**20, "headroom above operator + workers"
    assert values["discovery"]["metadataMaxBytes"] * 4 <= values["discovery"]["workerMemoryBytes"]


TOO_SMALL = [
    ("limit below operator + workers", {"resources": {"limits": {"memory": "1Gi"}}}, "resources.limits.memory"),
    ("more workers, same limit", {"discovery": {"workers": 4}}, "resources.limits.memory"),
    ("limit in bytes", {"resources": {"limits": {"memory": 1073741824}}}, "resources.limits.memory"),
    ("limit in decimal units", {"resources": {"limits": {"memory": "1200M"}}}, "resources.limits.memory"),
    ("cap above a quarter of a worker", {"discovery": {"metadataMaxBytes": 268435456}}, "discovery.metadataMaxBytes"),
    ("area outside the mount", {"checkpointStorage": {"namespaceAreas": {"ml": "/etc/ml"}}},
     "checkpointStorage.namespaceAreas.ml"),
    ("area beside the mount", {"checkpointStorage": {"namespaceAreas": {"ml": "/checkpoints-x/ml"}}},
     "checkpointStorage.namespaceAreas.ml"),
    ("area is the whole mount", {"checkpointStorage": {"namespaceAreas": {"ml": "/checkpoints"}}},
     "checkpointStorage.namespaceAreas.ml"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "values", "where"), TOO_SMALL, ids=[t[0] for t in TOO_SMALL])
def test_inconsistent_sandbox_values_fail_the_render(helm: str, tmp_path: Path, case: str,  # noqa: F811
                                                     values: dict[str, Any], where: str) -> None:  # fmt: skip
    assert where in render_fails(helm, tmp_path, values), case


@pytest.mark.parametrize("values", [
    {"discovery": {"workers": 4}, "resources": {"limits": {"memory": "3Gi"}}},
    {"resources": {"limits": {"memory": "2000M"}}},
    {"resources": {"limits": {"memory": 1610612736}}},
    {"resources": {"limits": {"cpu": 1}}},  # helm merges maps: the default memory limit stays
    {"checkpointStorage": {"mountPath": "/data", "namespaceAreas": {"ml": "/data/ml"}}},
])  # fmt: skip
def test_consistent_sandbox_values_render(helm: str, tmp_path: Path, values: dict[str, Any]) -> None:  # noqa: F811
    render(helm, tmp_path, values)


def test_memory_limit_and_metadata_cap_are_documented_together() -> None:
    readme = (CHART / "README.md").read_text()
    section = readme[readme.index("## Memory"):]
    section = section[:section.index("\n## ", 1)]
    for word in ("resources.limits.memory", "discovery.workerMemoryBytes", "discovery.metadataMaxBytes", "1536Mi"):
        assert word in section, word


# ---- NetworkPolicy --------------------------------------------------------------------------------------
def test_network_policy_lets_in_metrics_and_health_and_out_the_api_server_and_dns(helm: str,  # noqa: F811
                                                                                  tmp_path: Path) -> None:  # fmt: skip
    docs = render(helm, tmp_path)
    policy = one(docs, "NetworkPolicy")["spec"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}]}]
    api, agents, dns = policy["egress"]
    assert agents == {"to": [{"namespaceSelector": {}}], "ports": [{"port": 29401, "protocol": "TCP"}]}
    assert api == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]  # fmt: skip
    assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"] and {p["port"] for p in dns["ports"]} == {53}
    ports = {p["containerPort"] for p in container(docs)["ports"]}
    assert ports == {p["port"] for p in policy["ingress"][0]["ports"]}, "ingress follows the container ports"


def test_network_policy_narrows_and_extends_from_values(helm: str, tmp_path: Path) -> None:  # noqa: F811
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    storage = {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 9000, "protocol": "TCP"}]}
    values = {"networkPolicy": {"ingressFrom": [monitoring], "extraEgress": [storage],
                                "apiServer": {"cidrs": ["10.96.0.1/32", "172.18.0.2/32"], "ports": [443]},
                                "dns": {"enabled": False}}}  # fmt: skip
    docs = render(helm, tmp_path, values)
    policy = one(docs, "NetworkPolicy")["spec"]
    assert policy["ingress"][0]["from"] == [monitoring]
    assert policy["egress"] == [
        {"ports": [{"port": 443, "protocol": "TCP"}],
         "to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "172.18.0.2/32"}}]},
        {"to": [{"namespaceSelector": {}}], "ports": [{"port": 29401, "protocol": "TCP"}]},  # the agents (POST /plan)
        storage,
    ]  # fmt: skip
    kubernetes_validate.validate(one(docs, "NetworkPolicy"), KUBE_VERSION, strict=True)
    assert not by_kind(render(helm, tmp_path, {"networkPolicy": {"enabled": False}}), "NetworkPolicy")


# ---- the example ValidatingAdmissionPolicy ----------------------------------------------------------------
def admission_docs(helm: str, tmp: Path, **values: Any) -> tuple[dict[str, Any], dict[str, Any]]:  # noqa: F811
    docs = render(helm, tmp, {"admissionPolicy": {"enabled": True, **values}})
    return one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")


def refusals(policy: dict[str, Any], job: dict[str, Any]) -> list[str]:
    """The policy's verdict on a job, evaluated as the API server does: variables first, then each rule."""
    env = celpy.Environment()
    variables: dict[Any, Any] = {}

    def activation() -> dict[str, Any]:
        return {"object": celpy.json_to_cel(job),
                "variables": celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})}

    for var in policy["spec"]["variables"]:
        variables[var["name"]] = env.program(env.compile(var["expression"])).evaluate(activation())
    return [rule["message"] for rule in policy["spec"]["validations"]
            if not bool(env.program(env.compile(rule["expression"])).evaluate(activation()))]  # fmt: skip


def example_job() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / "job.yaml").read_text())


def with_pod(**fields: Any) -> dict[str, Any]:
    job = example_job()
    job["spec"]["template"]["spec"].update(fields)
    return job


def with_container(index: int = 0, kind: str = "containers", **fields: Any) -> dict[str, Any]:
    job = example_job()
    spec = job["spec"]["template"]["spec"]
    spec.setdefault(kind, [{"name": "extra", "image": "busybox"}])
    spec[kind][index].update(copy.deepcopy(fields))
    return job


HOSTILE = [
    ("hostPath volume", with_pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), "hostPath"),
    ("privileged", with_container(securityContext={"privileged": True}), "privileged"),
    ("privileged init container", with_container(kind="initContainers", securityContext={"privileged": True}),
     "privileged"),
    ("privileged ephemeral container", with_container(kind="ephemeralContainers",
                                                      securityContext={"privileged": True}), "privileged"),
    ("SYS_ADMIN", with_container(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}),
     "capabilities"),
    ("hostNetwork", with_pod(hostNetwork=True), "hostNetwork"),
    ("hostPID", with_pod(hostPID=True), "hostPID"),
    ("hostIPC", with_pod(hostIPC=True), "hostIPC"),
    ("hostPort", with_container(ports=[{"containerPort": 29500, "hostPort": 29500}]), "hostPort"),
]  # fmt: skip
COMPLIANT = [
    ("the example job", example_job()),
    ("explicitly not privileged", with_container(securityContext={"privileged": False})),
    ("host flags false", with_pod(hostNetwork=False, hostPID=False, hostIPC=False)),
    ("NET_BIND_SERVICE only", with_container(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE"]}})),
    ("container port without a host port", with_container(ports=[{"containerPort": 29500}])),
    ("no volumes", with_pod(volumes=[])),
]  # fmt: skip


@pytest.mark.parametrize(("case", "job", "field"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_policy_refuses_host_access_naming_the_field(helm: str, tmp_path: Path, case: str,  # noqa: F811
                                                     job: dict[str, Any], field: str) -> None:  # fmt: skip
    policy, _ = admission_docs(helm, tmp_path)
    found = refusals(policy, job)
    assert len(found) == 1 and field in found[0] and "spec.template.spec" in found[0], (case, found)


@pytest.mark.parametrize(("case", "job"), COMPLIANT, ids=[c[0] for c in COMPLIANT])
def test_policy_admits_compliant_templates(helm: str, tmp_path: Path, case: str, job: dict[str, Any]) -> None:  # noqa: F811
    policy, _ = admission_docs(helm, tmp_path)
    assert refusals(policy, job) == [], case


def test_policy_is_off_by_default_and_valid_when_on(helm: str, tmp_path: Path) -> None:  # noqa: F811
    assert not by_kind(render(helm, tmp_path), "ValidatingAdmissionPolicy")
    policy, binding = admission_docs(helm, tmp_path)
    for doc in (policy, binding):
        assert doc["apiVersion"] == "admissionregistration.k8s.io/v1"
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["training.resilient.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
        "resources": ["resilienttrainingjobs"]}]  # fmt: skip
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]


def test_policy_namespaces_and_actions_are_parameters(helm: str, tmp_path: Path) -> None:  # noqa: F811
    _, binding = admission_docs(helm, tmp_path, namespaces=["ml-a", "ml-b"], validationActions=["Warn", "Audit"])
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml-a", "ml-b"]}]}  # fmt: skip
