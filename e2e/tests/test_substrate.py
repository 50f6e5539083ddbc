"""The local substrate behaves like Kubernetes where the project relies on it.

Each test talks to the real apiserver/controller-manager/scheduler; the nodes are simulated by
process-running agents. Waits use watches (or short polls with deadlines), never bare sleeps.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from e2e.localcluster import wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def core(cluster: Any) -> client.CoreV1Api:
    """Admin CoreV1 client."""
    return client.CoreV1Api(cluster.api_client())


def wait_pod(core: client.CoreV1Api, ns: str, name: str, pred: Callable[[Any], bool], timeout: float) -> Any:
    """Watch one pod until `pred(pod)` holds; returns the pod."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pod = core.read_namespaced_pod(name, ns)
            raise TimeoutError(f"pod {ns}/{name} never matched; last status: {pod.status}")
        try:
            pod = core.read_namespaced_pod(name, ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
            pod = None
        if pod is not None and pred(pod):
            return pod
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, ns, field_selector=f"metadata.name={name}",
                           timeout_seconds=max(1, int(remaining))):
            if pred(ev["object"]):
                w.stop()
                return ev["object"]


def pod(name: str, script: str, *, node: str | None = None, restart: str = "Never",
        **spec: Any) -> dict[str, Any]:
    # `node` must be the real node name: use `cluster.node_name(requested)` (kind maps names).
    """A pod running a Python script (the venv's `python` is on the container PATH)."""
    image = spec.pop("image", "python:3.11")
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "main", "image": "python:3.11",
                                 "command": ["python", "-c", textwrap.dedent(script)]}], **spec},
    }
    if node:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    body["spec"]["containers"][0]["image"] = image
    return body


def pod_deleted(core: client.CoreV1Api, ns: str, name: str) -> bool:
    """True once the API has no such pod (a 404), not merely a deletionTimestamp."""
    try:
        core.read_namespaced_pod(name, ns)
    except ApiException as exc:
        return exc.status == 404
    return False


def phase_in(*phases: str) -> Callable[[Any], bool]:
    """Predicate: pod phase is one of `phases`."""
    return lambda p: p is not None and p.status is not None and p.status.phase in phases


@pytest.mark.timeout(60)
def test_crd_applies_and_cel_rule_rejects(cluster: Any, namespace: str) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.substrate.test"},
        "spec": {"group": "substrate.test", "scope": "Namespaced",
                 "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {
                         "type": "object",
                         "x-kubernetes-validations": [{"rule": "self.min <= self.max",
                                                       "message": "min must be <= max"}],
                         "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}}}}}}]},
    }
    cluster.apply(crd)
    cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.substrate.test", "--timeout=30s")
    good = {"apiVersion": "substrate.test/v1", "kind": "Widget", "metadata": {"name": "ok"},
            "spec": {"min": 1, "max": 2}}
    wait_for(lambda: cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(good),
                                         check=False).returncode == 0, 20, "first Widget accepted")
    bad = {**good, "metadata": {"name": "bad"}, "spec": {"min": 3, "max": 2}}
    res = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(bad), check=False)
    assert res.returncode != 0
    assert "min must be <= max" in res.stderr


@pytest.mark.timeout(60)
@pytest.mark.skipif(not (REPO / "crds" / "resilienttrainingjobs.yaml").exists(), reason="project CRD not present")
def test_project_crd_rejects_min_above_max(cluster: Any, namespace: str) -> None:
    cluster.kubectl("apply", "-f", str(REPO / "crds" / "resilienttrainingjobs.yaml"))
    cluster.kubectl("wait", "--for=condition=Established",
                        "crd/resilienttrainingjobs.training.resilient.dev", "--timeout=30s")

    def job(name: str, elastic: dict[str, int]) -> str:
        return json.dumps({"apiVersion": "training.resilient.dev/v1alpha1", "kind": "ResilientTrainingJob",
                           "metadata": {"name": name},
                           "spec": {"replicas": 2, "elasticPolicy": elastic,
                                    "template": {"spec": {"containers": [{"name": "t"}]}},
                                    "checkpoint": {"root": "/ckpt"}}})

    wait_for(lambda: cluster.kubectl("apply", "-n", namespace, "-f", "-",
                                         input=job("good", {"minReplicas": 1, "maxReplicas": 2}),
                                         check=False).returncode == 0, 20, "valid job accepted")
    res = cluster.kubectl("apply", "-n", namespace, "-f", "-",
                              input=job("bad", {"minReplicas": 3, "maxReplicas": 2}), check=False)
    assert res.returncode != 0
    assert "minReplicas must be <= spec.elasticPolicy.maxReplicas" in res.stderr


