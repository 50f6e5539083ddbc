"""Many jobs on one operator: memory, CPU, API requests and latency with nodes killed at once.

Two substrates. `--substrate kwok` (scale): KWOK fakes N nodes and their pods on the real local control
plane (no processes); J jobs of W workers (elastic min W/2) are submitted, run, sit through a quiet
steady state, then K nodes die at once, once per `--restart` strategy (InPlace, then Recreate, each on a
fresh cluster; under InPlace, e2e.kwokagents' stand-in agents take the plans at the pods' IPs). Reported:
submit -> all running; kill -> every hit job running again on live nodes (p50/p99/max); hit jobs restarted
twice; how the restarts ran (history), pods kept and created against pods lost, plan deliveries by result;
the operator's RSS and CPU seconds; its API requests by verb and resource (from the API server's audit log,
filtered to the operator's ServiceAccount) in the steady state and during the recovery, and when each kind
of write came after the kill; live nodes the harness saw quiet; reconcile latency p50/p99.

    python bench/scale_bench.py --substrate kwok --nodes 1000 --jobs 2000 --workers 8 --kill 100

`--substrate process` (the default, below): real node agents and worker processes.

Starts a local cluster (real control plane, simulated nodes), installs the operator with helm as the
e2e suite does, submits N one-worker jobs whose stand-in worker requests no GPU (each worker is a real
`sleep` process), waits until all run, kills K pool nodes, and waits until every job that lost its
worker runs again as attempt 2. Prints:

- the operator's RSS (its process, read from /proc) idle, with N jobs running, and after the recovery;
- reconcile latency (the operator's `rtj_reconcile_seconds` histogram scraped from its pod IP, port
  8080): count, mean, median and p95 (interpolated within Prometheus buckets);
- wall time from submit to all running, and from the kill to all hit jobs running again.

    python bench/scale_bench.py [--jobs 50] [--kill 2] [--nodes 4]      # --jobs 500 --nodes 6 at scale

Needs root (network namespaces) and the Kubernetes binaries (`make binaries`). Each worker is one
process and the simulated nodes are Python processes, so on a small machine the pods' start-up, not the
operator, dominates the wall times; the RSS and reconcile figures are the operator's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e import support
from e2e.cluster import ClusterLike, wait_for
from e2e.kwokagents import AgentFleet
from e2e.kwokcluster import KwokCluster, kwok_worker_template
from e2e.localcluster import Cluster
from resilient_operator import constants as c


# ---- the KWOK scale scenario (also run at CI size by e2e/tests/test_scale_kwok.py) --------------------------
def operator_requests(audit_log: Path, since: datetime, until: datetime) -> Counter[tuple[str, str]]:
    """The operator's API requests received in [since, until), by (verb, resource[/subresource])."""
    return Counter({k: len(v) for k, v in request_times(audit_log, since, until).items()})


def request_times(audit_log: Path, since: datetime, until: datetime) -> dict[tuple[str, str], list[float]]:
    """When (seconds after `since`) the API server received each of the operator's requests in [since, until),
    by (verb, resource[/subresource])."""
    seen: set[str] = set()
    out: dict[tuple[str, str], list[float]] = {}
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
            out.setdefault((event["verb"], resource), []).append((at - since).total_seconds())
    return out


def status_patches(audit_log: Path, since: datetime, until: datetime) -> Counter[str]:
    """The operator's status patches in [since, until), by job name (a job's recovery against goodput's clock)."""
    seen: set[str] = set()
    out: Counter[str] = Counter()
    with audit_log.open() as lines:
        for line in lines:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if event["verb"] != "patch" or ref.get("resource") != c.PLURAL or ref.get("subresource") != "status":
                continue
            if event["auditID"] in seen:
                continue
            seen.add(event["auditID"])
            at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if since <= at < until:
                out[ref.get("name", "?")] += 1
    return out


WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "APPLY": "patch"}


def api_writes(api: Any) -> Counter[tuple[str, str]]:
    """Every client's writes the API server has served so far (`write_counts` of its /metrics)."""
    resp = api.call_api("/metrics", "GET", _preload_content=False, _request_timeout=30)
    resp = resp[0] if isinstance(resp, tuple) else resp  # (data, status, headers) in older clients
    try:
        return write_counts(resp.data.decode())
    finally:
        resp.release_conn()


