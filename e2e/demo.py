"""`make demo`: a training job survives a node loss on a local Kubernetes cluster, told as it happens.

Starts the local cluster (real control plane, simulated nodes; no Docker), installs the operator with
helm, submits examples/job.yaml, kills a node after the first complete checkpoint, and prints what a
user would watch: `kubectl get rtj` lines, the job's events, the recovery timeline, the final result.

    python -m e2e.demo [--keep] [--kind | --real-nodes] [--steps N]

`--real-nodes` runs it on real kubelets and containerd (e2e/realnodes/lane.py): the operator and the trainer
from the images our Dockerfiles build, three training nodes, Pod Security "restricted" enforced.
`--kind` runs it on kind (e2e/kindcluster/lane.py): four worker containers, the same Dockerfiles'
images `docker build` + `kind load`; without Docker of its own, on dockerd in a netns with a node image built
from our binaries.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from e2e import get_cluster, scenarios, support
from e2e.controlplane.binaries import ensure_binaries
from resilient_operator import constants as c

NS = "demo"
NAME = "tiny-gpt"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Narrator(threading.Thread):
    """Prints each new `kubectl get rtj` line and each new event while the scenario runs."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stop = threading.Event()

    def run(self) -> None:
        last_row, seen = "", set()
        while not self.stop.wait(0.5):
            try:
                table = self.cluster.kubectl("get", "rtj", NAME, "-n", NS, check=False).stdout.strip().splitlines()
                # A new line when anything but the AGE column changed.
                row = table[1].rsplit(None, 1)[0] if len(table) == 2 else last_row
                if row != last_row:
                    if not last_row:
                        say("  kubectl get rtj:  " + table[0])
                    last_row = row
                    say("                    " + table[1])
                for line in support.events(self.cluster, NS, NAME):
                    if line not in seen:
                        seen.add(line)
                        say(f"  event  {line}")
            except Exception as exc:  # the narrator never stops the demo
                say(f"  (narrator: {exc})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A job survives a node loss, on a local Kubernetes cluster.")
    parser.add_argument("--keep", action="store_true", help="keep the cluster running afterwards")
    parser.add_argument("--kind", action="store_true", help="run on kind (needs Docker) instead of the local cluster")
    parser.add_argument("--real-nodes", action="store_true",
                        help="real kubelets and containerd running the operator and trainer images (needs root)")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    if args.real_nodes:
        return real_nodes(args)
    if args.kind:
        return kind(args)
    say("building (or reusing) etcd, kube-apiserver, controller-manager, scheduler, kubectl, helm ...")
    ensure_binaries()
    say("starting the control plane and four training nodes (w0..w3) plus one for the operator ...")
    cluster = get_cluster("demo", detach=args.keep)
    narrator = Narrator(cluster)
    try:
        support.install_operator(cluster)
        say(f"operator installed with helm into {support.OPERATOR_NS}")
        cluster.kubectl("create", "namespace", NS)
        cluster.wait_for_default_sa(NS)
        # restartStrategy left to the CRD's default, InPlace, as a user's examples/job.yaml is
        job = scenarios.example_job(NAME, NS, steps=args.steps, checkpoint_every=5, step_delay=0.3,
                                    restart_strategy=None)
        return story(cluster, job, narrator, args)
    finally:
        finish(cluster, narrator, args.keep)


