"""What the simulated kubelet reads out of a pod spec (pure: no root, no cluster)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from e2e.localcluster import podspec
from e2e.localcluster.cluster import DEFAULT_IMAGE_ENTRYPOINTS

TABLE = {"resilient-training-trainer": {"command": ["rtj-launch", "--"], "args": ["-m", "tiny"], "user": 1000,
                                        "group": 1000},
         "python": ["python"]}


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w-0", "namespace": "ns1", "uid": "u-1", "labels": {"b": "2", "a": "1"},
                         "annotations": {"note": "x"}},
            "spec": {"containers": [{"name": "main", "image": "python:3.11"}], **spec}}


def ctx(p: dict[str, Any] | None = None) -> podspec.PodContext:
    return podspec.PodContext(pod=p or pod(), node="node-1", pod_ip="10.100.1.2", host_ip="10.100.1.1",
                              api_host="10.100.0.1", api_port=6443, python_bin_dir="/venv/bin",
                              image_entrypoints=TABLE)


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


CM = {("configmaps", "cfg"): {"data": {"A": "from-cm", "B": "b"}}}
SECRET = {("secrets", "creds"): {"data": {"TOKEN": b64("s3cret")}}}


@pytest.mark.parametrize(("value", "env", "expected"), [
    ("$(A)-$(B)", {"A": "1", "B": "2"}, "1-2"),
    ("$(MISSING)", {}, "$(MISSING)"),       # unknown names stay as written
    ("$$(A)", {"A": "1"}, "$(A)"),          # $$ escapes
    ("$(A", {"A": "1"}, "$(A"),             # unterminated
    ("plain", {}, "plain"),
])
def test_expand(value: str, env: dict[str, str], expected: str) -> None:
    assert podspec.expand(value, env) == expected


@pytest.mark.parametrize(("path", "expected"), [
    ("metadata.name", "w-0"), ("metadata.namespace", "ns1"), ("metadata.uid", "u-1"),
    ("spec.nodeName", "node-1"), ("status.podIP", "10.100.1.2"), ("status.hostIP", "10.100.1.1"),
    ("metadata.labels", 'a="1"\nb="2"'), ("metadata.labels['b']", "2"), ("metadata.annotations['note']", "x"),
    ("metadata.labels['absent']", ""),
])
def test_downward_api_fields(path: str, expected: str) -> None:
    assert podspec.field_value(ctx(), path) == expected


def test_unsupported_field_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="unsupported fieldRef"):
        podspec.field_value(ctx(), "status.phase")


def test_env_in_kubelet_order_with_service_variables_and_value_from() -> None:
    c = {"name": "main", "resources": {"limits": {"cpu": "2"}},
         "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CM_"}],
         "env": [{"name": "A", "value": "plain"},
                 {"name": "B", "value": "$(A)/$(CM_A)/$(KUBERNETES_SERVICE_HOST)"},
                 {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                 {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                 {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
                 {"name": "T", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "TOKEN"}}},
                 {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "B"}}}]}
    env = podspec.container_env(ctx(), c, {**CM, **SECRET})
    assert env["PATH"].startswith("/venv/bin:") and env["HOSTNAME"] == "w-0"
    assert env["KUBERNETES_SERVICE_HOST"] == "10.100.0.1" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["CM_A"] == "from-cm" and env["B"] == "plain/from-cm/10.100.0.1"
    assert (env["POD"], env["CPU"], env["MEM"], env["T"], env["K"]) == ("w-0", "2", "0", "s3cret", "b")
    assert podspec.container_references(c) == {("configmaps", "cfg"), ("secrets", "creds")}


@pytest.mark.parametrize("env_entry", [
    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}},
    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nokey"}}},
    {"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}},
])
def test_missing_required_reference_is_a_config_error_optional_is_skipped(env_entry: dict[str, Any]) -> None:
    with pytest.raises(podspec.MissingReference):
        podspec.container_env(ctx(), {"name": "m", "env": [env_entry]}, CM)
    ref = next(iter(env_entry["valueFrom"].values()))
    ref["optional"] = True
    assert "X" not in podspec.container_env(ctx(), {"name": "m", "env": [env_entry]}, CM)


def test_env_from_a_missing_optional_secret_adds_nothing() -> None:
    c = {"name": "m", "envFrom": [{"secretRef": {"name": "nope", "optional": True}}]}
    assert not {k for k in podspec.container_env(ctx(), c, {}) if k.startswith("TOKEN")}
    with pytest.raises(podspec.MissingReference):
        podspec.container_env(ctx(), {"name": "m", "envFrom": [{"secretRef": {"name": "nope"}}]}, {})


@pytest.mark.parametrize(("container", "expected"), [
    ({"image": "x", "command": ["sh", "-c"], "args": ["echo $(A)"]}, ["sh", "-c", "echo 1"]),
    ({"image": "reg/resilient-training-trainer:e2e"}, ["rtj-launch", "--", "-m", "tiny"]),  # ENTRYPOINT + CMD
    ({"image": "reg/resilient-training-trainer:e2e", "args": ["-m", "other"]},
     ["rtj-launch", "--", "-m", "other"]),                                               # args replace CMD
    ({"image": "reg/resilient-training-trainer:e2e", "command": ["python"]}, ["python"]),  # command drops CMD
    ({"image": "python:3.11", "args": ["-c", "pass"]}, ["python", "-c", "pass"]),
])
def test_command_and_args_against_the_image(container: dict[str, Any], expected: list[str]) -> None:
    assert podspec.container_argv(container, {"A": "1"}, TABLE) == expected


def test_no_command_and_no_mapped_image_is_err_image_pull() -> None:
    with pytest.raises(podspec.NoEntrypoint):
        podspec.container_argv({"image": "ghcr.io/unknown:1"}, {}, TABLE)


def test_longest_image_substring_wins() -> None:
    table = {"python": ["python"], "python-special": ["special"]}
    assert podspec.image_defaults("reg/python-special:1", table) == {"command": ["special"]}


def test_security_context_image_user_and_overrides() -> None:
    trainer = {"name": "m", "image": "resilient-training-trainer"}
    out, env = podspec.security_context(pod(securityContext={"fsGroup": 7, "supplementalGroups": [5]}), trainer,
                                        TABLE, keep=("/repo", "/venv", "/repo"), expose=("/usr",))
    assert out["user"] == {"uid": 1000, "gid": 1000, "groups": [5, 7]} and out["expose"] == ["/usr"]
    assert out["keep"] == ["/repo", "/venv"] and env == {"HOME": "/"}
    root, env = podspec.security_context(pod(), {"name": "m", "image": "python", "securityContext": {
        "readOnlyRootFilesystem": True}}, TABLE, keep=(), expose=())
    assert "user" not in root and root["readOnlyRootFilesystem"] and env == {}
    own_home = {**trainer, "env": [{"name": "HOME", "value": "/h"}], "securityContext": {"runAsUser": 5}}
    out, env = podspec.security_context(pod(), own_home, TABLE, keep=(), expose=())
    assert out["user"]["uid"] == 5 and env == {}


def test_volume_kinds_and_files() -> None:
    assert podspec.volume_kind({"name": "a", "emptyDir": {}}) == "emptyDir"
    assert podspec.volume_kind({"name": "a", "persistentVolumeClaim": {"claimName": "c"}}) == "persistentVolumeClaim"
    with pytest.raises(RuntimeError, match="unsupported source"):
        podspec.volume_kind({"name": "a", "iscsi": {}})
    cm = {"name": "v", "configMap": {"name": "cfg", "items": [{"key": "A", "path": "sub/a.txt"}]}}
    assert podspec.volume_files(ctx(), cm, CM, {}) == {"sub/a.txt": b"from-cm"}
    secret = {"name": "v", "secret": {"secretName": "creds"}}
    assert podspec.volume_files(ctx(), secret, SECRET, {}) == {"TOKEN": b"s3cret"}
    assert podspec.volume_files(ctx(), {"name": "v", "secret": {"secretName": "no", "optional": True}}, {}, {}) == {}
    with pytest.raises(podspec.MissingReference):
        podspec.volume_files(ctx(), {"name": "v", "configMap": {"name": "no"}}, {}, {})


def test_projected_service_account_volume() -> None:
    vol = {"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}
    assert podspec.token_requests(vol) == {(None, 3607)}
    assert podspec.volume_references(vol) == {("configmaps", "kube-root-ca.crt")}
    objects = {("configmaps", "kube-root-ca.crt"): {"data": {"ca.crt": "PEM"}}}
    files = podspec.volume_files(ctx(), vol, objects, {(None, 3607): "tok"})
    assert files == {"token": b"tok", "ca.crt": b"PEM", "namespace": b"ns1"}


def test_pv_host_path() -> None:
    assert podspec.pv_host_path({"metadata": {"name": "pv"}, "spec": {"local": {"path": "/d"}}}) == "/d"
    with pytest.raises(RuntimeError, match="no hostPath"):
        podspec.pv_host_path({"metadata": {"name": "pv"}, "spec": {"nfs": {}}})


def test_hosts_and_resolv() -> None:
    p = pod(hostname="w0", subdomain="job")
    hosts = podspec.hosts_file(ctx(p), ["10.100.2.2\tw1.job.ns1.svc.cluster.local"]).splitlines()
    assert "10.100.1.2\tw0.job.ns1.svc.cluster.local w0" in hosts
    assert hosts[3].startswith("10.100.0.1\tkubernetes ") and hosts[-1].startswith("10.100.2.2\t")
    assert podspec.resolv_conf("ns1").startswith("search ns1.svc.cluster.local svc.cluster.local")


def _peer(name: str, ns: str, ready: bool, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, **extra},
            "spec": {"hostname": name, "subdomain": "job"},
            "status": {"podIP": f"10.100.1.{len(name)}",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_dns_records_like_coredns_for_headless_services() -> None:
    svc = {"metadata": {"name": "job", "namespace": "ns1"}, "spec": {"clusterIP": "None"}}
    pods = [_peer("ready", "ns1", True), _peer("notready", "ns1", False),
            _peer("going", "ns1", True, deletionTimestamp="t"), _peer("other", "ns2", True)]
    lines = podspec.dns_records(pods, [svc], "ns1")
    assert lines == ["10.100.1.5\tready.job.ns1.svc.cluster.local ready.job.ns1.svc ready.job.ns1 ready.job"]
    assert podspec.dns_records(pods, [svc], "ns9")[0].endswith("ready.job.ns1")  # no short name across namespaces
    published = {**svc, "spec": {"clusterIP": "None", "publishNotReadyAddresses": True}}
    assert len(podspec.dns_records(pods, [published], "ns1")) == 2


def test_pod_ips_per_node_and_reuse_after_reboot() -> None:
    mine = podspec.node_pod_ips(100, 3)
    assert mine[0] == "10.100.3.2" and mine[-1] == "10.100.3.254" and len(mine) == 253
    assert podspec.pick_pod_ip({"status": {"podIP": "10.100.3.9"}}, mine, {"10.100.3.9"}) == "10.100.3.9"
    assert podspec.pick_pod_ip({"status": {"podIP": "10.100.4.9"}}, mine, {"10.100.3.2"}) == "10.100.3.3"
    with pytest.raises(RuntimeError, match="out of pod IPs"):
        podspec.pick_pod_ip({}, mine, set(mine))
    # New pods do not take a just-freed address (a stale neighbour entry would black-hole them for ~8 s)
    picks = [podspec.pick_pod_ip({"metadata": {"uid": f"uid-{i}"}}, mine, set()) for i in range(20)]
    assert len(set(picks)) >= 15 and picks == [podspec.pick_pod_ip({"metadata": {"uid": f"uid-{i}"}}, mine, set())
                                                for i in range(20)]


@pytest.mark.parametrize(("policy", "code", "restart"), [
    ("Always", 0, True), ("OnFailure", 0, False), ("OnFailure", 1, True), ("Never", 1, False)])
def test_restart_policy(policy: str, code: int, restart: bool) -> None:
    assert podspec.should_restart(policy, code) is restart


def test_exit_codes_and_probe_ports() -> None:
    assert (podspec.exit_code(-9), podspec.exit_code(3)) == (137, 3)
    c = {"ports": [{"name": "http", "containerPort": 8080}]}
    assert podspec.probe_port({"httpGet": {"port": "http"}}, c) == 8080
    assert podspec.probe_port({"tcpSocket": {"port": 99}}, c) == 99


@pytest.mark.timeout(20)
def test_a_sandbox_that_fails_to_set_up_is_retried_until_it_works_as_the_kubelet_does() -> None:
    """A PVC read refused for a moment (the node authorizer has not seen the binding yet) costs a retry,
    not a CreateContainerConfigError: the kubelet retries FailedMount while the pod stays ContainerCreating."""
    import threading

    from e2e.localcluster.kubeapi import ApiError
    from e2e.localcluster.pod_runtime import PodRuntime

    runtime = PodRuntime.__new__(PodRuntime)
    runtime.ns, runtime.pod_name, runtime.pod = "t", "w-0", {"metadata": {}}
    runtime.removed, runtime.wake = threading.Event(), threading.Event()
    calls: list[int] = []

    def setup() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ApiError(403, "persistentvolumeclaims is forbidden: User system:node:w1 cannot get")

    runtime.setup = setup  # type: ignore[method-assign]
    runtime.setup_until_ready()
    assert len(calls) == 3

    runtime.removed.set()  # deleted while retrying: the worker stops trying
    calls.clear()
    runtime.setup_until_ready()
    assert calls == []


def test_image_env_comes_first_and_the_container_env_overrides_it() -> None:
    table = {"trainer": {"command": ["rtj-launch"], "env": {"OMP_NUM_THREADS": "1", "X": "image", "PATH": "/img"}}}
    c = {"name": "main", "image": "ghcr.io/x/trainer:1", "env": [{"name": "X", "value": "pod"}]}
    env = podspec.container_env(dataclasses.replace(ctx(), image_entrypoints=table), c, {})
    assert env["OMP_NUM_THREADS"] == "1" and env["X"] == "pod"
    assert env["PATH"].startswith("/venv/bin:")  # the venv stands in for the image's filesystem
    assert "OMP_NUM_THREADS" not in podspec.container_env(ctx(), {"name": "m", "image": "python:3.11"}, {})


def _dockerfile_final_stage(path: Path) -> tuple[dict[str, str], str, list[str], list[str]]:
    """The last stage's ENV (continuation lines joined), USER, ENTRYPOINT and CMD."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    stage = re.split(r"^FROM .*$", text, flags=re.M)[-1]
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.*)$", stage, re.M):
        env.update(shlex.split(pair)[0].split("=", 1) for pair in line.split())  # type: ignore[misc]
    user = re.findall(r"^USER (\S+)$", stage, re.M)[-1]
    entry = re.findall(r"^ENTRYPOINT (\[.*\])$", stage, re.M)
    cmd = re.findall(r"^CMD (\[.*\])$", stage, re.M)
    return env, user, json.loads(entry[-1]) if entry else [], json.loads(cmd[-1]) if cmd else []


