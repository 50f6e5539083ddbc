"""KWOK on the local control plane: thousands of fake nodes and pods without processes, for scale only.

The control plane is `e2e.localcluster.Cluster`'s (real etcd, apiserver, controller-manager,
scheduler). The operator runs as its pod (helm, its ServiceAccount) on one simulated process node,
`infra`; every other node is a KWOK node (annotation `kwok.x-k8s.io/node=fake`), which KWOK keeps
Ready and whose Lease it renews every 10 s (leaseDurationSeconds 40 / 4, as a kubelet does); pods
bound to them become Running through KWOK's stock stages. The scheduler places the pods for real.

Killing a KWOK node changes that annotation (KWOK stops selecting the node, as its docs describe taking
a node out of its hands) and hands its Lease to a holder that never renews (see `kill_nodes`): the Lease
is no longer renewed, the controller-manager marks the node NotReady after its grace period, and its pods
stay as they were until the operator force-deletes them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e import support
from e2e.localcluster.binaries import REPO_ROOT
from e2e.localcluster.cluster import Cluster, Component, wait_for
from resilient_operator import constants as c

BUILD_SCRIPT = REPO_ROOT / "hack" / "kwok" / "build.sh"
MANAGED = "kwok.x-k8s.io/node"
KWOK_LABEL = {"type": "kwok"}
LEASE_SECONDS = 40  # a kubelet's default; renewed every 10 s
# A real cluster's node-monitor-grace-period (50 s since 1.32; 40 s before): longer than a renew interval.
NODE_MONITOR_GRACE = "40s"
# KWOK plays every pod's stages (ready, delete) through one pool of 4 workers by default: at hundreds of
# pods that pool, not the control plane, paced a recovery (pods deleted or made Running up to 9 s after
# the operator asked, measured from the audit log). Real kubelets work in parallel, one per node, so the
# simulation gets as many workers as a small rack of kubelets would bring.
KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
    "options": {"podPlayStageParallelism": 32, "nodePlayStageParallelism": 8, "nodeLeaseParallelism": 8},
}

# apiserver_request_total has no user label, so the operator's own requests are counted from the audit
# log: one Metadata-level entry per request made by a ServiceAccount of the operator's namespace.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "userGroups": [f"system:serviceaccounts:{support.OPERATOR_NS}"]},
              {"level": "None"}],
}


def ensure_kwok(timeout: float = 3600) -> Path:
    """Build KWOK (a no-op when cached) and return the binary; stages.yaml lies beside it."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True, timeout=timeout)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class KwokCluster:
    cluster: Cluster
    kwok: Component

    audit_log: Path

    @classmethod
    def start(cls, name: str = "kwok", **cluster_args: Any) -> KwokCluster:
        """The control plane with an audit log of the operator's requests, and KWOK attached to it."""
        binary = ensure_kwok()
        policy_dir = Path(tempfile.mkdtemp(prefix="rtj-audit-"))
        policy, audit_log = policy_dir / "policy.json", policy_dir / "audit.log"
        policy.write_text(json.dumps(AUDIT_POLICY))
        options = policy_dir / "kwok-options.yaml"  # JSON is YAML
        options.write_text(json.dumps(KWOK_OPTIONS))
        cl = Cluster.start(name, node_monitor_grace_period=NODE_MONITOR_GRACE, extra_apiserver_args=(
            f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}", "--audit-log-maxsize=1000"),
            **cluster_args)
        try:
            log = cl.log_dir / "kwok.log"
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    [str(binary), f"--kubeconfig={cl.kubeconfig}", f"--config={binary.parent / 'stages.yaml'}",
                     f"--config={options}", f"--manage-nodes-with-annotation-selector={MANAGED}=fake",
                     f"--node-lease-duration-seconds={LEASE_SECONDS}", "--cidr=10.240.0.0/12",
                     "--node-ip=10.239.0.1", "--v=WARN"],  # its per-object INFO lines cost a core at scale
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            kwok = Component("kwok", proc, log)
            cl.components["kwok"] = kwok  # stopped with the cluster (and by its watchdog)
            cl._save()
        except BaseException:
            cl.stop()
            raise
        return cls(cl, kwok, audit_log)

    def stop(self, *, remove: bool = False) -> None:
        self.cluster.stop(remove=remove)

    def install_operator(self, *, workers: int | None = None, memory_limit: str = "2Gi") -> None:
        """A process node for the operator's pod, then the chart (as the e2e suite installs it)."""
        cl = self.cluster
        cl.add_node("infra", cpu="4", memory="8Gi", labels={"role": "infra"})
        cl.host_path(support.HOST_DIR).mkdir(parents=True, exist_ok=True)
        cl.kubectl("create", "namespace", support.OPERATOR_NS)
        # one replica: the figures are one operator's; a standby would double the watch load on the 2 cores
        extra = ["--set", f"resources.limits.memory={memory_limit}", "--set", "replicaCount=1"]
        cl.helm("install", support.RELEASE, str(support.CHART), "--namespace", support.OPERATOR_NS, "--wait",
                "--timeout", "180s", "--set", f"checkpointStorage.hostPath={support.HOST_DIR}",
                "--set", f"checkpointStorage.mountPath={support.MOUNT}", "--set", "nodeSelector.role=infra",
                *extra)  # fmt: skip
        if workers:
            cl.kubectl("-n", support.OPERATOR_NS, "set", "env", "deployment", "--all", f"RTJ_WORKERS={workers}")
        support.wait_operator_ready(cl)
        wait_for(lambda: support.operator_metrics(cl), 120, "operator metrics")

    def add_nodes(self, names: list[str], *, cpu: str = "64", memory: str = "512Gi", gpus: int = 32,
                  pods: int = 110, timeout: float = 600) -> None:
        """Create KWOK nodes (in parallel) and wait until every one is Ready.

        32 GPUs a node (twice the bench's demand): the hit jobs must fit again after the kill, because the core
        sizes a job from the healthy nodes' allocatable, not from what other jobs already hold."""
        from kubernetes import client

        api = client.CoreV1Api(self.cluster.api_client())
        capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}

        def create(name: str) -> None:
            api.create_node({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {MANAGED: "fake"},
                             "labels": {**KWOK_LABEL, "kubernetes.io/hostname": name, "pool": "train"}},
                "status": {"allocatable": capacity, "capacity": capacity},
            })

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, names))
        wanted = set(names)

        def all_ready() -> bool:
            nodes = api.list_node(label_selector="type=kwok").items
            ready = {n.metadata.name for n in nodes
                     if any(cond.type == "Ready" and cond.status == "True" for cond in n.status.conditions or [])}
            return wanted <= ready

        wait_for(all_ready, timeout, f"{len(names)} KWOK nodes Ready", interval=2)

    def kill_nodes(self, names: list[str]) -> None:
        """The machines die at once: KWOK stops renewing their Leases and stops driving them.

        KWOK v0.8.0 keeps renewing the Lease of a node it no longer selects, but it holds a Lease like a
        leader election does: it never renews one another holder holds unexpired. So each dead node's Lease
        is handed to a holder that never renews (renewTime untouched: the last sign of life stays the last).
        """
        from kubernetes import client

        api = self.cluster.api_client()
        core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
        unmanaged = {"metadata": {"annotations": {MANAGED: "dead"}}}
        taken = {"spec": {"holderIdentity": "dead-machine", "leaseDurationSeconds": 86400}}

        def kill(name: str) -> None:
            coordination.patch_namespaced_lease(name, "kube-node-lease", taken)
            core.patch_node(name, unmanaged)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(kill, names))


