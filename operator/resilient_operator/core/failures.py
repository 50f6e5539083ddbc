"""Which failure, if any, broke the current attempt, and which budget it spends.

Infrastructure causes (a lost node, eviction, preemption, a deleted pod) win over application
causes in the same attempt: when a node dies, its peers then fail their collectives and exit
non-zero, and that is collateral damage, not a bug in the training script.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from resilient_contract import completion
from resilient_operator import constants as c
from resilient_operator.core.health import Health, NodeLoss
from resilient_operator.core.model import PodView, Progress, Termination

# status.reason values a kubelet or the control plane sets when the machine, not the program, failed.
_INFRA_POD_REASONS = {
    "Evicted": c.REASON_EVICTED,
    "Preempting": c.REASON_PREEMPTED,
    "NodeLost": c.REASON_NODE_LOST,
    "Shutdown": c.REASON_NODE_LOST,
    "NodeShutdown": c.REASON_NODE_LOST,
    "Terminated": c.REASON_NODE_LOST,
    "UnexpectedAdmissionError": c.REASON_EVICTED,
}
# Signals only the kubelet or the control plane can give (a tenant's container cannot write them, and a
# tenant cannot cause them with its own pods): only these count towards a cluster-wide taint (badnodes.py).
_ATTESTED_POD_REASONS = frozenset(_INFRA_POD_REASONS)  # status.reason: written by the kubelet
_ATTESTED_DISRUPTIONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"})
_DISRUPTION_REASONS = {
    "PreemptionByScheduler": c.REASON_PREEMPTED,
    "PreemptionByKubeScheduler": c.REASON_PREEMPTED,
    "EvictionByEvictionAPI": c.REASON_EVICTED,
    "DeletionByTaintManager": c.REASON_NODE_LOST,
    "DeletionByPodGC": c.REASON_NODE_LOST,
    "TerminationByKubelet": c.REASON_EVICTED,
}
# A hang report waits this long for the other pods of the gang to end too: every launcher has the same
# timeout, but each sees only its own ranks, so the one that fires first need not be the one that stopped
# first (the others' last step can be newer by a step). Its peers normally end within a second or two;
# this bounds the wait when one of them cannot (a wedged launcher) or lingers (an agent whose peer is gone).
HANG_GATHER_SECONDS = 3.0
# An in-place agent keeps its pod on a hang and reports the verdict in its progress report, which storage
# cannot push: a job whose agents do that re-reads its reports this often (a quarter of its progress
# timeout, between these bounds).
HANG_POLL_MIN_SECONDS, HANG_POLL_MAX_SECONDS = 1.0, 10.0
# Waiting reasons that mean the container will not start without a change to the job.
CANNOT_START = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
     "CreateContainerError", "RunContainerError"}
)


@dataclass(frozen=True)
class Failure:
    kind: str  # constants.INFRASTRUCTURE | constants.APPLICATION | constants.HANG
    reason: str
    message: str
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    lost_nodes: tuple[str, ...] = ()
    occurred: datetime | None = None  # the last sign of life before it, when known better than the exit
    attested: bool = False  # the node's heartbeat, the kubelet or the control plane says so: not the tenant


def finished_ok(pod: PodView) -> bool:
    """Succeeded, or recorded success (termination message) before an abort at interpreter exit."""
    if pod.phase == "Succeeded":
        return True
    return pod.phase == "Failed" and any(
        (outcome := completion.parse_message(t.message)) is not None and outcome.succeeded for t in pod.terminations
    )


def lost_nodes(pods: Sequence[PodView], health: Health) -> dict[str, NodeLoss]:
    """Every lost node hosting a pod of the attempt."""
    return health.losses(p.node_name for p in pods if p.node_name)


def settled(pod: PodView, pods: Sequence[PodView], health: Health) -> bool:
    """Whether a failed pod's exit can be blamed on the application yet.

    When a node dies its peers often fail first (a reset connection ends their collective at once),
    before the dead node's lease goes stale. So an exit counts as an application failure only once
    every node of the attempt has proved itself alive after it (renewed its lease since the exit), or,
    without leases to go by, once the node-loss timeout has passed.
    """
    ended = max((t.finished_at for t in pod.terminations if t.finished_at), default=None)
    if ended is None:
        return True
    for name in {p.node_name for p in pods if p.node_name}:
        node = health.nodes.get(name)
        renewed = node.lease_renewed if node else None
        if renewed is None:
            if health.now - ended < timedelta(seconds=health.timeout):
                return False
        elif renewed <= ended:
            return False
    return True


def detect(pods: Sequence[PodView], replicas: int, all_created: bool, health: Health,
           reports: Sequence[Progress] = ()) -> Failure | None:
    """The failure of the current attempt, or None while it is healthy (or still starting). `reports`: the
    launchers' progress reports of these pods (an in-place agent's hang verdict is there)."""
    by_rank = {p.rank: p for p in pods}
    lost = lost_nodes(pods, health)
    if lost:
        names = sorted(lost)
        victim = min((p for p in pods if p.node_name == names[0]), key=lambda p: p.rank)
        message = "; ".join(lost[n].message for n in names)
        return Failure(c.INFRASTRUCTURE, c.REASON_NODE_LOST, message, pod=victim.name, node=names[0],
                       lost_nodes=tuple(names), attested=True)
    for pod in sorted(pods, key=lambda p: p.rank):
        if pod.disruption:
            reason = _DISRUPTION_REASONS.get(pod.disruption, c.REASON_DISRUPTED)
            return Failure(c.INFRASTRUCTURE, reason, f"pod {pod.name} disrupted: {pod.disruption}",
                           pod=pod.name, node=pod.node_name, attested=pod.disruption in _ATTESTED_DISRUPTIONS)
        if pod.phase == "Failed" and pod.reason in _INFRA_POD_REASONS:
            return Failure(c.INFRASTRUCTURE, _INFRA_POD_REASONS[pod.reason],
                           f"pod {pod.name} {pod.reason}: {pod.message}".rstrip(": "),
                           pod=pod.name, node=pod.node_name, attested=pod.reason in _ATTESTED_POD_REASONS)
        if pod.deleting and not finished_ok(pod):  # its exit code (143 after SIGTERM) is a consequence
            return Failure(c.INFRASTRUCTURE, c.REASON_POD_DELETED, f"pod {pod.name} is being deleted",
                           pod=pod.name, node=pod.node_name)
    if hang := hung(pods, reports):  # while it gathers its peers' reports, their own exits are not failures either
        return None if gathering(pods, health, reports) else hang
    if all_created:
        for rank in range(replicas):
            if rank not in by_rank:
                return Failure(c.INFRASTRUCTURE, c.REASON_POD_DELETED, f"worker rank {rank} pod was deleted")
    for pod in sorted(pods, key=lambda p: p.rank):
        if pod.phase == "Failed" and not finished_ok(pod) and settled(pod, pods, health):
            code = next((t.exit_code for t in pod.terminations if t.exit_code), None)
            detail = next((t.reason for t in pod.terminations if t.reason), "") or pod.reason
            return Failure(c.APPLICATION, c.REASON_APP_FAILED,
                           f"pod {pod.name} exited with code {code}" + (f" ({detail})" if detail else ""),
                           pod=pod.name, node=pod.node_name, exit_code=code)
        stuck = CANNOT_START.intersection(pod.waiting_reasons)
        if stuck:
            why = sorted(stuck)[0]
            return Failure(c.APPLICATION, c.REASON_IMAGE_CANNOT_START,
                           f"pod {pod.name} cannot start its container: {why}; check the image and pod spec",
                           pod=pod.name, node=pod.node_name)
    return None


def hung(pods: Sequence[PodView], reports: Sequence[Progress] = ()) -> Failure | None:
    """The launchers declared a hang: name the last step and who stopped first (the lowest step reported,
    then the rank with the oldest progress: in a synchronous job the others wait for it in the next
    collective). A verdict comes in a pod's RTJ_HUNG termination message (the pod ended) or, from an
    in-place agent that keeps its pod, in its progress report."""
    verdicts = list(_verdicts(pods, reports))
    if not verdicts:
        return None
    v = min(verdicts, key=lambda v: (v.step, -v.stalled, v.pod.rank))
    same = sorted(w.pod.name for w in verdicts if w.step == v.step)
    message = (f"no training step for {v.timeout}s: hang at step {v.step}; rank {v.rank} (pod {v.pod.name} on node "
               f"{v.pod.node_name}) stopped first" + (f"; pods at that step: {', '.join(same)}" if len(same) > 1
                                                      else ""))
    try:  # its last step: when progress stopped
        began = v.at - timedelta(seconds=v.stalled) if v.at else None
    except OverflowError:  # a finish time at the edge of the calendar
        began = None
    return Failure(c.HANG, c.REASON_HANG, message, pod=v.pod.name, node=v.pod.node_name, occurred=began)


@dataclass(frozen=True)
class _Verdict:
    pod: PodView
    step: int  # -1: unknown
    stalled: float
    rank: str
    timeout: str
    at: datetime | None  # when it was declared (the pod's end, or its report)


def _verdicts(pods: Sequence[PodView], reports: Sequence[Progress]) -> Iterator[_Verdict]:
    """One verdict per pod: its RTJ_HUNG termination message, else the hang in its report while it runs.
    Tenant-written either way: every field bounded where it was parsed, unknown when unreadable."""
    told = set()
    for pod, term, outcome in _hang_reports(pods):
        at, seconds = outcome.int_field("step"), outcome.seconds_field("stalled_s") or 0.0
        who, limit = outcome.int_field("rank", 2**31 - 1), outcome.seconds_field("timeout_s")
        told.add(pod.name)
        yield _Verdict(pod, -1 if at is None else at, seconds, "?" if who is None else str(who),
                       "?" if limit is None else f"{limit:g}", term.finished_at)
    for pod, report in _reported_hangs(pods, reports):
        if pod.name not in told:
            assert report.hung is not None
            yield _Verdict(pod, report.hung.step, report.hung.stalled_seconds, str(report.hung.rank),
                           f"{report.hung.timeout_seconds:g}", report.updated)


def _reported_hangs(pods: Sequence[PodView], reports: Iterable[Progress]) -> Iterator[tuple[PodView, Progress]]:
    """The running pods (an in-place agent waiting for its plan) whose report of this attempt names a hang."""
    by_name = {p.name: p for p in pods}
    for report in reports:
        pod = by_name.get(report.pod)
        if report.hung is not None and pod is not None and pod.attempt == report.attempt and not pod.terminations:
            yield pod, report


def _hang_reports(pods: Sequence[PodView]) -> Iterator[tuple[PodView, Termination, completion.Outcome]]:
    """Every RTJ_HUNG termination message of the attempt's pods, parsed (bounded: completion.parse_message)."""
    for pod in pods:
        for term in pod.terminations:
            outcome = completion.parse_message(term.message)
            if outcome and outcome.kind == completion.HUNG:
                yield pod, term, outcome