@pytest.mark.timeout(60)
def test_pod_runs_and_succeeds(cluster: Any, core: client.CoreV1Api, namespace: str) -> None:
    script = """
        import os, socket
        print("pod", os.environ["POD_NAME"], os.environ["POD_NAMESPACE"], os.environ["NODE"], os.environ["POD_IP"])
        assert socket.gethostname() == os.environ["POD_NAME"]
        assert open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read() == os.environ["POD_NAMESPACE"]
    """
    body = pod("ok", script)
    body["spec"]["containers"][0]["env"] = [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
        for n, f in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                     ("NODE", "spec.nodeName"), ("POD_IP", "status.podIP"))]
    core.create_namespaced_pod(namespace, body)
    p = wait_pod(core, namespace, "ok", phase_in("Succeeded", "Failed"), 45)
    log = cluster.pod_log(namespace, "ok")
    assert p.status.phase == "Succeeded", log
    assert p.status.container_statuses[0].state.terminated.exit_code == 0
    if hasattr(cluster, "subnet"):  # local substrate: pod IPs come from the node's /24
        assert p.status.pod_ip and p.status.pod_ip.startswith(f"10.{cluster.subnet}.")
    assert f"pod ok {namespace} {p.spec.node_name} {p.status.pod_ip}" in log
    # kubectl logs goes apiserver -> the node's kubelet API (the agent serves it on its InternalIP).
    assert f"pod ok {namespace}" in cluster.kubectl("logs", "-n", namespace, "ok").stdout


@pytest.mark.timeout(60)
def test_pod_fails_with_exit_code_and_message(core: client.CoreV1Api, namespace: str) -> None:
    script = """
        open("/dev/termination-log", "w").write("out of patience")
        raise SystemExit(7)
    """
    core.create_namespaced_pod(namespace, pod("bad", script))
    p = wait_pod(core, namespace, "bad", phase_in("Succeeded", "Failed"), 45)
    assert p.status.phase == "Failed"
    term = p.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason, term.message) == (7, "Error", "out of patience")


@pytest.mark.timeout(90)
def test_deleting_a_pod_kills_its_process(cluster: Any, core: client.CoreV1Api, namespace: str) -> None:
    marker = cluster.host_path(f"/rtj-shared/marks/{namespace}")
    script = """
        import os, signal, time
        d = "/marks"
        open(f"{d}/pid", "w").write(str(os.getpid()))
        def term(*_):
            open(f"{d}/sigterm", "w").write("1")
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, term)
        while True:
            time.sleep(0.1)
    """
    body = pod("victim", script)
    body["spec"]["volumes"] = [{"name": "m", "hostPath": {"path": f"/rtj-shared/marks/{namespace}",
                                                          "type": "DirectoryOrCreate"}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "m", "mountPath": "/marks"}]
    core.create_namespaced_pod(namespace, body)
    wait_pod(core, namespace, "victim", phase_in("Running"), 45)
    pid = int(wait_for(lambda: (marker / "pid").exists() and (marker / "pid").read_text(), 20, "pid file"))
    local = hasattr(cluster, "subnet")  # same pid namespace as the test on the local substrate
    assert not local or Path(f"/proc/{pid}").exists()
    core.delete_namespaced_pod("victim", namespace)
    if local:
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z",
                 20, "process gone")
    wait_for((marker / "sigterm").exists, 20, "the container got SIGTERM first")

    wait_for(lambda: pod_deleted(core, namespace, "victim"), 20, "pod object finally deleted by the node")


