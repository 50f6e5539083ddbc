"""The real-node substrate (e2e/realnodes): real kubelets and containerd, CoreDNS, kube-proxy.

One cluster with two nodes for the whole module. What is asserted is what a user of a real cluster
sees: Ready nodes, running pods with logs and exec, pod-to-pod by headless DNS name across nodes, a
ClusterIP Service, limits in the pod's cgroups, a dead node going NotReady with its pods left as
Kubernetes leaves them, a partitioned node whose containers keep running, and a host (sysctls, links,
addresses, routes, firewall rules, default runtime paths) exactly as it was before the cluster existed,
with none of its cgroups, mounts or namespaces left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import wait_for
from e2e.realnodes import RealCluster, cgroups
from e2e.realnodes import config as rn_config

pytestmark = [pytest.mark.timeout(240), pytest.mark.own_cluster]
# Every test below the config tables runs on the module's cluster.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (namespaces, cgroups, containerd)")
REAL_NODES = True  # e2e/pytest_plugin.py builds the node binaries and images at collection
NS = "rn"


@pytest.mark.parametrize(("index", "cidr", "bridge"),
                         [(1, "10.244.1.0/24", "cni1"), (250, "10.244.250.0/24", "cni250")])
def test_each_node_has_its_own_pod_cidr_and_bridge(index: int, cidr: str, bridge: str) -> None:
    conf = rn_config.cni_conflist(index, Path("/ipam"))["plugins"][0]
    assert (rn_config.pod_cidr(index), conf["bridge"], conf["ipam"]["ranges"][0][0]["subnet"]) == (cidr, bridge, cidr)
    assert conf["ipam"]["ranges"][0][0]["gateway"] == cidr.replace(".0/24", ".1")
    assert conf["ipMasq"] is False  # nothing outside the cluster's namespace to masquerade to


@pytest.mark.parametrize("index", [0, 251])
def test_node_index_outside_the_pod_supernet_is_refused(index: int) -> None:
    with pytest.raises(ValueError):
        rn_config.pod_cidr(index)


def test_kubelet_config_never_touches_the_hosts_globals() -> None:
    cfg = rn_config.kubelet_config(address="10.100.1.1", cgroup_root="/rtj/x/n1", runtime_socket=Path("/n/c.sock"),
                                   ca_crt=Path("/ca"), serving_crt=Path("/s.crt"), serving_key=Path("/s.key"),
                                   cluster_dns="10.100.0.1", max_pods=10)
    assert (cfg["makeIPTablesUtilChains"], cfg["protectKernelDefaults"]) == (False, False)
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["failCgroupV1"] is False
    assert cfg["cgroupRoot"] == "/rtj/x/n1" and cfg["clusterDNS"] == ["10.100.0.1"]
    proxy = rn_config.kube_proxy_config(Path("/kc"), "10.100.0.1", "n1")
    assert proxy["conntrack"]["maxPerCore"] == 0 and proxy["conntrack"]["tcpEstablishedTimeout"] == "0s"
    assert 'restrict_oom_score_adj = true' in rn_config.containerd_config(Path("/n"), "pause:1", Path("/n/cni"))


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed container's zombie waits for its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def host_state() -> dict[str, Any]:
    """What a cluster's life must leave untouched on the host."""
    sysctls = ["net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding", "net/ipv4/conf/all/route_localnet",
               "net/ipv6/conf/all/forwarding", *rn_config.KUBELET_SYSCTLS]
    return {
        "sysctl": {s: Path("/proc/sys", s).read_text().strip() for s in sysctls if Path("/proc/sys", s).exists()},
        "links": sorted(line.split(":")[1].strip() for line in _run("ip", "-o", "link").splitlines()),
        "addresses": _run("ip", "-o", "addr"),
        "routes": _run("ip", "route", "show", "table", "all") + _run("ip", "-6", "route", "show", "table", "all"),
        "iptables": [line for line in _run("iptables-save").splitlines() + _run("ip6tables-save").splitlines()
                     if not line.startswith(("#", ":"))],
        "nft": re.sub(r"packets \d+ bytes \d+", "", _run("nft", "list", "ruleset")),  # counters move
        # What a kubelet or containerd would leave at their default paths (the node's mount namespace hides them).
        "files": sorted(str(p) for d in ("/run", "/var/lib", "/var/log", "/etc") for p in Path(d).iterdir()
                        if p.name in ("containerd", "cni", "kubelet", "pods", "containers", "kubernetes")),
    }


