"""The node-loss scenario as a user lives it, shared by the e2e tests, `make demo` and the benchmark.

A job from `examples/job.yaml` (the tiny GPT trainer) is submitted to a cluster where the operator
was installed with helm; a node is killed after the first complete checkpoint; the recovery is timed
stage by stage from what the cluster and the trainer's own log say.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import ClusterLike, wait_for
from e2e.support import HOST_DIR, MOUNT, events, get_job, job_pods, running_attempt, wait_phase
from resilient_contract import lineage, storage
from resilient_operator import constants as c

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "job.yaml"
STEPS = 24  # the training scenarios' length, and the failure-free reference run's (conftest `reference`)
TOLERANCE = 1e-5  # relative L2 between final models across world sizes, see trainer_image/README.md
CLAIM = "rtj-checkpoints"


def shared_claim(cluster: ClusterLike, namespace: str) -> None:
    """The example's RWX claim, bound to the same storage the operator mounts (hostPath HOST_DIR)."""
    pv = f"{namespace}-{CLAIM}"
    cluster.apply([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": HOST_DIR, "type": "Directory"},
                  "claimRef": {"namespace": namespace, "name": CLAIM}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "10Gi"}}}},
    ])  # fmt: skip


def example_job(name: str, namespace: str, *, replicas: int = 4, min_replicas: int = 2, steps: int = 30,
                checkpoint_every: int = 5, step_delay: float = 0.3, node_loss_timeout: int = 4,
                extra_args: tuple[str, ...] = (), grow_back: bool = True,
                restart_strategy: str | None = c.RestartStrategy.RECREATE.value,
                **spec: Any) -> dict[str, Any]:  # fmt: skip
    """examples/job.yaml with the knobs a scenario turns: size, length, a root of its own, pool nodes.

    `restart_strategy` Recreate unless asked: the scenarios written for recreation keep testing it (the in-place
    ones ask for InPlace); None leaves it unset, so the API server applies the CRD's default (InPlace)."""
    job = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    job["metadata"] = {"name": name, "namespace": namespace}
    body = job["spec"]
    body["replicas"] = replicas
    body["elasticPolicy"].update(minReplicas=min_replicas, growBack=grow_back)
    body["checkpoint"]["root"] = f"{MOUNT}/{namespace}/{name}"
    body["nodeLossTimeoutSeconds"] = node_loss_timeout
    if restart_strategy is not None:
        body["restartStrategy"] = restart_strategy
    body.update(spec)
    pod = body["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 5
    pod["nodeSelector"] = {"pool": "train"}
    container = pod["containers"][0]
    container["resources"] = {"limits": {c.GPU_RESOURCE: "1"}}  # one worker per pool node
    args = [a for a in container["command"] if not a.startswith(("--steps=", "--checkpoint-every="))]
    container["command"] = [*args, f"--steps={steps}", f"--checkpoint-every={checkpoint_every}",
                            f"--step-delay={step_delay}", *extra_args]  # fmt: skip
    return job


def submit_example(cluster: ClusterLike, namespace: str, name: str, extra_args: tuple[str, ...] = (),
                   **kw: Any) -> dict[str, Any]:
    """The example job applied, dumping its final state beside its checkpoint root (to compare with the
    failure-free reference); `kw` as example_job's."""
    job = dumping_example(cluster, namespace, name, extra_args, **kw)
    cluster.apply(job)
    return job


def dumping_example(cluster: ClusterLike, namespace: str, name: str, extra_args: tuple[str, ...] = (),
                    **kw: Any) -> dict[str, Any]:
    """submit_example's job, not yet applied (for a test that holds its pods first)."""
    shared_claim(cluster, namespace)
    return example_job(name, namespace, extra_args=(f"--dump-state={MOUNT}/{namespace}/{name}.pt", *extra_args), **kw)


def host_root(cluster: ClusterLike, job: dict[str, Any]) -> Path:
    """Where the job's checkpoint root lives on this machine."""
    rel = job["spec"]["checkpoint"]["root"].removeprefix(MOUNT)
    return cluster.host_path(HOST_DIR + rel)


def first_complete_checkpoint(cluster: ClusterLike, job: dict[str, Any], timeout: float = 180) -> storage.Verdict:
    root = host_root(cluster, job)
    def latest() -> storage.Verdict | None:
        return storage.scan(storage.LocalStore(str(root)), storage.UNBOUNDED_SCAN).latest if root.is_dir() else None

    try:
        return wait_for(latest, timeout, "the first complete checkpoint")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{diagnosis(cluster, job, root)}") from None


def diagnosis(cluster: ClusterLike, job: dict[str, Any], root: Path) -> str:
    """What a failed wait leaves to read: the job's phase and conditions, each pod's phase and node, the last
    lines of rank 0's log, the events, and what is under the checkpoint root (each part bounded)."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    out = []
    try:
        status = get_job(cluster, ns, name).get("status", {})
        conditions = [(x.get("type"), x.get("status"), x.get("reason")) for x in status.get("conditions", [])]
        out.append(f"job: phase={status.get('phase')} attempt={status.get('attempt')} conditions={conditions}")
        pods = job_pods(cluster, ns, name)
        out += [f"pod {p.metadata.name}: {p.status.phase} on {p.spec.node_name} "
                f"rank={p.metadata.labels.get(c.LABEL_RANK)}" for p in pods]
        rank0 = next((p.metadata.name for p in pods if p.metadata.labels.get(c.LABEL_RANK) == "0"), None)
        if rank0:
            out.append(f"rank 0 log (tail):\n{''.join(cluster.pod_log(ns, rank0).splitlines(True)[-25:])}")
        out.append(f"events: {events(cluster, ns, name)[-10:]}")
    except Exception as err:  # a diagnosis must not hide the timeout it explains
        out.append(f"(cluster state unavailable: {err})")
    listing = sorted(str(p.relative_to(root)) for p in root.rglob("*"))[:40] if root.is_dir() else "absent"
    out.append(f"checkpoint root {root}: {listing}")
    return "\n".join(out)


def trainer_log(cluster: ClusterLike, namespace: str, pod: str) -> str:
    return cluster.pod_log(namespace, pod)


def result_line(log: str) -> dict[str, str] | None:
    """The trainer's `RTJ_RESULT step=.. digest=.. loss=..` line, parsed."""
    for line in reversed(log.splitlines()):
        if line.startswith("RTJ_RESULT "):
            return dict(w.split("=", 1) for w in line.split()[1:])
    return None


@dataclass
class Timeline:
    """Seconds from the node kill to each stage of the recovery."""

    node: str
    detected: float = float("nan")
    fenced: float = float("nan")
    running: float = float("nan")
    loaded: float = float("nan")
    first_step: float = float("nan")
    attempt: int = 0
    replicas: int = 0
    resumed_step: int | None = None
    notes: list[str] = field(default_factory=list)
    writes: dict[str, int] = field(default_factory=dict)  # API writes during the recovery (bench/node_loss.py)

    STAGES = ("detected", "fenced", "running", "loaded", "first_step")

    def row(self) -> str:
        return "  ".join(f"{s}={getattr(self, s):6.2f}s" for s in self.STAGES)


def kill_and_time(cluster: ClusterLike, namespace: str, name: str, node: str, timeout: float = 240) -> Timeline:
    """Kill `node`, then watch the job through every recovery stage (polls, each bounded)."""
    before = get_job(cluster, namespace, name)["status"]
    old_attempt = before["attempt"]
    old_pods = {p.metadata.name for p in job_pods(cluster, namespace, name)}
    t0 = time.monotonic()
    cluster.kill_node(node)
    tl = Timeline(node)
    deadline = t0 + timeout
    resumed = re.compile(r"^RTJ_RESUMED from=(\S+) step=(\d+)", re.M)
    while time.monotonic() < deadline and tl.first_step != tl.first_step:  # NaN until the last stage
        now = time.monotonic() - t0
        status = get_job(cluster, namespace, name).get("status", {})
        pods = job_pods(cluster, namespace, name)
        names = {p.metadata.name for p in pods}
        if tl.detected != tl.detected and (status.get("lastFailure") or {}).get("attempt") == old_attempt:
            tl.detected = now
        new = [p for p in pods if int(p.metadata.labels[c.LABEL_ATTEMPT]) > old_attempt]
        # Fenced: no pod of the broken attempt is left in it (Recreate: all gone; InPlace: the lost ones gone
        # and the kept ones moved into the new attempt, their old workers confirmed stopped by their agents).
        if tl.detected == tl.detected and tl.fenced != tl.fenced and not (old_pods & names - {
                p.metadata.name for p in new}):
            tl.fenced = now
        # Running: the new attempt's every pod is in it and runs (in place, kept pods are relabelled one by one,
        # so a partial set of new pods while the status already says Running is not yet the new gang).
        rank0 = next((p.metadata.name for p in new if p.metadata.labels.get(c.LABEL_RANK) == "0"), None)
        if tl.running != tl.running and new and rank0 and status.get("phase") == c.RUNNING and (
            status.get("attempt", 0) > old_attempt and len(new) == status.get("replicas")
        ) and all(p.status.phase == "Running" for p in new):
            tl.running, tl.attempt, tl.replicas = now, status["attempt"], len(new)
        if tl.running == tl.running and rank0:
            log = trainer_log(cluster, namespace, rank0)
            # A kept pod's log holds the earlier attempts too: read from its agent's start of this one.
            log = log[max(0, log.rfind(f"rtj-agent: attempt {tl.attempt} started")):]
            match = resumed.search(log)
            if match and tl.loaded != tl.loaded:
                tl.loaded, tl.resumed_step = now, int(match.group(2))
            if match and re.search(rf"^RTJ_STEP step=(?!{match.group(2)}\b)\d+", log[match.end():], re.M):
                tl.first_step = now
        time.sleep(0.1)
    return tl


def reference_run(out: Path) -> dict[str, Any]:
    """A failure-free run of the example training (2 local processes, no cluster): the model to match."""
    import torch

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "resilient_trainer.examples.tiny_gpt", f"--steps={STEPS}", "--checkpoint-every=0",
           f"--checkpoint-root={out / 'ckpt'}", f"--dump-state={out / 'state.pt'}"]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=300, capture_output=True)
    return torch.load(out / "state.pt", weights_only=False)  # type: ignore[no-any-return]