@pytest.mark.timeout(120)
def test_killed_node_goes_not_ready_tainted_and_pods_stay_terminating(
        cluster: Any, core: client.CoreV1Api, namespace: str) -> None:
    requested = f"doomed-{namespace[-4:]}"
    cluster.add_node(requested)
    node = cluster.node_name(requested)
    body = pod("stuck", "import time\nwhile True: time.sleep(1)", node=node)
    # Evict at once when unreachable (the default toleration would wait 300 s).
    body["spec"]["tolerations"] = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                    "effect": "NoExecute", "tolerationSeconds": 0}]
    core.create_namespaced_pod(namespace, body)
    wait_pod(core, namespace, "stuck", phase_in("Running"), 45)
    grace = float(cluster.node_monitor_grace_period.rstrip("s"))

    t0 = time.monotonic()
    cluster.kill_node(requested)

    def not_ready() -> bool:
        n = core.read_node(node)
        ready = next(c for c in n.status.conditions if c.type == "Ready")
        return ready.status != "True"

    wait_for(not_ready, grace + 10, "node NotReady/Unknown", interval=0.1)
    elapsed = time.monotonic() - t0
    print(f"kill_node -> NotReady in {elapsed:.1f}s (grace {grace}s)")
    assert elapsed <= grace + 5

    def tainted() -> bool:
        taints = {(t.key, t.effect) for t in core.read_node(node).spec.taints or []}
        return {("node.kubernetes.io/unreachable", "NoSchedule"),
                ("node.kubernetes.io/unreachable", "NoExecute")} <= taints

    wait_for(tainted, 15, "unreachable taints")
    p = wait_pod(core, namespace, "stuck", lambda p: p is not None and p.metadata.deletion_timestamp is not None, 30)
    assert p.metadata.deletion_timestamp is not None, "taint eviction marked the pod for deletion"
    # Nobody confirms the kill: the pod stays Terminating (the harness must not clean it up).
    for _ in range(10):
        assert core.read_namespaced_pod("stuck", namespace).metadata.deletion_timestamp is not None
        time.sleep(0.3)

    cluster.restore_node(requested)  # the machine comes back: its agent finalizes the deletion
    wait_for(lambda: not tainted(), 30, "taints removed")

    def gone() -> bool:
        try:
            core.read_namespaced_pod("stuck", namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 30, "Terminating pod finalized after restore")
    cluster.kill_node(requested)  # leave it dead: later tests must not schedule onto it
    core.delete_node(node)


@pytest.mark.timeout(90)
def test_deployment_pod_runs_and_becomes_available(cluster: Any, namespace: str) -> None:
    server = "import http.server as h; h.ThreadingHTTPServer(('', 8080), h.SimpleHTTPRequestHandler).serve_forever()"
    deploy = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
                     "name": "web", "image": "python:3.11", "command": ["python", "-c", server],
                     "ports": [{"containerPort": 8080, "name": "http"}],
                     "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}]}}},
    }
    cluster.apply(deploy, namespace)
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s", timeout=70)


@pytest.mark.timeout(90)
def test_serviceaccount_token_gets_exactly_its_rbac(cluster: Any, core: client.CoreV1Api,
                                                    namespace: str) -> None:
    cluster.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pod-reader"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]},
    ], namespace)
    script = """
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException
        config.load_incluster_config()
        v1 = client.CoreV1Api()
        ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
        names = [p.metadata.name for p in v1.list_namespaced_pod(ns).items]
        assert "rbac" in names, names
        for call in (lambda: v1.list_namespaced_secret(ns), lambda: v1.list_namespaced_pod("default"),
                     lambda: v1.delete_namespaced_pod("rbac", ns)):
            try:
                call()
            except ApiException as e:
                assert e.status == 403, e
            else:
                raise SystemExit("forbidden call was allowed")
        print("rbac ok")
    """
    # The operator image carries the kubernetes client (on the local substrate: the venv's python).
    core.create_namespaced_pod(namespace, pod("rbac", script, serviceAccountName="reader",
                                              image="resilient-training-operator:e2e"))
    p = wait_pod(core, namespace, "rbac", phase_in("Succeeded", "Failed"), 60)
    assert p.status.phase == "Succeeded", cluster.pod_log(namespace, "rbac")