def gathering(pods: Sequence[PodView], health: Health, reports: Sequence[Progress] = ()) -> bool:
    """A hang was declared and a peer still runs without a verdict of its own, for at most
    HANG_GATHER_SECONDS after the first: wait, so the message names the rank that stopped first."""
    declared = [t.finished_at for _, t, _ in _hang_reports(pods) if t.finished_at]
    reported = {pod.name: report.updated for pod, report in _reported_hangs(pods, reports)}
    declared += reported.values()
    if not declared or not any(p.phase in ("Pending", "Running") and not p.terminations and p.name not in reported
                               for p in pods):
        return False
    return health.now - min(declared) < timedelta(seconds=HANG_GATHER_SECONDS)


def hang_poll(progress_timeout: float | None) -> float | None:
    """How often to re-read the progress reports for a hang verdict (None: no watchdog, no verdicts)."""
    if not progress_timeout:
        return None
    return min(HANG_POLL_MAX_SECONDS, max(HANG_POLL_MIN_SECONDS, progress_timeout / 4))


def unsettled(pods: Sequence[PodView], health: Health, reports: Sequence[Progress] = ()) -> bool:
    """A pod failed but we cannot yet tell whether a dying node caused it, or a hang report waits for its
    peers': look again shortly."""
    return (any(p.phase == "Failed" and not finished_ok(p) and not settled(p, pods, health) for p in pods)
            or gathering(pods, health, reports))


def all_succeeded(pods: Sequence[PodView], replicas: int) -> bool:
    ranks = {p.rank for p in pods if finished_ok(p)}
    return len(ranks) >= replicas and all(r in ranks for r in range(replicas))