@pytest.fixture(scope="module")
def real() -> Iterator[dict[str, Any]]:
    """Host state before, then a cluster with nodes n1 and n2 and namespace `rn`."""
    before = host_state()
    c = RealCluster.start("realnodes")
    state: dict[str, Any] = {"cluster": c, "before": before, "timings": {}}
    try:
        for name in ("n1", "n2"):
            t = time.monotonic()
            c.add_node(name, gpus=2 if name == "n2" else 0)
            state["timings"][f"{name} start -> Ready"] = round(time.monotonic() - t, 2)
        c.kubectl("create", "namespace", NS)
        c.wait_for_default_sa(NS)
        yield state
    finally:
        c.stop()
        print(f"\n[realnodes] timings: {json.dumps(state['timings'])}")
        if not os.environ.get("RTJ_KEEP_CLUSTER"):
            import shutil

            shutil.rmtree(c.dir, ignore_errors=True)


def busybox_pod(c: RealCluster, name: str, node: str, script: str, **spec: Any) -> dict[str, Any]:
    """A busybox pod pinned to `node` running `sh -c script`."""
    container = {"name": "main", "image": c.images["busybox"], "command": ["sh", "-c", script],
                 **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": spec.pop("labels", {})},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [container], **spec}}


def wait_running(c: RealCluster, name: str, timeout: float = 60) -> float:
    """Seconds until the pod is Running (fails early when it fails)."""
    t = time.monotonic()

    def running() -> bool:
        pod = c.get("pod", name, NS) or {}
        phase = pod.get("status", {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} {phase}: {json.dumps(pod.get('status'))[:2000]}")
        return phase == "Running"

    wait_for(running, timeout, f"pod {name} Running")
    return round(time.monotonic() - t, 2)


@pytest.mark.cluster
@needs_root
def test_nodes_ready_with_real_runtime(real: dict[str, Any]) -> None:
    c: RealCluster = real["cluster"]
    for name in ("n1", "n2"):
        node = c.get("node", name)
        assert node is not None
        assert c.node_ready(name)
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
    # Fake GPUs (patched status) survive the kubelet's own status updates (every second).
    time.sleep(2.5)
    assert (c.get("node", "n2") or {})["status"]["allocatable"].get("nvidia.com/gpu") == "2"


@pytest.mark.cluster
@needs_root
def test_pod_runs_logs_and_exec(real: dict[str, Any]) -> None:
    c: RealCluster = real["cluster"]
    c.apply(busybox_pod(c, "hello", "n1", "echo started on $(hostname); exec sleep 3600"))
    real["timings"]["pod create -> Running"] = wait_running(c, "hello")
    wait_for(lambda: "started on hello" in c.kubectl("logs", "-n", NS, "hello", check=False).stdout, 20,
             "kubectl logs")
    assert "started on hello" in c.pod_log(NS, "hello")
    # The container's root is its image on an overlay, not the machine's (/usr is the host's, not busybox's).
    root = c.kubectl("exec", "-n", NS, "hello", "--", "sh", "-c", "ls /; grep ' / / ' /proc/self/mountinfo").stdout
    assert "overlay" in root and "usr" not in root.split(), root
    out = c.kubectl("exec", "-n", NS, "hello", "--", "cat", "/etc/resolv.conf").stdout
    assert f"nameserver {c.dns_address}" in out and f"search {NS}.svc.cluster.local" in out


@pytest.mark.cluster
@needs_root
def test_pods_reach_each_other_across_nodes_by_dns_and_service(real: dict[str, Any]) -> None:
    c: RealCluster = real["cluster"]
    serve = 'mkdir -p /www && echo "hello from $(hostname)" > /www/index.html && exec httpd -f -p 8080 -h /www'
    c.apply([
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
         "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-vip", "namespace": NS},
         "spec": {"selector": {"app": "web", "role": "b"}, "ports": [{"port": 80, "targetPort": 8080}]}},
        busybox_pod(c, "web-a", "n1", serve, hostname="web-a", subdomain="web", labels={"app": "web"}),
        busybox_pod(c, "web-b", "n2", serve, hostname="web-b", subdomain="web", labels={"app": "web", "role": "b"}),
    ])
    for name in ("web-a", "web-b"):
        wait_running(c, name)
    ip_a, ip_b = ((c.get("pod", n, NS) or {})["status"]["podIP"] for n in ("web-a", "web-b"))
    assert ip_a.startswith("10.244.1.") and ip_b.startswith("10.244.2."), (ip_a, ip_b)

    def fetch(host: str, port: int) -> str:
        # HTTP by hand over busybox nc: Debian's static busybox wget crashes before connecting.
        cmd = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} {port}"
        return c.kubectl("exec", "-n", NS, "web-a", "--", "sh", "-c", cmd, check=False).stdout

    # Pod B by its headless name (an A record CoreDNS builds from the EndpointSlice), from a pod on node A.
    wait_for(lambda: "hello from web-b" in fetch(f"web-b.web.{NS}.svc.cluster.local", 8080), 30,
             "web-b by headless DNS name from web-a")
    # The ClusterIP Service, by name and by address (kube-proxy's rules in the cluster's namespace).
    vip = (c.get("service", "web-vip", NS) or {})["spec"]["clusterIP"]
    wait_for(lambda: "hello from web-b" in fetch(f"web-vip.{NS}.svc.cluster.local", 80), 30, "web-vip by name")
    assert "hello from web-b" in fetch(vip, 80)
    # And the apiserver through the `kubernetes` Service, as in-cluster clients reach it (TLS: any answer).
    assert "HTTPS server" in fetch("kubernetes.default", 443)