@pytest.mark.timeout(90)
def test_pods_on_different_nodes_reach_each_other_by_headless_dns(cluster: Any, core: client.CoreV1Api,
                                                                  namespace: str) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "peers"},
                       "spec": {"clusterIP": "None", "selector": {"app": "peers"},
                                "ports": [{"port": 29500}]}}, namespace)
    server = """
        import socket
        s = socket.create_server(("", 29500))
        for _ in range(2):
            conn, _ = s.accept()
            conn.sendall(socket.gethostname().encode())
            conn.close()
    """
    client_script = f"""
        import socket, time
        for name in ("server.peers", "server.peers.{namespace}.svc.cluster.local"):
            deadline = time.time() + 40
            while True:
                try:
                    with socket.create_connection((name, 29500), timeout=2) as c:
                        data = c.recv(100)
                    break
                except OSError as e:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
            print(name, "->", socket.gethostbyname(name), data.decode())
            assert data == b"server"
    """
    srv = pod("server", server, node=cluster.node_name("node-1"), hostname="server", subdomain="peers")
    srv["metadata"]["labels"] = {"app": "peers"}
    cli = pod("client", client_script, node=cluster.node_name("node-2"), hostname="client", subdomain="peers")
    cli["metadata"]["labels"] = {"app": "peers"}
    core.create_namespaced_pod(namespace, srv)
    core.create_namespaced_pod(namespace, cli)
    p = wait_pod(core, namespace, "client", phase_in("Succeeded", "Failed"), 70)
    log = cluster.pod_log(namespace, "client")
    assert p.status.phase == "Succeeded", log
    s = core.read_namespaced_pod("server", namespace)
    assert s.spec.node_name != p.spec.node_name
    assert f"server.peers -> {s.status.pod_ip} server" in log


@pytest.mark.timeout(150)
def test_torch_rendezvous_over_headless_dns_across_nodes(cluster: Any, core: client.CoreV1Api,
                                                         namespace: str) -> None:
    """Two pods on two nodes form a gloo process group with MASTER_ADDR=<hostname>.<subdomain>."""
    cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tr"},
                       "spec": {"clusterIP": "None", "selector": {"app": "tr"}, "publishNotReadyAddresses": True,
                                "ports": [{"port": 29500}]}}, namespace)
    script = """
        import os, socket, time
        deadline = time.time() + 60
        while True:  # the peer's record appears once its pod has an IP, as with CoreDNS
            try:
                socket.gethostbyname(os.environ["MASTER_ADDR"])
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        import datetime, torch, torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", t.item(), flush=True)
        assert t.item() == 3.0
        dist.destroy_process_group()
    """
    for rank, node in ((0, "node-1"), (1, "node-2")):
        body = pod(f"w{rank}", script, node=cluster.node_name(node), hostname=f"w{rank}", subdomain="tr",
                   image="resilient-training-trainer:e2e")
        body["metadata"]["labels"] = {"app": "tr"}
        body["spec"]["containers"][0]["env"] = [
            {"name": "MASTER_ADDR", "value": "w0.tr"}, {"name": "MASTER_PORT", "value": "29500"},
            {"name": "RANK", "value": str(rank)}, {"name": "WORLD_SIZE", "value": "2"}]
        core.create_namespaced_pod(namespace, body)
    for rank in (0, 1):
        p = wait_pod(core, namespace, f"w{rank}", phase_in("Succeeded", "Failed"), 120)
        log = cluster.pod_log(namespace, f"w{rank}")
        assert p.status.phase == "Succeeded", log
        assert f"rank {rank} of 2 sum 3.0" in log


@pytest.mark.timeout(60)
def test_fake_gpus_are_scheduled_as_extended_resources(cluster: Any, core: client.CoreV1Api,
                                                       namespace: str) -> None:
    def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
        body = pod(name, "pass")
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        return body

    core.create_namespaced_pod(namespace, gpu_pod("too-many", 3))  # session nodes have 2 each
    core.create_namespaced_pod(namespace, gpu_pod("fits", 2))
    p = wait_pod(core, namespace, "fits", phase_in("Succeeded", "Failed"), 45)
    assert p.status.phase == "Succeeded"
    unsched = wait_pod(core, namespace, "too-many", lambda p: any(
        c.type == "PodScheduled" and c.reason == "Unschedulable" for c in (p.status.conditions or [])), 30)
    assert "nvidia.com/gpu" in next(c.message for c in unsched.status.conditions if c.type == "PodScheduled")