def write_counts(metrics: str) -> Counter[tuple[str, str]]:
    """Writes by (verb as the audit log names it, resource[/subresource]) from apiserver_request_total, summed
    over codes and scopes. It has no user label: the operator's own share comes from the audit log."""
    out: Counter[tuple[str, str]] = Counter()
    for key, value in support.metric_samples(metrics, "apiserver_request_total").items():
        if not key.startswith("apiserver_request_total{"):
            continue  # another family with this prefix
        labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
        verb = WRITE_VERBS.get(labels.get("verb", ""))
        if verb and labels.get("resource"):
            resource = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            out[(verb, resource)] += int(value)
    return out


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


def reconcile_stats(after: str, before: str, name: str = "rtj_reconcile_seconds") -> tuple[float, float, float]:
    """(count, p50 s, p99 s) of a histogram (rtj_reconcile_seconds) between two scrapes."""
    b1, _, n1 = histogram(after, name)
    b0, _, n0 = histogram(before, name)
    d = delta(b1, b0)
    return n1 - n0, quantile(d, 0.5), quantile(d, 0.99)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine since boot (/proc/stat's first line; iowait is idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def cpu_by_command() -> dict[tuple[int, str], float]:
    """(pid, command) -> CPU seconds of every process on the machine: the harness's view of who used the box."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        if comm.startswith("python"):  # which program: the module or script it runs
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                comm = next((argv[i + 1].decode() for i, a in enumerate(argv[:-1]) if a == b"-m"), None) \
                    or next((Path(a.decode()).name for a in argv[1:] if a.endswith(b".py")), comm)
        fields = raw.rsplit(")", 1)[1].split()
        out[(int(entry.name), comm)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_spent(before: dict[tuple[int, str], float], after: dict[tuple[int, str], float]) -> Counter[str]:
    """CPU seconds by command between two `cpu_by_command`s (a process started meanwhile counts from 0)."""
    spent: Counter[str] = Counter()
    for key, seconds in after.items():
        spent[key[1]] += seconds - before.get(key, 0.0)
    return spent


class MachineSampler:
    """The whole machine's busy share, once a second: is the box itself the bottleneck of a recovery?"""

    def __init__(self) -> None:
        import threading
        self.samples: list[tuple[float, float]] = []  # (seconds since start, busy share of all cores)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="machine-cpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = machine_jiffies()
        while not self._stop.wait(1.0):
            now = machine_jiffies()
            if now[1] > last[1]:
                self.samples.append((time.monotonic() - self._t0, (now[0] - last[0]) / (now[1] - last[1])))
            last = now

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class ScaleResult:
    restart: str  # the jobs' spec.restartStrategy
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
    lost_pods: int = 0  # hit jobs' pods on the killed nodes: what an in-place recovery must re-create
    executed: Counter[str] = field(default_factory=Counter)  # hit jobs by how their last restart ran (history)
    kept_pods: int = 0  # pods the hit jobs' last restarts kept (history)
    deliveries: dict[str, float] = field(default_factory=dict)  # the operator's plan deliveries by result
    plans_taken: int = 0  # plans the stand-in agents took (InPlace)
    delivery_s: tuple[float, float, float] = (0.0, math.nan, math.nan)  # plans acknowledged: n, p50, p99 (s)
    # live nodes whose Lease this harness saw unrenewed for half the timeout (the operator's "quiet": it holds
    # relaunches while any node counted as capacity is quiet): the most at once, and the share of the recovery
    quiet_live: tuple[int, float] = (0, 0.0)
    # (verb, resource) -> when the API server received the first, the median and the last of them, after the kill
    recovery_times: dict[tuple[str, str], tuple[float, float, float]] = field(default_factory=dict)
    harness_cpu_s: float = 0.0  # this process (informers, stand-in agents) during the recovery
    by_command: Counter[str] = field(default_factory=Counter)  # every process's CPU s in the recovery, by command
    # status patches in the recovery per job: the hit jobs' (p50, max) and the others' (p50: goodput's clock)
    patches_hit: tuple[float, float] = (math.nan, math.nan)
    patches_other: float = math.nan
    machine_busy: list[tuple[float, float]] = field(default_factory=list)  # (s after the kill, busy share)
    all_writes: Counter[tuple[str, str]] = field(default_factory=Counter)  # every client's, in the recovery

    def table(self) -> str:
        rel = self.relaunch_s
        lines = [
            f"KWOK scale bench, restartStrategy {self.restart}: {self.nodes} nodes, {self.jobs} jobs x "
            f"{self.workers} workers ({self.jobs * self.workers} pods, elastic min {self.workers // 2}), "
            f"{self.killed} nodes killed at once, {self.hit} jobs hit ({self.lost_pods} pods lost); "
            f"nodeLossTimeout {self.loss_timeout:.0f} s",
            f"{'submit -> all running':<34} {self.submit_to_running_s:8.1f} s",
            f"{'kill -> hit jobs running again':<34} p50 {percentile(rel, 0.5):6.1f} s  p99 "
            f"{percentile(rel, 0.99):6.1f} s  max {max(rel, default=float('nan')):6.1f} s  (n={len(rel)})",
            f"{'hit jobs restarted twice':<34} {self.restarted_twice:8d}   (jobs not hit but restarted: "
            f"{self.spurious})",
            f"{'hit jobs restarted, by execution':<34} "
            f"{', '.join(f'{k} {v}' for k, v in sorted(self.executed.items())) or 'none'}; pods kept "
            f"{self.kept_pods}, pod creates {self.recovery_requests.get(('create', 'pods'), 0)} "
            f"(lost {self.lost_pods})",
            f"{'plan deliveries, by result':<34} "
            f"{', '.join(f'{k} {v:.0f}' for k, v in sorted(self.deliveries.items())) or 'none'}"
            + (f"; plans the agents took {self.plans_taken}; submit -> acknowledged p50 {self.delivery_s[1]:.2f} s, "
               f"p99 {self.delivery_s[2]:.2f} s" if self.restart == c.RestartStrategy.IN_PLACE else ""),
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
                         f"harness {self.harness_cpu_s:.0f}; machine load {self.load_average:.1f} on "
                         f"{os.cpu_count()} cores")
        if self.machine_busy:
            busy = [b for _, b in self.machine_busy]
            late = [b for t, b in self.machine_busy if t >= self.loss_timeout - 5]
            lines.append(f"{'machine busy (all cores, 1 s)':<34} p50 {percentile(busy, 0.5):.0%}, from "
                         f"timeout - 5 s on: p50 {percentile(late, 0.5):.0%}, seconds >= 95% busy "
                         f"{sum(1 for b in late if b >= 0.95)} of {len(late)}")
        if self.by_command:
            busy_s = sum(b for _, b in self.machine_busy) * (os.cpu_count() or 1)
            top = ", ".join(f"{n} {v:.0f}" for n, v in self.by_command.most_common(10) if v >= 0.5)
            lines.append(f"{'CPU s by process, recovery':<34} {top}; all processes "
                         f"{sum(self.by_command.values()):.0f} of the machine's {busy_s:.0f} busy")
        lines.append(f"{'status patches per job, recovery':<34} hit jobs p50 {self.patches_hit[0]:.0f}, max "
                     f"{self.patches_hit[1]:.0f}; jobs not hit p50 {self.patches_other:.0f} (goodput's clock)")
        lines.append(f"{'live nodes quiet (timeout/2)':<34} at most {self.quiet_live[0]} at once, "
                     f"some quiet {self.quiet_live[1]:.0%} of the recovery")
        if self.recovery_times:
            text = ", ".join(f"{verb} {res} {a:.1f}/{m:.1f}/{b:.1f}" for (verb, res), (a, m, b)
                             in sorted(self.recovery_times.items(), key=lambda kv: kv[1][0]))
            lines.append(f"{'writes after the kill, first/p50/last':<34} {text} s")
        if self.all_writes:
            mine = self.recovery_requests
            others = Counter({k: n - mine.get(k, 0) for k, n in self.all_writes.items()})
            text = ", ".join(f"{verb} {res} {n}" for (verb, res), n in others.most_common(8) if n > 0)
            lines.append(f"{'writes by the others, recovery':<34} {sum(max(n, 0) for n in others.values())}"
                         f" (the operator's {sum(n for k, n in mine.items() if k[0] != 'get')}): {text}")
        for label, secs, reqs in (("steady state", self.steady_s, self.steady_requests),
                                  ("recovery", self.recovery_s, self.recovery_requests)):
            text = ", ".join(f"{verb} {res}: {n}" for (verb, res), n in sorted(reqs.items())) or "none"
            lines.append(f"{'operator requests, ' + label:<34} ({secs:.0f} s) {text}")
        return "\n".join(lines)


def job_body(name: str, ns: str, workers: int, loss_timeout: float,
             restart: str = c.RestartStrategy.IN_PLACE) -> dict[str, Any]:
    """A KWOK job; under InPlace its pods' plans are taken by e2e.kwokagents' stand-in agents."""
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": workers, "elasticPolicy": {"minReplicas": max(workers // 2, 1)},
                     "restartStrategy": str(restart),
                     "checkpoint": {"root": f"{support.MOUNT}/{ns}/{name}"},
                     "nodeLossTimeoutSeconds": int(loss_timeout), "template": kwok_worker_template()}}


