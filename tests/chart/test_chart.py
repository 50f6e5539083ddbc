"""The Helm chart: renders, lints, validates against the Kubernetes 1.34 schemas, and keeps its promises.

Promises checked here: least-privilege RBAC (exactly the table below), the "restricted" Pod Security level,
checkpoint storage mounted read-only, two replicas behind a leader Lease that roll without a gap, the CRD a
byte-identical copy of crds/, and a values schema that refuses what the templates cannot honour.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.pod_security import restricted_violations

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "resilient-training-operator"
KUBE_VERSION = "1.34.0"
RELEASE = "rtj"
NAMESPACE = "rtj-system"
FULLNAME = "rtj-resilient-training-operator"  # the release's objects, the leader Lease

# The operator's rights, rule by rule: (apiGroup, resource) -> verbs, and why. The templates
# (templates/_helpers.tpl "rto.namespacedRules", templates/clusterrole.yaml) and these tables are the only
# places that list them. Every namespace watched: all in the ClusterRole. watchNamespaces set: the
# namespaced rules in a Role per watched namespace, the cluster facts in the ClusterRole.
RBAC_NAMESPACED = {
    ("training.resilient.dev", "resilienttrainingjobs"): {"list", "watch"},  # the cache; never a get by name
    ("training.resilient.dev", "resilienttrainingjobs/status"): {"patch"},  # the only writer of status
    ("", "pods"): {"list", "watch", "create", "delete", "patch"},  # create gangs, fence, the cache, relabel a kept pod
    ("", "services"): {"create"},  # the headless rendezvous Service (AlreadyExists is fine)
    ("", "events"): {"create"},  # kubectl describe tells the story; kopf's own events
    ("policy", "poddisruptionbudgets"): {"create", "delete"},  # one per attempt: kubectl drain waits
}
RBAC_CLUSTER = {
    ("", "nodes"): {"list", "watch"},  # node loss, capacity (the cache)
}
# Node heartbeats: a Role in kube-node-lease only, in every mode (issue 25: no other namespace's Leases).
RBAC_NODE_LEASES = {("coordination.k8s.io", "leases"): {"list", "watch"}}
NODE_LEASES_ROLE = "-node-leases"  # the suffix of that Role's (and its binding's) name


def node_lease_role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one Role that grants node Leases: in kube-node-lease, list + watch, bound to the operator."""
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith(NODE_LEASES_ROLE)]
    assert role["metadata"]["namespace"] == "kube-node-lease"
    assert granted(role) == RBAC_NODE_LEASES
    (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"].endswith(NODE_LEASES_ROLE)]
    assert binding["metadata"]["namespace"] == "kube-node-lease"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    return role
RBAC = RBAC_NAMESPACED | RBAC_CLUSTER
# kueue.enabled: the operator's Workloads beside the job rules; Kueue's cluster-scoped flavors and priorities.
RBAC_KUEUE_NAMESPACED = {
    ("kueue.x-k8s.io", "workloads"): {"list", "watch", "create", "delete"},  # cache; create; replace
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},  # released, Finished, reclaimablePods, PodsReady
}
RBAC_KUEUE_CLUSTER = {
    ("kueue.x-k8s.io", "resourceflavors"): {"list", "watch"},  # the admitted flavor's node labels
    ("kueue.x-k8s.io", "workloadpriorityclasses"): {"list", "watch"},  # the job's priority value
}

LABEL_KEYS = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by", "app.kubernetes.io/component", "app.kubernetes.io/part-of", "helm.sh/chart",
)  # fmt: skip

STORAGE_MODES = {
    "none": {},
    "existingClaim": {"checkpointStorage": {"existingClaim": "rtj-checkpoints"}},
    "hostPath": {"checkpointStorage": {"hostPath": "/srv/checkpoints"}},
}


