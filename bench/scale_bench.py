"""Many jobs on one operator: memory, CPU, API requests and latency with nodes killed at once.

Two substrates. `--substrate kwok` (scale): KWOK fakes N nodes and their pods on the real local control
plane (no processes); J jobs of W workers (elastic min W/2) are submitted, run, sit through a quiet
steady state, then K nodes die at once. Reported from the same run: submit -> all running; kill -> every
hit job running again on live nodes (p50/p99/max); hit jobs restarted twice; the operator's RSS and CPU
seconds; its API requests by verb and resource (from the API server's audit log, filtered to the
operator's ServiceAccount) in the steady state and during the recovery; reconcile latency p50/p99.

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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e import support
from e2e.kwokcluster import KwokCluster, delta, histogram, percentile, quantile, run_scale
from e2e.localcluster.cluster import Cluster, wait_for
from resilient_operator import constants as c


def latency_line(label: str, text_after: str, text_before: str) -> str:
    b1, s1, n1 = histogram(text_after, "rtj_reconcile_seconds")
    b0, s0, n0 = histogram(text_before, "rtj_reconcile_seconds")
    d = delta(b1, b0)
    n = n1 - n0
    mean = (s1 - s0) / n if n else float("nan")
    return (f"{label:<28} reconciles {n:>6.0f}  mean {mean * 1000:7.1f} ms  median {quantile(d, 0.5) * 1000:7.1f} ms"
            f"  p95 {quantile(d, 0.95) * 1000:7.1f} ms")  # fmt: skip


def rss_mib(cl: Cluster) -> float:
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
        cl.add_node("infra", cpu="4", memory="8Gi", labels={"role": "infra"})
        cl.host_path(support.HOST_DIR).mkdir(parents=True, exist_ok=True)
        cl.kubectl("create", "namespace", support.OPERATOR_NS)
        cl.helm("install", support.RELEASE, str(support.CHART), "--namespace", support.OPERATOR_NS, "--wait",
                "--timeout", "180s", "--set", f"checkpointStorage.hostPath={support.HOST_DIR}",
                "--set", f"checkpointStorage.mountPath={support.MOUNT}",
                "--set", "nodeSelector.role=infra")  # fmt: skip
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
    kc = KwokCluster.start("kwokbench")
    try:
        kc.install_operator(workers=args.operator_workers)
        result = run_scale(kc, nodes=args.nodes, jobs=args.jobs, workers=args.workers, kill=args.kill,
                           loss_timeout=args.loss_timeout, steady=args.steady, timeout=args.timeout,
                           log=lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True))
        print("\n" + result.table())
        p99 = percentile(result.relaunch_s, 0.99)
        steady_lists = sum(n for (verb, _), n in result.steady_requests.items() if verb == "list")
        print(f"goals: relaunch p99 {p99:.1f} s <= {args.loss_timeout + 5:.0f} s: {p99 <= args.loss_timeout + 5}; "
              f"no LIST in steady state: {steady_lists == 0}; RSS {result.rss_mib['after']:.0f} MiB < 500 MiB: "
              f"{result.rss_mib['after'] < 500}")  # fmt: skip
    finally:
        kc.stop(remove=not args.keep)
        if args.keep:
            print(f"logs kept in {kc.cluster.dir}")


if __name__ == "__main__":
    main()