def kwok_worker_template(gpus: int = 1) -> dict[str, Any]:
    """A worker pod template for KWOK nodes (the image never runs: KWOK fakes the container)."""
    return {"spec": {
        "terminationGracePeriodSeconds": 2,
        "nodeSelector": dict(KWOK_LABEL),
        "containers": [{"name": "trainer", "image": "busybox", "command": ["sh", "-c", "sleep 3600"],
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }}


def operator_requests(audit_log: Path, since: datetime, until: datetime) -> Counter[tuple[str, str]]:
    """The operator's API requests received in [since, until), by (verb, resource[/subresource])."""
    seen: set[str] = set()
    out: Counter[tuple[str, str]] = Counter()
    with audit_log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event["auditID"] in seen:
                continue  # a watch logs ResponseStarted and ResponseComplete
            seen.add(event["auditID"])
            at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if not since <= at < until:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", event.get("requestURI", "?"))
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            out[(event["verb"], resource)] += 1
    return out


# ---- the scale scenario (shared by bench/scale_bench.py and e2e/tests/test_scale_kwok.py) -------------------
def histogram(text: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """Cumulative buckets [(le, count)], sum and count of one Prometheus histogram."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for key, value in support.metric_samples(text, name).items():
        if key.startswith(f"{name}_bucket"):
            le = key.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((math.inf if le == "+Inf" else float(le), value))
        elif key.startswith(f"{name}_sum"):
            total = value
        elif key.startswith(f"{name}_count"):
            count = value
    return sorted(buckets), total, count


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding the rank."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return buckets[-1][0]


def delta(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    base = dict(before)
    return [(le, n - base.get(le, 0.0)) for le, n in after]


def reconcile_stats(after: str, before: str) -> tuple[float, float, float]:
    """(count, p50 s, p99 s) of rtj_reconcile_seconds between two scrapes."""
    b1, _, n1 = histogram(after, "rtj_reconcile_seconds")
    b0, _, n0 = histogram(before, "rtj_reconcile_seconds")
    d = delta(b1, b0)
    return n1 - n0, quantile(d, 0.5), quantile(d, 0.99)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class ScaleResult:
    nodes: int
    jobs: int
    workers: int
    killed: int
    hit: int
    loss_timeout: float
    submit_to_running_s: float
    relaunch_s: list[float]
    restarted_twice: int  # hit jobs restarted more than once
    spurious: int  # jobs that were not hit but restarted
    rss_mib: dict[str, float]
    cpu_s: dict[str, float]
    steady_s: float
    steady_requests: Counter[tuple[str, str]]
    recovery_s: float
    recovery_requests: Counter[tuple[str, str]]
    reconcile: dict[str, tuple[float, float, float]]
    errors: float
    control_plane_cpu_s: dict[str, float] = field(default_factory=dict)  # per component, during the recovery
    load_average: float = 0.0  # the machine's 1-minute load at the end (other tenants included)

    def table(self) -> str:
        rel = self.relaunch_s
        lines = [
            f"KWOK scale bench: {self.nodes} nodes, {self.jobs} jobs x {self.workers} workers "
            f"({self.jobs * self.workers} pods, elastic min {self.workers // 2}), {self.killed} nodes killed "
            f"at once, {self.hit} jobs hit; nodeLossTimeout {self.loss_timeout:.0f} s",
            f"{'submit -> all running':<34} {self.submit_to_running_s:8.1f} s",
            f"{'kill -> hit jobs running again':<34} p50 {percentile(rel, 0.5):6.1f} s  p99 "
            f"{percentile(rel, 0.99):6.1f} s  max {max(rel, default=float('nan')):6.1f} s  (n={len(rel)})",
            f"{'hit jobs restarted twice':<34} {self.restarted_twice:8d}   (jobs not hit but restarted: "
            f"{self.spurious})",
            f"{'operator RSS idle/running/after':<34} {self.rss_mib['idle']:6.0f} / {self.rss_mib['running']:6.0f}"
            f" / {self.rss_mib['after']:6.0f} MiB",
            f"{'operator CPU start-up/steady/recov':<34} {self.cpu_s['startup']:6.1f} / {self.cpu_s['steady']:6.1f}"
            f" / {self.cpu_s['recovery']:6.1f} s",
        ]
        for label, (n, p50, p99) in self.reconcile.items():
            lines.append(f"{'reconcile ' + label:<34} n={n:<7.0f} p50 {p50 * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms")
        lines.append(f"{'reconcile errors':<34} {self.errors:8.0f}")
        if self.control_plane_cpu_s:
            cpu = ", ".join(f"{n} {v:.0f}" for n, v in sorted(self.control_plane_cpu_s.items(), key=lambda x: -x[1]))
            lines.append(f"{'CPU s in the recovery':<34} operator {self.cpu_s['recovery']:.0f}, {cpu}; "
                         f"machine load {self.load_average:.1f} on {os.cpu_count()} cores")
        for label, secs, reqs in (("steady state", self.steady_s, self.steady_requests),
                                  ("recovery", self.recovery_s, self.recovery_requests)):
            text = ", ".join(f"{verb} {res}: {n}" for (verb, res), n in sorted(reqs.items())) or "none"
            lines.append(f"{'operator requests, ' + label:<34} ({secs:.0f} s) {text}")
        return "\n".join(lines)


def job_body(name: str, ns: str, workers: int, loss_timeout: float) -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": workers, "elasticPolicy": {"minReplicas": max(workers // 2, 1)},
                     "checkpoint": {"root": f"{support.MOUNT}/{ns}/{name}"},
                     "nodeLossTimeoutSeconds": int(loss_timeout), "template": kwok_worker_template()}}


def run_scale(kc: KwokCluster, *, nodes: int, jobs: int, workers: int, kill: int, loss_timeout: float = 30,
              steady: float = 30, timeout: float = 1800, log: Any = print) -> ScaleResult:
    """Nodes, then jobs until all run, a quiet steady state, then `kill` nodes at once until every hit
    job runs again on live nodes. The harness watches (informers), so its own reads cost no LISTs."""
    from kubernetes import client

    from resilient_operator.informer import Informer

    cl = kc.cluster
    names = [f"kwok-{i:04d}" for i in range(nodes)]
    t = time.monotonic()
    kc.add_nodes(names)
    log(f"{nodes} KWOK nodes Ready in {time.monotonic() - t:.0f} s")
    ns = "scale"
    cl.kubectl("create", "namespace", ns)
    cl.wait_for_default_sa(ns)
    api = cl.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    job_inf = Informer("bench-jobs", lambda **kw: custom.list_namespaced_custom_object(
        c.GROUP, c.VERSION, ns, c.PLURAL, **kw))
    pod_inf = Informer("bench-pods", lambda **kw: core.list_namespaced_pod(ns, **kw), label_selector=c.LABEL_JOB,
                       index=lambda p: p["metadata"]["labels"].get(c.LABEL_JOB))
    job_inf.start()
    pod_inf.start()
    pid = wait_for(lambda: support.operator_pid(cl), 60, "operator pid")
    rss = {"idle": support.process_rss_bytes(pid) / 2**20}
    cpu0 = cpu_seconds(pid)
    m0 = support.operator_metrics(cl)

    def statuses() -> dict[str, dict[str, Any]]:
        return {j["metadata"]["name"]: (j.get("status") or {}) for j in job_inf.items()}

    job_names = [f"j{i:05d}" for i in range(jobs)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: custom.create_namespaced_custom_object(
            c.GROUP, c.VERSION, ns, c.PLURAL, job_body(n, ns, workers, loss_timeout)), job_names))
    log(f"{jobs} jobs submitted in {time.monotonic() - t0:.0f} s")

    def all_running() -> bool:  # a spurious restart (attempt > 1) is counted at the end, not waited out
        st = statuses()
        return len(st) == jobs and all(s.get("phase") == c.RUNNING for s in st.values())

    wait_for(all_running, timeout, "every job running", interval=1)
    submit_s = time.monotonic() - t0
    log(f"all {jobs} jobs running {submit_s:.0f} s after submit")
    cpu1 = cpu_seconds(pid)
    rss["running"] = support.process_rss_bytes(pid) / 2**20
    time.sleep(5)  # let the last status writes and events settle before the quiet window
    s0, m1, cpu2 = _utcnow(), support.operator_metrics(cl), cpu_seconds(pid)
    time.sleep(steady)
    s1, m2, cpu3 = _utcnow(), support.operator_metrics(cl), cpu_seconds(pid)

    dead = set(names[:kill])
    placed: dict[str, set[str]] = {}
    for pod in pod_inf.items():
        placed.setdefault(pod["metadata"]["labels"][c.LABEL_JOB], set()).add(pod["spec"].get("nodeName"))
    hit = sorted(j for j, on in placed.items() if on & dead)
    before = {n: s.get("attempt", 1) for n, s in statuses().items()}
    comps = {n: comp.proc.pid for n, comp in cl.components.items() if comp.proc.poll() is None}
    cp0 = {n: cpu_seconds(p) for n, p in comps.items()}
    k0, tk = _utcnow(), time.monotonic()
    kc.kill_nodes(sorted(dead))
    log(f"killed {kill} nodes; {len(hit)} jobs hit")
    recovered: dict[str, float] = {}

    def job_back(name: str, st: dict[str, Any]) -> bool:
        if st.get("phase") != c.RUNNING or st.get("attempt", 0) <= before[name]:
            return False
        pods = [p for p in pod_inf.by_index(name)
                if p["metadata"]["labels"].get(c.LABEL_ATTEMPT) == str(st["attempt"])]
        return bool(pods) and all((p.get("status") or {}).get("phase") == "Running"
                                  and p["spec"].get("nodeName") not in dead for p in pods)

    def all_back() -> bool:
        st = statuses()
        now = time.monotonic() - tk
        for name in hit:
            if name not in recovered and job_back(name, st.get(name, {})):
                recovered[name] = now
        return len(recovered) == len(hit) and all(s.get("phase") == c.RUNNING for s in st.values())

    try:
        wait_for(all_back, timeout, f"the {len(hit)} hit jobs running again on live nodes", interval=0.5)
    finally:
        k1 = _utcnow()
        cp1 = {n: cpu_seconds(p) - cp0[n] for n, p in comps.items()}
    time.sleep(2)  # a window for a second, spurious restart to show
    st = statuses()
    m3 = support.operator_metrics(cl)
    rss["after"] = support.process_rss_bytes(pid) / 2**20
    cpu4 = cpu_seconds(pid)
    job_inf.stop()
    pod_inf.stop()
    errors = support.metric_samples(m3, "rtj_reconcile_errors_total")
    return ScaleResult(
        nodes=nodes, jobs=jobs, workers=workers, killed=kill, hit=len(hit), loss_timeout=loss_timeout,
        submit_to_running_s=submit_s, relaunch_s=[recovered[n] for n in hit if n in recovered],
        restarted_twice=sum(1 for n in hit if st[n].get("attempt", 1) - before[n] > 1),
        spurious=sum(1 for n, s in st.items() if n not in hit and s.get("attempt", 1) > 1),
        rss_mib=rss, cpu_s={"startup": cpu1 - cpu0, "steady": cpu3 - cpu2, "recovery": cpu4 - cpu3},
        steady_s=(s1 - s0).total_seconds(), steady_requests=operator_requests(kc.audit_log, s0, s1),
        recovery_s=(k1 - k0).total_seconds(), recovery_requests=operator_requests(kc.audit_log, k0, k1),
        reconcile={"start-up": reconcile_stats(m1, m0), "steady": reconcile_stats(m2, m1),
                   "recovery": reconcile_stats(m3, m2)},
        errors=sum(errors.values()), control_plane_cpu_s=cp1, load_average=os.getloadavg()[0],
    )


def _utcnow() -> datetime:
    return datetime.now(UTC)