# ---- helpers ----------------------------------------------------------------------------------------
@cache
def helm_binary() -> str | None:
    """helm from hack/k8s/build.sh's bin dir (or RTJ_K8S_BIN_DIR), else one on PATH."""
    try:
        from e2e.controlplane.binaries import bin_dir

        built = bin_dir() / "helm"
        if built.is_file():
            return str(built)
    except (OSError, subprocess.SubprocessError):
        pass
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    exe = helm_binary()
    if exe is None:
        pytest.skip("helm is not built yet: run `make binaries` (hack/k8s/build.sh) or put helm on PATH")
    return exe


def run_helm(helm: str, *args: str, values: dict[str, Any] | None = None,
             tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [helm, *args]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(path)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)


def render(helm: str, tmp: Path, values: dict[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", KUBE_VERSION, *extra, values=values or {}, tmp=tmp)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def env_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(docs)["env"]}


def granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """A (Cluster)Role's rules as (apiGroup, resource) -> verbs; no wildcards, nothing granted twice."""
    seen: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"no resourceNames/nonResourceURLs: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key not in seen, f"{key} granted twice"
                assert "*" not in rule["verbs"] and "*" not in (group, resource)
                seen[key] = set(rule["verbs"])
    return seen


# ---- rendering and schemas ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(STORAGE_MODES))
def test_every_rendered_object_validates_against_kubernetes_1_34(helm: str, tmp_path: Path, mode: str) -> None:
    docs = render(helm, tmp_path, STORAGE_MODES[mode], "--include-crds")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "Service", "Deployment", "NetworkPolicy", "Role", "RoleBinding", "Role", "RoleBinding",
                            "Role", "RoleBinding", "PodDisruptionBudget"])  # fmt: skip  # leader, node Leases, plan key
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_every_value_combination_validates(helm: str, tmp_path: Path) -> None:
    """Every optional block switched on at once still renders to valid objects."""
    values = {
        "image": {"tag": "0.2.0-rc.1", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"annotations": {"iam.example.com/role": "rtj"}},
        "watchNamespaces": ["ml-a", "ml-b"],
        "logLevel": "DEBUG",
        "checkpointStorage": {"existingClaim": "ck", "mountPath": "/mnt/ckpt", "supplementalGroups": [2000]},
        "metrics": {"service": {"annotations": {"prometheus.io/scrape": "true"}}},
        "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
        "podAnnotations": {"a": "b"},
        "podLabels": {"team": "ml-platform"},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                         "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
        "priorityClassName": "rtj-critical",
        "extraEnv": [{"name": "KOPF_EXTRA", "value": "1"},
                     {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "networkPolicy": {"ingressFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
                          "apiServer": {"cidrs": ["10.96.0.1/32", "192.168.0.10/32"], "ports": [6443]},
                          "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
                                           "ports": [{"port": 9000, "protocol": "TCP"}]}]},
        "admissionPolicy": {"enabled": True, "namespaces": ["ml-a"], "validationActions": ["Warn", "Audit"]},
        "kueue": {"enabled": True},
    }  # fmt: skip
    values["checkpointStorage"]["namespaceAreas"] = {"ml-a": "/mnt/ckpt/teams/a"}
    values["discovery"] = {"timeoutSeconds": 10, "metadataMaxBytes": 67108864, "maxStepDirs": 8,
                           "workerMemoryBytes": 268435456, "workers": 3}  # fmt: skip
    docs = render(helm, tmp_path, values)
    kinds = {d["kind"] for d in docs}
    assert {"Role", "RoleBinding", "NetworkPolicy", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"} <= kinds  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    spec = pod_spec(docs)
    assert container(docs)["image"] == "ghcr.io/resilient-training/resilient-training-operator:0.2.0-rc.1"
    assert spec["priorityClassName"] == "rtj-critical" and spec["securityContext"]["supplementalGroups"] == [2000]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    env = env_of(docs)
    assert env["RTJ_NAMESPACES"] == "ml-a,ml-b" and env["RTJ_LOG_LEVEL"] == "DEBUG"
    assert env["KOPF_EXTRA"] == "1" and env["NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"


@pytest.mark.parametrize("mode", list(STORAGE_MODES))
def test_helm_lint_strict(helm: str, tmp_path: Path, mode: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", KUBE_VERSION, values=STORAGE_MODES[mode], tmp=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_chart_crd_is_a_byte_identical_copy() -> None:
    chart_crds = sorted(p.name for p in (CHART / "crds").iterdir())
    repo_crds = sorted(p.name for p in (ROOT / "crds").iterdir())
    assert chart_crds == repo_crds
    for name in repo_crds:
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"charts/resilient-training-operator/crds/{name} differs from crds/{name}: copy it again")


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == "0.1.0" and chart["type"] == "application"
    project = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in project, "appVersion follows the project version"


BAD_VALUES = [
    ("both storage sources", {"checkpointStorage": {"existingClaim": "ck", "hostPath": "/srv/ck"}},
     "/checkpointStorage/hostPath"),
    ("relative hostPath", {"checkpointStorage": {"hostPath": "srv/ck"}}, "/checkpointStorage/hostPath"),
    ("mountPath over /tmp", {"checkpointStorage": {"mountPath": "/tmp"}}, "/checkpointStorage/mountPath"),
    ("relative mountPath", {"checkpointStorage": {"mountPath": "ckpt"}}, "/checkpointStorage/mountPath"),
    ("claim not a DNS name", {"checkpointStorage": {"existingClaim": "My_Claim"}},
     "/checkpointStorage/existingClaim"),
    ("unknown top-level key", {"replicas": 2}, "replicas"),
    ("unknown nested key", {"image": {"digest": "sha256:abc"}}, "digest"),
    ("log level", {"logLevel": "LOUD"}, "/logLevel"),
    ("namespace not a DNS label", {"watchNamespaces": ["ML_Team"]}, "/watchNamespaces/0"),
    ("namespace as a string", {"watchNamespaces": "ml"}, "/watchNamespaces"),
    ("pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("tag with a colon", {"image": {"tag": "v1:latest"}}, "/image/tag"),
    ("env without a name", {"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
    ("metrics flag as a string", {"metrics": {"enabled": "yes"}}, "/metrics/enabled"),
    ("area of a bad namespace", {"checkpointStorage": {"namespaceAreas": {"ML": "/checkpoints/ml"}}},
     "/checkpointStorage/namespaceAreas"),
    ("relative area", {"checkpointStorage": {"namespaceAreas": {"ml": "checkpoints/ml"}}},
     "/checkpointStorage/namespaceAreas/ml"),
    ("area with ..", {"checkpointStorage": {"namespaceAreas": {"ml": "/checkpoints/../etc"}}},
     "/checkpointStorage/namespaceAreas/ml"),
    ("areas as a list", {"checkpointStorage": {"namespaceAreas": ["/checkpoints/ml"]}},
     "/checkpointStorage/namespaceAreas"),
    ("timeout as a string", {"discovery": {"timeoutSeconds": "5"}}, "/discovery/timeoutSeconds"),
    ("no workers", {"discovery": {"workers": 0}}, "/discovery/workers"),
    ("fractional cap", {"discovery": {"metadataMaxBytes": 1.5}}, "/discovery/metadataMaxBytes"),
    ("zero step dirs", {"discovery": {"maxStepDirs": 0}}, "/discovery/maxStepDirs"),
    ("tiny worker", {"discovery": {"workerMemoryBytes": 1048576}}, "/discovery/workerMemoryBytes"),
    ("unknown discovery key", {"discovery": {"threads": 4}}, "threads"),
    ("api server port", {"networkPolicy": {"apiServer": {"ports": [70000]}}}, "/networkPolicy/apiServer/ports/0"),
    ("api server cidr", {"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.1"]}}},
     "/networkPolicy/apiServer/cidrs/0"),
    ("dns namespace", {"networkPolicy": {"dns": {"namespace": "Kube System"}}}, "/networkPolicy/dns/namespace"),
    ("egress rule with a typo", {"networkPolicy": {"extraEgress": [{"too": []}]}}, "/networkPolicy/extraEgress/0"),
    ("deny and warn", {"admissionPolicy": {"validationActions": ["Deny", "Warn"]}},
     "/admissionPolicy/validationActions"),
    ("unknown action", {"admissionPolicy": {"validationActions": ["Block"]}}, "/admissionPolicy/validationActions"),
    ("policy namespace", {"admissionPolicy": {"namespaces": ["ML_A"]}}, "/admissionPolicy/namespaces/0"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "values", "where"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_values_schema_rejects_bad_values(helm: str, tmp_path: Path, case: str, values: dict[str, Any],
                                          where: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                      values=values, tmp=tmp_path)
    assert result.returncode != 0, f"{case}: rendered although the values are invalid"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert where in result.stderr, result.stderr


def test_values_schema_is_strict_json_schema() -> None:
    """additionalProperties: false on every object block of values.yaml (a typo never passes silently)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    open_maps = {"podAnnotations", "podLabels", "nodeSelector", "affinity", "resources"}
    for key, value in values.items():
        assert key in schema["properties"], f"values.yaml key {key} is not in values.schema.json"
        if isinstance(value, dict) and key not in open_maps:
            assert schema["properties"][key].get("additionalProperties") is False, key


# ---- the promises -------------------------------------------------------------------------------------
def test_cluster_role_is_exactly_the_least_privilege_table(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path)
    role = one(docs, "ClusterRole")
    assert granted(role) == RBAC
    node_lease_role(docs)  # node heartbeats: kube-node-lease only
    # leader election's Role, on the one Lease in the release namespace (the plan key's: test_plan_key_chart.py)
    (leader,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader")]
    assert leader["metadata"]["namespace"] == NAMESPACE
    assert leader["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [FULLNAME],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]  # fmt: skip
    (leader_binding,) = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"].endswith("-leader")]
    assert leader_binding["roleRef"]["name"] == leader["metadata"]["name"]

    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": NAMESPACE}]  # fmt: skip
    assert pod_spec(docs)["serviceAccountName"] == sa["metadata"]["name"]


def test_node_patch_is_granted_only_with_cluster_wide_bad_node_tainting(helm: str, tmp_path: Path) -> None:
    def node_verbs(docs: list[dict[str, Any]]) -> set[str]:
        return {v for r in one(docs, "ClusterRole")["rules"] if "nodes" in r["resources"] for v in r["verbs"]}

    assert "patch" not in node_verbs(render(helm, tmp_path))
    docs = render(helm, tmp_path, {"badNodes": {"clusterTaint": {"enabled": True, "failures": 2}}})
    assert node_verbs(docs) == {"get", "list", "watch", "patch"}
    env = env_of(docs)
    assert env["RTJ_BAD_NODE_TAINT"] == "training.resilient.dev/bad-node" and env["RTJ_BAD_NODE_FAILURES"] == "2"
    assert "RTJ_BAD_NODE_TAINT" not in env_of(render(helm, tmp_path))
    assert "aws-node-termination-handler/spot-itn" in env["RTJ_DRAIN_TAINTS"].split(",")


def test_kueue_rbac_and_env_only_when_enabled(helm: str, tmp_path: Path) -> None:
    assert "RTJ_KUEUE_ENABLED" not in env_of(render(helm, tmp_path))  # off by default: the table above
    docs = render(helm, tmp_path, {"kueue": {"enabled": True}})
    assert granted(one(docs, "ClusterRole")) == RBAC | RBAC_KUEUE_NAMESPACED | RBAC_KUEUE_CLUSTER
    assert env_of(docs)["RTJ_KUEUE_ENABLED"] == "true"
    docs = render(helm, tmp_path, {"kueue": {"enabled": True}, "watchNamespaces": ["ml-a"]})
    assert granted(one(docs, "ClusterRole")) == RBAC_CLUSTER | RBAC_KUEUE_CLUSTER
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["namespace"] == "ml-a"]
    assert granted(role) == RBAC_NAMESPACED | RBAC_KUEUE_NAMESPACED


def test_rbac_and_service_account_can_be_turned_off(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"rbac": {"create": False}, "watchNamespaces": ["ml-a"],
                                   "serviceAccount": {"create": False, "name": "ops-managed"}})  # fmt: skip
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    assert not by_kind(docs, "ServiceAccount")
    assert pod_spec(docs)["serviceAccountName"] == "ops-managed"


def test_service_account_token_is_mounted(helm: str, tmp_path: Path) -> None:
    """The operator uses in-cluster config."""
    docs = render(helm, tmp_path)
    assert one(docs, "ServiceAccount").get("automountServiceAccountToken", True) is True
    assert pod_spec(docs)["automountServiceAccountToken"] is True


@pytest.mark.parametrize("mode", ["none", "existingClaim"])
def test_pod_passes_the_restricted_pod_security_standard(helm: str, tmp_path: Path, mode: str) -> None:
    docs = render(helm, tmp_path, STORAGE_MODES[mode])
    spec = pod_spec(docs)
    assert restricted_violations(spec) == []
    # The specific settings the issue asks for, beyond what the profile requires.
    assert spec["securityContext"]["runAsUser"] == 65532 and spec["securityContext"]["runAsNonRoot"] is True
    sc = container(docs)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    # A read-only root needs a writable /tmp.
    mounts = {m["mountPath"]: m["name"] for m in container(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_host_path_mode_is_the_one_documented_exception(helm: str, tmp_path: Path) -> None:
    """hostPath volumes are refused by the baseline and restricted levels: that mode needs a privileged namespace."""
    docs = render(helm, tmp_path, STORAGE_MODES["hostPath"])
    assert restricted_violations(pod_spec(docs)) == ["volume checkpoints has a disallowed type ['hostPath']"]
    readme = (CHART / "README.md").read_text()
    assert "hostPath" in readme and "privileged" in readme


@pytest.mark.parametrize("mode", ["existingClaim", "hostPath"])
def test_checkpoint_storage_is_mounted_read_only(helm: str, tmp_path: Path, mode: str) -> None:
    docs = render(helm, tmp_path, STORAGE_MODES[mode])
    spec = pod_spec(docs)
    volume = next(v for v in spec["volumes"] if v["name"] == "checkpoints")
    if mode == "existingClaim":
        assert volume["persistentVolumeClaim"] == {"claimName": "rtj-checkpoints", "readOnly": True}
    else:
        assert volume["hostPath"] == {"path": "/srv/checkpoints", "type": "Directory"}
    mounts = [m for m in container(docs)["volumeMounts"] if m["name"] == "checkpoints"]
    assert mounts == [{"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}]
    assert env_of(docs)["RTJ_CHECKPOINT_MOUNT"] == "/checkpoints"


def test_mount_path_is_configurable(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"checkpointStorage": {"existingClaim": "ck", "mountPath": "/data/ckpt"}})
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert mounts["checkpoints"]["mountPath"] == "/data/ckpt" and mounts["checkpoints"]["readOnly"] is True


def test_without_storage_nothing_is_mounted(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path)
    assert [v["name"] for v in pod_spec(docs)["volumes"]] == ["tmp"]
    assert "RTJ_CHECKPOINT_MOUNT" not in env_of(docs)


def test_two_replicas_behind_a_lease_that_roll_without_a_gap(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path)
    deploy = one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}  # fmt: skip
    env = env_of(docs)
    assert env["RTJ_LEADER_LEASE_NAME"] == FULLNAME
    assert (env["RTJ_LEASE_DURATION_SECONDS"], env["RTJ_RENEW_DEADLINE_SECONDS"],
            env["RTJ_RETRY_PERIOD_SECONDS"]) == ("15", "10", "2")  # fmt: skip
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": deploy["spec"]["selector"]}
    (term,) = pod_spec(docs)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    # a user's affinity replaces the default; the timings are values; their order is checked
    docs = render(helm, tmp_path, {"replicaCount": 3, "podDisruptionBudget": {"enabled": False},
                                   "affinity": {"nodeAffinity": {}},
                                   "leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20,
                                                      "retryPeriodSeconds": 4}})  # fmt: skip
    assert one(docs, "Deployment")["spec"]["replicas"] == 3 and not by_kind(docs, "PodDisruptionBudget")
    assert pod_spec(docs)["affinity"] == {"nodeAffinity": {}}
    assert env_of(docs)["RTJ_LEASE_DURATION_SECONDS"] == "30"
    bad = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                   values={"leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10,
                                              "retryPeriodSeconds": 2}}, tmp=tmp_path)  # fmt: skip
    assert bad.returncode != 0 and "renewDeadlineSeconds (10) < leaseDurationSeconds (10)" in bad.stderr


def test_operator_container(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path)
    c = container(docs)
    assert c["command"] == ["python", "-m", "resilient_operator"]
    assert c["image"] == "ghcr.io/resilient-training/resilient-training-operator:0.1.0"  # tag "" -> appVersion
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 8080, "health": 8081}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"] == "1536Mi"
    env = env_of(docs)
    assert env["RTJ_METRICS_PORT"] == "8080" and env["RTJ_HEALTH_PORT"] == "8081"
    assert env["RTJ_NAMESPACES"] == "" and env["RTJ_LOG_LEVEL"] == "INFO"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    spec = pod_spec(docs)
    assert "priorityClassName" not in spec  # empty by default (documented in values.yaml)


def test_metrics_service(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path)
    svc = one(docs, "Service")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert not by_kind(render(helm, tmp_path, {"metrics": {"enabled": False}}), "Service")


def test_service_monitor_and_dashboard_are_off_by_default_and_valid_when_on(helm: str, tmp_path: Path) -> None:
    """Off by default (no monitoring CRDs needed); on, the ServiceMonitor scrapes the metrics Service and
    the dashboard ConfigMap carries the Grafana sidecar's label and a dashboard over our metrics."""
    docs = render(helm, tmp_path)
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "ConfigMap")
    docs = render(helm, tmp_path, {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                                               "dashboard": {"enabled": True}}})
    monitor, svc = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]
    board = one(docs, "ConfigMap")
    kubernetes_validate.validate(board, KUBE_VERSION, strict=True)
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(board["data"]["resilient-training.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("rtj_goodput_ratio", "rtj_lost_seconds", "rtj_restarts_total", "rtj_recovery_seconds_bucket",
                   "rtj_step_seconds", "rtj_steps_recomputed"):
        assert metric in exprs, metric


def test_standard_labels_on_every_object(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert set(LABEL_KEYS) <= set(labels), (doc["kind"], labels)
        assert labels["app.kubernetes.io/name"] == "resilient-training-operator"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "resilient-training"
        assert labels["app.kubernetes.io/component"] == "operator"
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            expected = "kube-node-lease" if doc["metadata"]["name"].endswith(NODE_LEASES_ROLE) else NAMESPACE
            assert doc["metadata"]["namespace"] == expected, doc["kind"]
    deploy = one(docs, "Deployment")
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance"}  # immutable: no version
    assert selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()


def test_names_fit_in_a_dns_label(helm: str, tmp_path: Path) -> None:
    long_release = "a-very-long-release-name-for-a-platform-team-cluster"
    result = run_helm(helm, "template", long_release, str(CHART), "--kube-version", KUBE_VERSION,
                      values={}, tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    for doc in yaml.safe_load_all(result.stdout):
        if doc:
            assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
