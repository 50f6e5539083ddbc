"""In-place restarts, the operator's side, against the real API server: the plan-signing key's Secret
(plankey.py) created once and shared, under exactly the chart's Role; the uid-guarded relabel of a kept pod;
and a delivery end to end (a signed plan to an agent in a thread, then the pod relabelled)."""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import ClusterLike, wait_for
from resilient_contract import plan
from resilient_operator import delivery, plankey
from resilient_operator.core.plan import Delivery
from resilient_operator.kube import Kube
from tests.operator.test_delivery import JOB_UID, Agent, Outcomes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
CHART = Path(__file__).resolve().parents[2] / "charts" / "resilient-training-operator"
SA = "rtj-operator"  # the ServiceAccount the rendered RoleBinding names (serviceAccount.name)


@pytest.fixture
def core(cluster: ClusterLike) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client())


def as_operator(cluster: ClusterLike, namespace: str) -> client.CoreV1Api:
    """A client that is the operator's ServiceAccount (impersonated by the admin): RBAC judges each call."""
    api = cluster.api_client(shared=False)  # its own: the header must not reach the suite's shared client
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{SA}")
    return client.CoreV1Api(api)


def install_key_role(cluster: ClusterLike, namespace: str) -> str:
    """The chart's plan-key Role and RoleBinding, rendered for `namespace` as the release namespace; the
    Secret name they grant."""
    out = cluster.helm("template", "rtj", str(CHART), "--namespace", namespace, "--show-only",
                       "templates/plan-key.yaml", "--set", f"serviceAccount.name={SA}").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    (role,) = [d for d in docs if d["kind"] == "Role"]
    return str(role["rules"][0]["resourceNames"][0])


def test_the_key_is_created_once_and_read_back_under_the_charts_role_only(cluster: ClusterLike, namespace: str,
                                                                           core: client.CoreV1Api) -> None:
    name = install_key_role(cluster, namespace)
    operator = as_operator(cluster, namespace)
    # the RoleBinding takes effect when the API server's RBAC cache has it
    first = wait_for(lambda: _or_none(lambda: plankey.load_or_create(operator, namespace, name)), 30,
                     "the operator's Role to take effect")
    again = plankey.load_or_create(operator, namespace, name)
    assert again.private == first.private and again.public == plan.public_key(first.private)
    secret = core.read_namespaced_secret(name, namespace)
    assert secret.immutable is True and set(secret.data) == {plankey.DATA_KEY}
    assert base64.b64decode(secret.data[plankey.DATA_KEY]) == first.private
    # least privilege: no other Secret, no list, no change to this one
    core.create_namespaced_secret(namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="tenant-creds"),
                                                             string_data={"token": "x"}))
    for call in (lambda: operator.read_namespaced_secret("tenant-creds", namespace),
                 lambda: operator.list_namespaced_secret(namespace),
                 lambda: operator.delete_namespaced_secret(name, namespace),
                 lambda: operator.patch_namespaced_secret(name, namespace, {"metadata": {"labels": {"a": "b"}}})):
        with pytest.raises(ApiException) as denied:
            call()
        assert denied.value.status == 403
    # the Role is namespaced: the same name in another namespace is out of reach
    with pytest.raises(ApiException) as elsewhere:
        operator.read_namespaced_secret(name, "default")
    assert elsewhere.value.status == 403


def _or_none(call: Any) -> Any:
    try:
        return call()
    except ApiException as exc:
        if exc.status == 403:
            return None
        raise


class LateReader(client.CoreV1Api):
    """A replica whose read happened before another replica's create: the read says 404 once the rival has
    created the Secret, so this replica's own create meets a 409 (the race, made deterministic)."""

    def __init__(self, api: client.ApiClient, rival: Any) -> None:
        super().__init__(api)
        self.rival, self.raced = rival, False

    def read_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> Any:
        if not self.raced:
            self.raced = True
            self.rival()
            raise ApiException(status=404, reason="Not Found")
        return super().read_namespaced_secret(name, namespace, **kw)


