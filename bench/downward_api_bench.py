"""How long a pod annotation takes to reach a downward-API volume on a real kubelet (issue 26's channel table).

In-place recovery could have handed a kept pod its plan as a pod annotation, read by the agent from a
downward-API volume. Whether the kubelet rewrites such a volume when the annotation changes or only on its
periodic sync decides whether that channel is usable; this measures the delay on the real-node substrate (a
real kubelet and containerd), with the kubelet's `syncFrequency` at the lane's 5 s and at Kubernetes' default
of 1 min. (Measured on kubelet 1.34: ~0.6 s either way, so the kubelet acts on the pod update. The operator's
channel, a signed POST to the agent, is one HTTP round trip and is not measured here.)

    python bench/downward_api_bench.py [--changes 8] [--sync 5s,1m]        # root: real nodes

The pod (busybox) polls its volume every 50 ms and prints when the value changes, with the kernel's uptime;
the pod runs on this machine, so that clock is the harness's. Prints, per syncFrequency: median, p90 and max
seconds from the annotation's PATCH returning to the pod seeing the new value.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e.cluster import wait_for
from e2e.realnodes import RealCluster
from e2e.realnodes import config as rn_config

NS = "dapi"
KEY = "rtj.example/plan"
# busybox: print "<uptime s> <value>" whenever the file's content changes (busybox's date has no %N; the
# kernel's uptime, 10 ms resolution, is the same clock for the pod and the harness)
WATCH = ('last=""; while :; do v=$(cat /podinfo/plan 2>/dev/null); '
         'if [ "$v" != "$last" ]; then read up _ < /proc/uptime; echo "SEEN $up $v"; last="$v"; fi; '
         'usleep 50000; done')


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def pod(c: RealCluster, name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "annotations": {KEY: "0"}},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": c.images["busybox"], "command": ["sh", "-c", WATCH],
                                     "volumeMounts": [{"name": "podinfo", "mountPath": "/podinfo"}]}],
                     "volumes": [{"name": "podinfo", "downwardAPI": {"items": [
                         {"path": "plan", "fieldRef": {"fieldPath": f"metadata.annotations['{KEY}']"}}]}}]}}


def seen(c: RealCluster, name: str) -> dict[str, float]:
    """value -> when the pod first saw it (kernel uptime, seconds)."""
    out: dict[str, float] = {}
    for line in c.pod_log(NS, name).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "SEEN":
            out.setdefault(parts[2], float(parts[1]))
    return out


def measure(sync: str, changes: int) -> list[float]:
    original = rn_config.kubelet_config

    def with_sync(*args, **kw):  # type: ignore[no-untyped-def]
        cfg = original(*args, **kw)
        cfg["syncFrequency"] = sync
        return cfg

    rn_config.kubelet_config = with_sync  # type: ignore[assignment]
    c = RealCluster.start("dapi")
    try:
        c.add_node("n1")
        c.kubectl("create", "namespace", NS)
        c.wait_for_default_sa(NS)
        c.apply(pod(c, "watcher"))
        wait_for(lambda: "0" in seen(c, "watcher"), 120, "the pod reading its volume")
        delays = []
        for i in range(1, changes + 1):
            c.kubectl("annotate", "pod", "watcher", "-n", NS, "--overwrite", f"{KEY}={i}")
            t0 = uptime()
            when = wait_for(lambda v=str(i): seen(c, "watcher").get(v), 300, f"value {i} in the volume")
            delays.append(max(0.0, when - t0))
            print(f"  syncFrequency {sync}: change {i} seen after {delays[-1]:.2f} s", file=sys.stderr)
        return delays
    finally:
        rn_config.kubelet_config = original  # type: ignore[assignment]
        c.stop(remove=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--changes", type=int, default=8)
    p.add_argument("--sync", default="5s,1m", help="kubelet syncFrequency values to measure")
    args = p.parse_args()
    rows = {}
    for sync in args.sync.split(","):
        d = sorted(measure(sync, args.changes))
        rows[sync] = d
    print(f"\n{'kubelet syncFrequency':>22} {'n':>3} {'median s':>9} {'p90 s':>7} {'max s':>7}")
    for sync, d in rows.items():
        p90 = d[min(len(d) - 1, round(0.9 * (len(d) - 1)))]
        print(f"{sync:>22} {len(d):>3} {statistics.median(d):>9.2f} {p90:>7.2f} {max(d):>7.2f}")
    print(json.dumps({k: [round(x, 3) for x in v] for k, v in rows.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