def run_scale(kc: KwokCluster, *, nodes: int, jobs: int, workers: int, kill: int, loss_timeout: float = 30,
              steady: float = 30, timeout: float = 1800, restart: str = c.RestartStrategy.IN_PLACE,
              log: Any = print) -> ScaleResult:
    """Nodes, then jobs until all run, a quiet steady state, then `kill` nodes at once until every hit
    job runs again on live nodes. The harness watches (informers), so its own reads cost no LISTs.
    Under InPlace, stand-in agents (e2e.kwokagents) take the plans at the pods' IPs."""
    from kubernetes import client

    from resilient_operator.informer import Informer

    cl = kc.cluster
    names = [f"kwok-{i:04d}" for i in range(nodes)]
    t = time.monotonic()
    kc.add_nodes(names)
    log(f"{nodes} KWOK nodes Ready in {time.monotonic() - t:.0f} s")
    fleet = AgentFleet(cl.netns) if restart == c.RestartStrategy.IN_PLACE else None
    ns = "scale"
    cl.kubectl("create", "namespace", ns)
    cl.wait_for_default_sa(ns)
    api = cl.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    job_inf = Informer("bench-jobs", lambda **kw: custom.list_namespaced_custom_object(
        c.GROUP, c.VERSION, ns, c.PLURAL, **kw))
    pod_inf = Informer("bench-pods", lambda **kw: core.list_namespaced_pod(ns, **kw), label_selector=c.LABEL_JOB,
                       index=lambda p: p["metadata"]["labels"].get(c.LABEL_JOB),
                       handler=fleet.on_pod if fleet is not None else None)
    renewed: dict[str, tuple[str, float]] = {}  # node -> (renewTime, when this process saw it change)

    def on_lease(_etype: str, _old: Any, new: Any) -> None:
        if new is not None:
            rt = (new.get("spec") or {}).get("renewTime")
            name = new["metadata"]["name"]
            if renewed.get(name, ("", 0.0))[0] != rt:
                renewed[name] = (rt, time.monotonic())

    coordination = client.CoordinationV1Api(api)
    lease_inf = Informer("bench-leases", lambda **kw: coordination.list_namespaced_lease("kube-node-lease", **kw),
                         handler=on_lease)
    job_inf.start()
    pod_inf.start()
    lease_inf.start()
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
            c.GROUP, c.VERSION, ns, c.PLURAL, job_body(n, ns, workers, loss_timeout, restart)), job_names))
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
    placed: dict[str, list[str]] = {}
    for pod in pod_inf.items():
        placed.setdefault(pod["metadata"]["labels"][c.LABEL_JOB], []).append(pod["spec"].get("nodeName"))
    hit = sorted(j for j, on in placed.items() if dead.intersection(on))
    lost_pods = sum(1 for j in hit for node in placed[j] if node in dead)
    deliveries0 = support.metric_samples(m2, "rtj_plan_deliveries_total")
    before = {n: s.get("attempt", 1) for n, s in statuses().items()}
    comps = {n: comp.proc.pid for n, comp in cl.components.items() if comp.proc.poll() is None}
    cp0 = {n: cpu_seconds(p) for n, p in comps.items()}
    h0, all0 = cpu_seconds(os.getpid()), cpu_by_command()
    w0 = api_writes(api)
    k0, tk = _utcnow(), time.monotonic()
    sampler = MachineSampler()
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

    quiet_samples: list[int] = []  # live nodes not seen renewed for half the timeout, sampled every 0.5 s

    def all_back() -> bool:
        st = statuses()
        now = time.monotonic() - tk
        quiet_samples.append(sum(1 for n, (_, at) in list(renewed.items())
                                 if n not in dead and tk + now - at >= loss_timeout / 2))
        for name in hit:
            if name not in recovered and job_back(name, st.get(name, {})):
                recovered[name] = now
        return len(recovered) == len(hit) and all(s.get("phase") == c.RUNNING for s in st.values())

    try:
        wait_for(all_back, timeout, f"the {len(hit)} hit jobs running again on live nodes", interval=0.5)
    except BaseException:
        if fleet is not None:
            fleet.stop()
        raise
    finally:
        k1 = _utcnow()
        cp1 = {n: cpu_seconds(p) - cp0[n] for n, p in comps.items()}
        harness_cpu, by_command = cpu_seconds(os.getpid()) - h0, cpu_spent(all0, cpu_by_command())
        busy = sampler.stop()
    w1 = api_writes(api)  # (not in the finally: a failed wait's error is the one to see)
    time.sleep(2)  # a window for a second, spurious restart to show
    st = statuses()
    m3 = support.operator_metrics(cl)
    executed: Counter[str] = Counter()
    kept = 0
    for name in hit:
        last = next((h for h in reversed(st[name].get("history") or []) if h.get("restart")), {})
        executed[last.get("restart", "none")] += 1
        kept += len(last.get("kept") or ())
    deliveries = {k.split('result="', 1)[1].split('"', 1)[0]: v - deliveries0.get(k, 0.0)
                  for k, v in support.metric_samples(m3, "rtj_plan_deliveries_total").items() if 'result="' in k}
    plans_taken = fleet.plans_taken() if fleet is not None else 0
    if fleet is not None:
        fleet.stop()
        if fleet.bind_errors:  # those pods had no agent: their plans were refused, and they were replaced
            log(f"{len(fleet.bind_errors)} stand-in agents could not listen, e.g. {fleet.bind_errors[0]}")
    rss["after"] = support.process_rss_bytes(pid) / 2**20
    cpu4 = cpu_seconds(pid)
    job_inf.stop()
    pod_inf.stop()
    lease_inf.stop()
    errors = support.metric_samples(m3, "rtj_reconcile_errors_total")
    times = request_times(kc.audit_log, k0, k1)
    per_job = status_patches(kc.audit_log, k0, k1)
    hit_patches = [float(per_job.get(n, 0)) for n in hit]
    other_patches = [float(per_job.get(n, 0)) for n in sorted(set(job_names) - set(hit))]
    return ScaleResult(
        restart=str(restart), nodes=nodes, jobs=jobs, workers=workers, killed=kill, hit=len(hit),
        loss_timeout=loss_timeout,
        submit_to_running_s=submit_s, relaunch_s=[recovered[n] for n in hit if n in recovered],
        restarted_twice=sum(1 for n in hit if st[n].get("attempt", 1) - before[n] > 1),
        spurious=sum(1 for n, s in st.items() if n not in hit and s.get("attempt", 1) > 1),
        rss_mib=rss, cpu_s={"startup": cpu1 - cpu0, "steady": cpu3 - cpu2, "recovery": cpu4 - cpu3},
        steady_s=(s1 - s0).total_seconds(), steady_requests=operator_requests(kc.audit_log, s0, s1),
        recovery_s=(k1 - k0).total_seconds(), recovery_requests=Counter({k: len(v) for k, v in times.items()}),
        recovery_times={k: (min(v), percentile(v, 0.5), max(v)) for k, v in times.items() if k[0] != "get"},
        reconcile={"start-up": reconcile_stats(m1, m0), "steady": reconcile_stats(m2, m1),
                   "recovery": reconcile_stats(m3, m2)},
        delivery_s=reconcile_stats(m3, m2, "rtj_plan_delivery_seconds"),
        errors=sum(errors.values()), control_plane_cpu_s=cp1, load_average=os.getloadavg()[0],
        lost_pods=lost_pods, executed=executed, kept_pods=kept, harness_cpu_s=harness_cpu, machine_busy=busy,
        by_command=by_command, all_writes=Counter({k: n - w0.get(k, 0) for k, n in w1.items() if n > w0.get(k, 0)}),
        patches_hit=(percentile(hit_patches, 0.5), max(hit_patches, default=math.nan)),
        patches_other=percentile(other_patches, 0.5),
        deliveries={k: v for k, v in deliveries.items() if v}, plans_taken=plans_taken,
        quiet_live=(max(quiet_samples, default=0),
                    sum(1 for q in quiet_samples if q) / max(len(quiet_samples), 1)),
    )