def relative_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Relative L2 distance between two state dicts (all tensors, as float64)."""
    import torch

    num = sum(float(torch.linalg.vector_norm(a[k].double() - b[k].double()) ** 2) for k in a)
    den = sum(float(torch.linalg.vector_norm(a[k].double()) ** 2) for k in a)
    return (num / den) ** 0.5


def fenced_gang_outcome(cluster: Any, ns: str, name: str, node: str, root: Path, uid: str,
                        reference_model: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """After a partition, what a user sees once the job ends: a FencedGangWriting event names the cut-off
    node, attempt 1's late write is in the history, the newest complete checkpoint was written by attempt 2
    (never by the fenced gang). Returns the final status and the final model's distance from the reference."""
    import torch

    story = wait_for(lambda: [e for e in events(cluster, ns, name) if e.startswith(c.REASON_FENCED_WRITER)], 60,
                     "a FencedGangWriting event")
    assert node in story[0], story
    final = wait_phase(cluster, ns, name, c.SUCCEEDED, 300)
    assert any(h.get("lateWrite") for h in final["history"] if h["attempt"] == 1), final["history"]
    latest = storage.discover(str(root), job=uid).latest
    assert latest is not None
    writer = lineage.parse_writer((Path(latest.path) / lineage.WRITER_FILE).read_bytes())
    assert writer == (uid, 2), (latest, writer)
    state = torch.load(root.with_suffix(".pt"), weights_only=False)
    return final, relative_difference(reference_model, state["model"])