@pytest.mark.parametrize(("image", "dockerfile"), [("resilient-training-operator", "operator/Dockerfile"),
                                                   ("resilient-training-trainer", "trainer_image/Dockerfile")])
def test_the_simulated_images_are_what_the_dockerfiles_build(image: str, dockerfile: str) -> None:
    """The simulated nodes' stand-in for an image (no images exist there) is a copy of what its Dockerfile says:
    ENTRYPOINT, CMD, USER and ENV (all of it but PATH and HOME, which the venv and the sandbox decide)."""
    env, user, entry, cmd = _dockerfile_final_stage(Path(__file__).resolve().parents[2] / dockerfile)
    sim = DEFAULT_IMAGE_ENTRYPOINTS[image]
    assert sim["command"] == entry and sim.get("args", []) == cmd
    assert f"{sim['user']}:{sim['group']}" == user
    assert sim["env"] == {k: v for k, v in env.items() if k not in ("PATH", "HOME")}


def test_dns_fields_change_exactly_when_a_pods_dns_records_can() -> None:
    """The node agents rewrite /etc/hosts only when a pod's `dns_fields` change: a relabel or a status write that
    leaves them alone must leave every record alone, and each field the records read must show in them."""
    svc = {"metadata": {"name": "job", "namespace": "ns1"}, "spec": {"clusterIP": "None"}}
    base = _peer("w0", "ns1", True, labels={"attempt": "1"})
    relabelled = {**base, "metadata": {**base["metadata"], "labels": {"attempt": "2"}, "annotations": {"a": "b"}},
                  "status": {**base["status"], "phase": "Running", "containerStatuses": [{"name": "x"}]}}
    assert podspec.dns_fields(relabelled) == podspec.dns_fields(base)
    assert podspec.dns_records([relabelled], [svc], "ns1") == podspec.dns_records([base], [svc], "ns1")
    changes = [{**base, "status": {**base["status"], "podIP": "10.100.1.9"}},
               _peer("w0", "ns1", False),
               {**base, "metadata": {**base["metadata"], "deletionTimestamp": "t"}},
               {**base, "spec": {**base["spec"], "hostname": "w9"}}]
    for changed in changes:
        assert podspec.dns_fields(changed) != podspec.dns_fields(base)
        assert podspec.dns_records([changed], [svc], "ns1") != podspec.dns_records([base], [svc], "ns1")
    assert podspec.dns_fields(None) != podspec.dns_fields(base)  # a deletion is a change