def test_two_replicas_starting_together_sign_with_one_key(cluster: ClusterLike, namespace: str,
                                                          core: client.CoreV1Api) -> None:
    won: list[plankey.PlanKey] = []
    late = LateReader(cluster.api_client(), lambda: won.append(plankey.load_or_create(core, namespace, "k")))
    lost = plankey.load_or_create(late, namespace, "k")
    assert won and lost.private == won[0].private


def test_a_malformed_key_stops_the_operator_and_is_never_replaced(namespace: str, core: client.CoreV1Api) -> None:
    core.create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="bad"), data={plankey.DATA_KEY: base64.b64encode(b"short").decode()}))
    with pytest.raises(plankey.PlanKeyError, match="delete it"):
        plankey.load_or_create(core, namespace, "bad")
    assert base64.b64decode(core.read_namespaced_secret("bad", namespace).data[plankey.DATA_KEY]) == b"short"
    assert "private" not in repr(plankey.PlanKey(b"k" * 32, "pub"))  # never the private half in a log line


def pending_pod(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    """A pod that never schedules (no node has the label): only its metadata matters here."""
    return core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"training.resilient.dev/attempt": "2", "keep": "me"}},
        "spec": {"nodeSelector": {"rtj-test": "nowhere"},
                 "containers": [{"name": "main", "image": "python:3.11", "command": ["true"]}]}})


def test_the_relabel_is_guarded_by_the_pods_uid(namespace: str, core: client.CoreV1Api, cluster: ClusterLike) -> None:
    kube = Kube(cluster.api_client())
    pod = pending_pod(core, namespace, "w-0")
    labels, notes = {"training.resilient.dev/attempt": "3"}, {"training.resilient.dev/in-place": "3"}
    assert kube.patch_pod_metadata(namespace, "w-0", "another-uid", labels, notes) is False
    assert core.read_namespaced_pod("w-0", namespace).metadata.labels["training.resilient.dev/attempt"] == "2"
    assert kube.patch_pod_metadata(namespace, "w-0", pod.metadata.uid, labels, notes) is True
    meta = core.read_namespaced_pod("w-0", namespace).metadata
    assert meta.labels == {"training.resilient.dev/attempt": "3", "keep": "me"}  # merged, not replaced
    assert meta.annotations == notes
    assert kube.patch_pod_metadata(namespace, "gone", pod.metadata.uid, labels, notes) is False


def test_an_acknowledged_plan_relabels_the_pod_on_the_api_server(namespace: str, core: client.CoreV1Api,
                                                                  cluster: ClusterLike) -> None:
    pod = pending_pod(core, namespace, "w-1")
    key = plan.new_private_key()
    agent = Agent(plan.public_key(key), pod_uid=pod.metadata.uid)  # verifies as the pod's agent would
    threading.Thread(target=agent.serve_forever, args=(0.05,), daemon=True).start()
    signed = plan.Plan(job_uid=JOB_UID, pod_uid=pod.metadata.uid, attempt=3, nnodes=2, node_rank=0,
                       master_addr="w-1.job", master_port=29500, resume_from="")
    outcomes = Outcomes()
    deliverer = delivery.Deliverer(Kube(cluster.api_client()), key, on_outcome=outcomes)
    try:
        deliverer.submit(namespace, [Delivery(pod="w-1", address="127.0.0.1", port=agent.port, plan=signed,
                                              labels={"training.resilient.dev/attempt": "3"},
                                              annotations={"training.resilient.dev/in-place": "3"})])
        (outcome,) = outcomes.wait(1, timeout=30)
    finally:
        deliverer.close()
        agent.shutdown()
        agent.server_close()
    assert outcome.result == delivery.ACKNOWLEDGED, outcome
    meta = core.read_namespaced_pod("w-1", namespace).metadata
    assert meta.labels["training.resilient.dev/attempt"] == "3"
    assert meta.annotations["training.resilient.dev/in-place"] == "3"