@pytest.mark.timeout(60)
def test_on_failure_restarts_the_container_and_counts_it(cluster: Any, core: client.CoreV1Api,
                                                         namespace: str) -> None:
    script = """
        import os
        os.makedirs("/scratch", exist_ok=True)
        first = not os.path.exists("/scratch/ran")
        open("/scratch/ran", "w").close()
        raise SystemExit(3 if first else 0)
    """
    body = pod("flaky", script, restart="OnFailure")
    body["spec"]["volumes"] = [{"name": "s", "emptyDir": {}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/scratch"}]
    core.create_namespaced_pod(namespace, body)
    p = wait_pod(core, namespace, "flaky", phase_in("Succeeded", "Failed"), 45)
    st = p.status.container_statuses[0]
    assert (p.status.phase, st.restart_count) == ("Succeeded", 1)
    assert st.last_state.terminated.exit_code == 3


@pytest.mark.timeout(90)
def test_restored_node_reports_its_lost_run_once_pod_failed(cluster: Any, core: client.CoreV1Api,
                                                           namespace: str) -> None:
    requested = f"reboot-{namespace[-4:]}"
    cluster.add_node(requested)
    node = cluster.node_name(requested)
    core.create_namespaced_pod(namespace, pod("lost", "import time\nwhile True: time.sleep(1)", node=node))
    wait_pod(core, namespace, "lost", phase_in("Running"), 45)
    cluster.kill_node(requested)
    cluster.restore_node(requested)  # back before any eviction (default toleration: 300 s)
    p = wait_pod(core, namespace, "lost", phase_in("Succeeded", "Failed"), 30)
    term = p.status.container_statuses[0].state.terminated
    assert (p.status.phase, term.exit_code, term.reason) == ("Failed", 137, "ContainerStatusUnknown")
    cluster.kill_node(requested)
    core.delete_node(node)


@pytest.mark.timeout(60)
def test_security_context_sets_user_groups_and_read_only_root(cluster: Any, core: client.CoreV1Api,
                                                              namespace: str) -> None:
    script = """
        import os
        assert (os.getuid(), os.getgid()) == (1000, 1000), (os.getuid(), os.getgid())
        assert 2000 in os.getgroups(), os.getgroups()
        open("/scratch/ok", "w").write("emptyDir is writable")
        try:
            open("/etc/should-fail", "w")
        except OSError as e:
            assert e.errno == 30, e  # EROFS
        else:
            raise SystemExit("root filesystem is writable")
        open("/dev/termination-log", "w").write("non-root done")
    """
    body = pod("nonroot", script, securityContext={"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000})
    body["spec"]["containers"][0]["securityContext"] = {"readOnlyRootFilesystem": True}
    body["spec"]["volumes"] = [{"name": "s", "emptyDir": {}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/scratch"}]
    core.create_namespaced_pod(namespace, body)
    p = wait_pod(core, namespace, "nonroot", phase_in("Succeeded", "Failed"), 45)
    assert p.status.phase == "Succeeded", cluster.pod_log(namespace, "nonroot")
    assert p.status.container_statuses[0].state.terminated.message == "non-root done"


@pytest.mark.timeout(60)
def test_exec_readiness_and_liveness_probes(cluster: Any, core: client.CoreV1Api, namespace: str) -> None:
    ready = pod("ready", "import time, pathlib\ntime.sleep(1)\npathlib.Path('/scratch/ready').touch()\n"
                         "while True: time.sleep(1)", restart="Always")
    ready["spec"]["volumes"] = [{"name": "s", "emptyDir": {}}]
    ready["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/scratch"}]
    ready["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["test", "-f", "/scratch/ready"]},
                                                        "periodSeconds": 1}
    dead = pod("unhealthy", "import time\nwhile True: time.sleep(1)", restart="Always",
               terminationGracePeriodSeconds=1)
    dead["spec"]["containers"][0]["livenessProbe"] = {"tcpSocket": {"port": 9}, "periodSeconds": 1,
                                                      "failureThreshold": 2}
    core.create_namespaced_pod(namespace, ready)
    core.create_namespaced_pod(namespace, dead)
    wait_pod(core, namespace, "ready", lambda p: any(
        c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])), 30)
    p = wait_pod(core, namespace, "unhealthy", lambda p: bool(p.status.container_statuses) and
                 p.status.container_statuses[0].restart_count >= 1, 40)
    assert p.status.phase == "Running"


@pytest.mark.timeout(90)
def test_nodes_and_pods_survive_an_apiserver_restart(cluster: Any, core: client.CoreV1Api,
                                                      namespace: str) -> None:
    core.create_namespaced_pod(namespace, pod("steady", "import time\nwhile True: time.sleep(1)"))
    wait_pod(core, namespace, "steady", phase_in("Running"), 45)
    cluster.restart_component("kube-apiserver", down_seconds=2)
    fresh = client.CoreV1Api(cluster.api_client())
    assert fresh.read_namespaced_pod("steady", namespace).status.phase == "Running"
    fresh.delete_namespaced_pod("steady", namespace, grace_period_seconds=1)  # the agent's watch is back

    wait_for(lambda: pod_deleted(fresh, namespace, "steady"), 30, "pod deleted through re-established watches")
    assert all(cluster.node_ready(n) for n in ("node-1", "node-2", "node-3"))


def _host_network() -> dict[str, str]:
    """The host's interfaces, addresses and routes (every table), as `ip` prints them."""
    from e2e.controlplane import network

    return {" ".join(cmd): network.ip(*cmd).stdout for cmd in
            (("-o", "addr"), ("route", "show", "table", "all"), ("-6", "route", "show", "table", "all"),
             ("-o", "link"))}


@pytest.mark.timeout(180)
def test_a_cluster_adds_nothing_to_the_host_network_and_leaves_nothing_behind() -> None:
    """Start a cluster with a node and a running pod (its namespace, veth, address), stop it: the host's
    interfaces and routes are exactly as before, and no namespace of that cluster is left."""
    from e2e.controlplane import network
    from e2e.localcluster import Cluster

    before = _host_network()
    c = Cluster.start("hostnet")
    try:
        c.add_node("n1")
        core = client.CoreV1Api(c.api_client())
        c.wait_for_default_sa("default")
        core.create_namespaced_pod("default", pod("p", "import time; time.sleep(600)"))
        wait_pod(core, "default", "p", phase_in("Running"), 60)
        inside = c.in_netns(lambda: network.ip("-o", "addr").stdout)
        assert f"{network.BRIDGE}    inet {network.gateway()}/16" in inside  # the bridge is in the namespace
        assert network.BRIDGE not in network.ip("-o", "link").stdout
        assert _host_network() == before  # while it runs, too
    finally:
        c.stop(remove=True)
    assert _host_network() == before
    assert not [ns for ns in network.list_netns() if ns == c.netns or ns.startswith(c.netns + "_")]


def test_namespaces_of_a_dead_cluster_are_cleaned_up() -> None:
    """A cluster killed with its watchdog leaves namespace names; the next start (or `down`) removes them,
    and never a namespace a live process uses."""
    import subprocess
    import uuid

    from e2e.controlplane import network

    dead = network.cluster_netns_name(f"dead-{uuid.uuid4().hex[:6]}")
    live = network.cluster_netns_name(f"live-{uuid.uuid4().hex[:6]}")
    network.create_cluster_netns(dead)
    network.ip("netns", "add", f"{dead}_1-deadbeef")  # a pod of it
    network.ip("netns", "add", live)
    holder = subprocess.Popen(["ip", "netns", "exec", live, "sleep", "60"])
    try:
        wait_for(lambda: network.netns_pids(live), 10, "a process in the live namespace")
        with network.locked():
            network.cleanup_stale()
        names = network.list_netns()
        assert dead not in names and f"{dead}_1-deadbeef" not in names
        assert live in names
    finally:
        holder.kill()
        holder.wait()
        for ns in (dead, f"{dead}_1-deadbeef", live):
            network.ip("netns", "del", ns, check=False)