def wait_steps(cluster: ClusterLike, ns: str, pod: str, steps: int, timeout: float = 120) -> None:
    wait_for(lambda: len(re.findall(r"^RTJ_STEP ", trainer_log(cluster, ns, pod), re.M)) >= steps, timeout,
             f"{steps} steps in {pod}")


def drain(cluster: ClusterLike, ns: str, name: str, node: str, timeout: int = 150) -> None:
    """`kubectl drain` of `node` (the Eviction API against the job's PodDisruptionBudget): it completes, and no
    pod of the job is left on the node."""
    drained = cluster.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout}s",
                              check=False, timeout=timeout + 30)
    assert drained.returncode == 0, drained.stderr
    assert not [p for p in job_pods(cluster, ns, name) if p.spec.node_name == node]


PREEMPTED = re.compile(r"^RTJ_PREEMPTED step=(\d+)", re.M)


def moved_at_its_step(cluster: ClusterLike, ns: str, name: str, old: list[Any], node: str, t0: float,
                      old_log: Callable[[], str] | None = None) -> dict[str, Any]:
    """The new attempt runs without `node`, resumed from the step the old one was stopped at, and its
    goodput matches what the harness saw. Returns the figures. `old_log`: the old rank 0's log, where the
    cluster forgets a deleted pod's log (kind; the local cluster keeps it)."""
    new = running_attempt(cluster, ns, name, 2, len(old), timeout=180)
    assert node not in {p.spec.node_name for p in new}
    rank0_old = next(p.metadata.name for p in old if p.metadata.labels[c.LABEL_RANK] == "0")
    stopped = PREEMPTED.search(old_log() if old_log else trainer_log(cluster, ns, rank0_old))
    assert stopped, "the old gang did not take the SIGTERM checkpoint path"
    status = get_job(cluster, ns, name)["status"]
    assert status["resumedFrom"]["step"] == int(stopped.group(1))
    assert status["restarts"] == {"infrastructure": 0, "application": 0, "planned": 1}
    rank0 = next(p.metadata.name for p in new if p.metadata.labels[c.LABEL_RANK] == "0")
    first = rf"^RTJ_STEP step={int(stopped.group(1)) + 1}\b"
    wait_for(lambda: re.search(first, trainer_log(cluster, ns, rank0), re.M), 120, "the first step after the restart")
    t1 = time.monotonic()

    def closed() -> dict[str, Any] | None:
        gp = get_job(cluster, ns, name)["status"].get("goodput") or {}
        return gp if gp.get("recoveries") == 1 else None

    gp = wait_for(closed, 60, "the recovery accounted in status.goodput")
    lost = sum(gp["lost"].values())
    truth = t1 - t0
    print(f"\ndrain of {node}: stopped at step {stopped.group(1)}, resumed at {status['resumedFrom']['step']}, "
          f"steps recomputed {gp['stepsRecomputed']}; lost {lost:.1f}s by stage {gp['lost']} vs "
          f"{truth:.1f}s measured by the harness (cordon -> first new step)")
    assert gp["stepsRecomputed"] == 0 and gp["lost"]["recompute"] == 0
    # the harness polls logs every ~0.1 s and the operator stamps whole milliseconds: a few seconds at most
    assert abs(lost - truth) <= 4.0, (lost, truth)
    assert any(e.startswith(c.REASON_DRAIN) and node in e for e in events(cluster, ns, name))
    return gp