def _utcnow() -> datetime:
    return datetime.now(UTC)


# ---- the process substrate and the command line ------------------------------------------------------------


def latency_line(label: str, text_after: str, text_before: str) -> str:
    b1, s1, n1 = histogram(text_after, "rtj_reconcile_seconds")
    b0, s0, n0 = histogram(text_before, "rtj_reconcile_seconds")
    d = delta(b1, b0)
    n = n1 - n0
    mean = (s1 - s0) / n if n else float("nan")
    return (f"{label:<28} reconciles {n:>6.0f}  mean {mean * 1000:7.1f} ms  median {quantile(d, 0.5) * 1000:7.1f} ms"
            f"  p95 {quantile(d, 0.95) * 1000:7.1f} ms")  # fmt: skip


def rss_mib(cl: ClusterLike) -> float:
    pid = wait_for(lambda: support.operator_pid(cl), 60, "operator pid")
    return support.process_rss_bytes(pid) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--substrate", choices=("process", "kwok"), default="process")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--kill", type=int, default=2, help="pool nodes killed once all jobs run")
    ap.add_argument("--nodes", type=int, default=4, help="pool nodes (each holds up to --pods-per-node pods)")
    ap.add_argument("--pods-per-node", type=int, default=250)
    ap.add_argument("--workers", type=int, default=8, help="kwok: workers per job (elastic min is half)")
    ap.add_argument("--loss-timeout", type=float, default=30, help="kwok: the jobs' nodeLossTimeoutSeconds")
    ap.add_argument("--steady", type=float, default=60, help="kwok: seconds of quiet steady state measured")
    ap.add_argument("--operator-workers", type=int, default=None, help="kwok: RTJ_WORKERS for the operator")
    ap.add_argument("--restart", type=lambda v: [c.RestartStrategy(x) for x in v.split(",")],
                    default=[c.RestartStrategy.IN_PLACE, c.RestartStrategy.RECREATE],
                    help="kwok: the jobs' restartStrategy, one fresh cluster each (default InPlace,Recreate)")
    ap.add_argument("--operator-env", action="append", default=[], metavar="NAME=VALUE",
                    help="kwok: an environment variable for the operator (repeatable)")
    ap.add_argument("--keep", action="store_true", help="kwok: keep the cluster's logs (its directory is printed)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    if args.kill >= args.nodes:
        ap.error("--kill must leave at least one pool node")
    if args.substrate == "kwok":
        run_kwok(args)
        return

    cl = Cluster.start("scale", node_monitor_grace_period="8s")
    try:
        for i in range(args.nodes):
            cl.add_node(f"w{i}", cpu="64", memory="256Gi", gpus=1, pods=args.pods_per_node, labels={"pool": "train"})
        support.install_operator(cl, pool=(), values={}, wait="180s")
        support.wait_operator_ready(cl)
        wait_for(lambda: support.operator_metrics(cl), 60, "operator metrics")
        ns = "scale"
        cl.kubectl("create", "namespace", ns)
        cl.wait_for_default_sa(ns)
        idle_rss = rss_mib(cl)
        m0 = support.operator_metrics(cl)
        names = [f"j{i:04d}" for i in range(args.jobs)]
        t0 = time.monotonic()
        for start in range(0, len(names), 50):  # one kubectl apply per 50 jobs
            batch = [support.tiny_job(n, ns) for n in names[start:start + 50]]
            cl.apply(batch)
        submit_s = time.monotonic() - t0

        def phases() -> dict[str, int]:
            out: dict[str, int] = {}
            for st in support.job_statuses(cl, ns).values():
                key = f"{st.get('phase', 'None')}/a{st.get('attempt', 0)}"
                out[key] = out.get(key, 0) + 1
            return out

        wait_for(lambda: phases().get(f"{c.RUNNING}/a1") == args.jobs, args.timeout, "every job running", interval=2)
        all_running_s = time.monotonic() - t0
        m1 = support.operator_metrics(cl)
        busy_rss = rss_mib(cl)

        pods = support.core(cl).list_namespaced_pod(ns, label_selector=c.LABEL_JOB).items
        placed = {p.metadata.labels[c.LABEL_JOB]: p.spec.node_name for p in pods}
        dead = [f"w{i}" for i in range(args.kill)]
        hit = sorted(n for n, node in placed.items() if node in dead)
        t1 = time.monotonic()
        for node in dead:
            cl.kill_node(node)

        def recovered() -> bool:
            """Every job Running on a live node and each hit job restarted (attempt 2, or 3 if it was ever
            relaunched onto the second dead node: the attempt counts below show it)."""
            now = support.job_statuses(cl, ns)
            if any(st.get("phase") != c.RUNNING for st in now.values()):
                return False
            if any(now[n].get("attempt", 0) < 2 for n in hit):
                return False
            live = support.core(cl).list_namespaced_pod(ns, label_selector=c.LABEL_JOB).items
            return all(p.spec.node_name not in dead and p.status.phase == "Running" for p in live)

        wait_for(recovered, args.timeout, f"the {len(hit)} hit jobs running again on live nodes", interval=2)
        recover_s = time.monotonic() - t1
        attempts = phases()
        m2 = support.operator_metrics(cl)
        after_rss = rss_mib(cl)

        print(f"\nscale bench: {args.jobs} jobs (1 worker each, no GPU), {args.nodes} pool nodes, "
              f"killed {args.kill} ({', '.join(dead)}), {len(hit)} jobs lost their worker")  # fmt: skip
        print(f"{'submit (kubectl apply)':<28} {submit_s:7.1f} s")
        print(f"{'submit -> all running':<28} {all_running_s:7.1f} s")
        print(f"{'kill -> hit jobs running':<28} {recover_s:7.1f} s  (phase/attempt: {attempts})")
        print(f"{'operator RSS idle':<28} {idle_rss:7.1f} MiB")
        print(f"{'operator RSS, jobs running':<28} {busy_rss:7.1f} MiB")
        print(f"{'operator RSS after recovery':<28} {after_rss:7.1f} MiB")
        print(latency_line("reconcile, start-up", m1, m0))
        print(latency_line("reconcile, recovery", m2, m1))
        relaunch = histogram(m2, "rtj_time_to_relaunch_seconds")
        print(f"{'time to relaunch (operator)':<28} median {quantile(relaunch[0], 0.5):.2f} s  "
              f"p95 {quantile(relaunch[0], 0.95):.2f} s  (n={relaunch[2]:.0f})")  # fmt: skip
        errors = support.metric_samples(m2, "rtj_reconcile_errors_total")
        print(f"{'reconcile errors':<28} {sum(errors.values()):.0f} {dict(errors) if errors else ''}")
    finally:
        cl.stop(remove=True)


def run_kwok(args: argparse.Namespace) -> None:
    """One fresh cluster per restart strategy, one after the other (the same sizes, the same machine)."""
    results = []
    for restart in args.restart:
        kc = KwokCluster.start("kwokbench")
        try:
            kc.install_operator(workers=args.operator_workers,
                                env=dict(kv.split("=", 1) for kv in args.operator_env))
            result = run_scale(kc, nodes=args.nodes, jobs=args.jobs, workers=args.workers, kill=args.kill,
                               loss_timeout=args.loss_timeout, steady=args.steady, timeout=args.timeout,
                               restart=restart,
                               log=lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True))
            results.append(result)
            print("\n" + result.table() + "\n", flush=True)
        finally:
            kc.stop(remove=not args.keep)
            if args.keep:
                print(f"logs kept in {kc.cluster.dir}")
    for result in results:
        p99 = percentile(result.relaunch_s, 0.99)
        steady_lists = sum(n for (verb, _), n in result.steady_requests.items() if verb == "list")
        creates = result.recovery_requests.get(("create", "pods"), 0)
        # a hit job's own patches beyond what goodput's clock writes for every job in the same window
        patches = result.patches_hit[0] - result.patches_other
        print(f"goals, {result.restart}: relaunch p99 {p99:.1f} s <= {args.loss_timeout + 5:.0f} s: "
              f"{p99 <= args.loss_timeout + 5}; pod creates {creates} = lost pods {result.lost_pods}: "
              f"{creates == result.lost_pods}; status patches per hit job, beyond the clock's, p50 {patches:.0f} <= 4: "
              f"{patches <= 4}; no LIST in steady state: {steady_lists == 0}; "
              f"RSS {result.rss_mib['after']:.0f} MiB < 500 MiB: {result.rss_mib['after'] < 500}")  # fmt: skip


if __name__ == "__main__":
    main()