def story(cluster: Any, job: dict[str, Any], narrator: Narrator, args: argparse.Namespace) -> int:
    """Submit `job`, kill a node after its first complete checkpoint, narrate the recovery to the end."""
    workers = job["spec"]["replicas"]
    scenarios.shared_claim(cluster, NS)
    say(f"kubectl apply -f examples/job.yaml  ({workers} workers, min 2, {args.steps} steps, checkpoint every 5)")
    cluster.apply(job)
    narrator.start()
    pods = support.running_attempt(cluster, NS, NAME, 1, workers, timeout=300)
    first = scenarios.first_complete_checkpoint(cluster, job)
    victim = support.node_of(pods, "1")
    say(f"first complete checkpoint: step {first.step}. Killing node {victim} (SIGKILL, heartbeats stop) ...")
    timeline = scenarios.kill_and_time(cluster, NS, NAME, victim)
    entry = next((h for h in support.job_status(cluster, NS, NAME).get("history") or []
                  if h.get("attempt") == timeline.attempt), {})
    how = (f"in place: kept {len(entry.get('kept') or [])} pods, replaced {len(entry.get('replaced') or [])}"
           if entry.get("restart") == c.RestartStrategy.IN_PLACE else "by recreating the gang")
    say(f"recovered to {timeline.replicas} workers (attempt {timeline.attempt}) from step {timeline.resumed_step}, "
        f"{how}")
    say("recovery timeline (seconds after the kill):")
    for stage in timeline.STAGES:
        say(f"    {stage:<11} {getattr(timeline, stage):6.2f}")
    grace = 50 + 300
    say(f"stock Kubernetes would only begin evicting the dead node's pods after ~{grace} s "
        "(node-monitor-grace-period + the NoExecute toleration), and they would stay Terminating")  # fmt: skip
    final = support.wait_phase(cluster, NS, NAME, c.SUCCEEDED, 900)
    rank0 = next(p.metadata.name for p in support.job_pods(cluster, NS, NAME)
                 if p.metadata.labels[c.LABEL_RANK] == "0")  # fmt: skip
    result = scenarios.result_line(scenarios.trainer_log(cluster, NS, rank0)) or {}
    narrator.stop.set()
    say("  kubectl get rtj:  " + cluster.kubectl("get", "rtj", NAME, "-n", NS).stdout.strip().splitlines()[-1])
    say(f"job {final['phase']}: {result.get('step')} steps, final loss {result.get('loss')}, "
        f"model {result.get('digest', '?')[:23]}..., restarts {final['restarts']}")
    return 0


def real_nodes(args: argparse.Namespace) -> int:
    """The same story on real nodes: images built (or cached), kubelets + containerd, the chart from its image."""
    from e2e.realnodes import lane

    say("building (or reusing) the operator and CPU trainer images, kubelet, kube-proxy, CoreDNS ...")
    say(f"starting the control plane, training nodes {', '.join(lane.TRAIN_NODES)} and {lane.INFRA} "
        "(each a containerd + kubelet), importing the images, helm install ...")
    setup = lane.start("demo", log_level="INFO", detach=args.keep)
    cluster = setup.cluster
    narrator = Narrator(cluster)
    try:
        say("operator running from its image on node infra; setup took (s): "
            + ", ".join(f"{k} {v}" for k, v in setup.timings.items()))
        lane.create_namespace(cluster, NS)
        say(f"namespace {NS} enforces Pod Security 'restricted'")
        job = lane.lane_job(NAME, NS, replicas=len(lane.TRAIN_NODES), steps=args.steps, checkpoint_every=5,
                            step_delay=0.3)
        return story(cluster, job, narrator, args)
    finally:
        finish(cluster, narrator, args.keep, "python -m e2e.realnodes down")


def kind(args: argparse.Namespace) -> int:
    """The same story on kind: a worker container killed (docker kill), the images from our Dockerfiles."""
    from e2e.kindcluster import lane

    say("building (or reusing) kind, kubeadm and the node image; docker build of the operator and CPU trainer "
        f"images; kind: a control plane (the operator's node) and workers {', '.join(lane.TRAIN_NODES)}; "
        "kind load; helm ...")
    setup = lane.start("demo", log_level="INFO")
    cluster = setup.cluster
    narrator = Narrator(cluster)
    try:
        say("operator running from its image on the control-plane node; setup took (s): "
            + ", ".join(f"{k} {v}" for k, v in setup.timings.items()))
        lane.create_namespace(cluster, NS)
        say(f"namespace {NS} enforces Pod Security 'restricted'")
        job = lane.lane_job(setup, NAME, NS, replicas=len(lane.TRAIN_NODES), steps=args.steps, checkpoint_every=5,
                            step_delay=0.3)
        return story(cluster, job, narrator, args)
    finally:
        narrator.stop.set()
        cluster.stop()  # kind, its engine and netns: nothing is left running (--keep does not apply)
        say("kind cluster deleted")


def finish(cluster: Any, narrator: Narrator, keep: bool, down: str = "python -m e2e.localcluster down") -> None:
    narrator.stop.set()
    if keep:
        say(f"cluster kept. export KUBECONFIG={cluster.kubeconfig}; tear down with `{down} {cluster.dir}`")
    else:
        cluster.stop()
        say("cluster stopped")


if __name__ == "__main__":
    sys.exit(main())