@pytest.mark.cluster
@needs_root
def test_limits_are_enforced_by_cgroups(real: dict[str, Any]) -> None:
    c: RealCluster = real["cluster"]
    c.apply(busybox_pod(c, "limited", "n2", "exec sleep 3600", container={
        "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}}))
    wait_running(c, "limited")
    mem, cpu = c.pod_cgroup(NS, "limited", "memory"), c.pod_cgroup(NS, "limited", "cpu")
    assert mem is not None and cpu is not None
    assert "/kubepods/" in str(mem) and "rtj" in str(mem)  # under the node's cgroup root, Guaranteed QoS
    assert int((mem / "memory.limit_in_bytes").read_text()) == 64 * 1024 * 1024
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 25000
    # The container's own cgroup (a child of the pod's) carries the limit too, and holds its process.
    containers = [d for d in mem.iterdir() if d.is_dir() and (d / "cgroup.procs").read_text().split()]
    assert any(int((d / "memory.limit_in_bytes").read_text()) == 64 * 1024 * 1024 for d in containers)


@pytest.mark.cluster
@needs_root
def test_host_path_volumes_stay_inside_the_cluster(real: dict[str, Any]) -> None:
    c: RealCluster = real["cluster"]
    pod = busybox_pod(c, "writer", "n1", "echo ckpt > /ck/step-7 && echo x > /elsewhere/x", restartPolicy="Never",
                      volumes=[{"name": "ck", "hostPath": {"path": "/rtj-checkpoints/rn", "type": "DirectoryOrCreate"}},
                               {"name": "else", "hostPath": {"path": "/rtj-not-shared", "type": "DirectoryOrCreate"}}],
                      container={"volumeMounts": [{"name": "ck", "mountPath": "/ck"},
                                                  {"name": "else", "mountPath": "/elsewhere"}]})
    c.apply(pod)
    wait_for(lambda: (c.get("pod", "writer", NS) or {}).get("status", {}).get("phase") == "Succeeded", 60,
             "writer Succeeded")
    # A shared root is the cluster's host_path (what every node sees: an RWX volume) ...
    assert c.host_path("/rtj-checkpoints/rn/step-7").read_text() == "ckpt\n"
    # ... and any other hostPath is the node's own, never the host's root filesystem.
    assert not Path("/rtj-not-shared").exists()


def sleeping_pod(c: RealCluster, name: str, node: str) -> list[int]:
    """A busybox pod that sleeps on `node`, running; the host pids of its processes."""
    c.apply(busybox_pod(c, name, node, "exec sleep 3600"))
    wait_running(c, name)
    pids = c.container_pids(NS, name)
    assert pids
    return pids


@pytest.mark.cluster
@needs_root
def test_partitioned_node_goes_not_ready_while_its_containers_run(real: dict[str, Any]) -> None:
    c: RealCluster = real["cluster"]
    pids = sleeping_pod(c, "ticker", "n2")
    c.partition_node("n2")
    try:
        t = time.monotonic()
        wait_for(lambda: not c.node_ready("n2"), 30, "n2 NotReady while partitioned")
        real["timings"]["partition -> NotReady"] = round(time.monotonic() - t, 2)
        assert all(alive(p) for p in pids), "containers died with the kubelet frozen"
        assert c.container_pids(NS, "ticker") == pids
    finally:
        c.heal_node("n2")
    wait_for(lambda: c.node_ready("n2"), 30, "n2 Ready after healing")


@pytest.mark.cluster
@needs_root
def test_killed_node_goes_not_ready_and_its_pods_stay(real: dict[str, Any]) -> None:
    c: RealCluster = real["cluster"]
    pids = sleeping_pod(c, "doomed", "n1")
    disk = c.disk_usage("n1")
    real["timings"]["node disk (MB)"] = round(disk / 2**20, 1)
    t = time.monotonic()
    c.kill_node("n1")
    assert not any(alive(p) for p in pids), "containers outlived their machine"

    def unreachable() -> bool:
        node = c.get("node", "n1") or {}
        taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
        return not c.node_ready("n1") and "node.kubernetes.io/unreachable" in taints

    wait_for(unreachable, 40, "n1 NotReady with the unreachable taint")
    real["timings"]["kill -> NotReady+unreachable"] = round(time.monotonic() - t, 2)
    pod = c.get("pod", "doomed", NS)
    assert pod is not None and pod["spec"]["nodeName"] == "n1"  # left where it was: no kubelet to end it
    ready = {x["type"]: x["status"] for x in pod["status"].get("conditions", [])}
    wait_for(lambda: {x["type"]: x["status"] for x in (c.get("pod", "doomed", NS) or {})["status"]["conditions"]}
             .get("Ready") == "False", 20, "pod marked not Ready by the node controller")
    del ready
    # The machine boots again: the kubelet reconciles and the node is Ready.
    t = time.monotonic()
    c.restore_node("n1")
    real["timings"]["restore -> Ready"] = round(time.monotonic() - t, 2)
    assert c.node_ready("n1") and c.nodes["n1"].proc is not None and not c.nodes["n1"].killed


@pytest.mark.cluster
@needs_root
def test_host_is_left_as_found(real: dict[str, Any]) -> None:
    """Last: stop the cluster, then compare the host with the snapshot taken before it started."""
    c: RealCluster = real["cluster"]
    c.stop()
    after = host_state()
    before = real["before"]
    for key in before:
        assert after[key] == before[key], f"host {key} changed by the cluster's life"
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(c.dir) in line]
    assert not [ns for ns in _run("ip", "netns", "list").split() if ns.startswith(c.netns)]
    assert not cgroups.leftovers(c.netns)  # (other clusters' node cgroups may come and go meanwhile)
