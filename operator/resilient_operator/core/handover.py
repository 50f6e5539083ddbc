"""The in-place handover (restartStrategy InPlace): hand kept pods their plans, follow the acknowledgements, and
replace the pods whose agents do not answer in time.

The launch step opens a handover (`status.inPlace`: the new attempt, when it began, the rendezvous host and
kept pod -> rank) and asks the shell to deliver each kept pod its signed plan. An agent that took its plan has
stopped its old workers and started the new attempt's; the shell then relabels the pod, which moves it into
the new attempt. Until every kept pod has moved, no new pod is created: no worker of the new attempt starts
before the old workers on kept pods are confirmed gone. A kept pod that is gone, or whose agent did not
acknowledge within `in_place_ack_seconds`, is replaced by a new pod for its rank (an event and the history
say so). Everything here is derived from status and the observed pods, so a restarted operator resumes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from resilient_contract.plan import Plan as AgentPlan
from resilient_contract.storage.listing import Verdict
from resilient_operator import constants as c
from resilient_operator.core import failures, inplace, render
from resilient_operator.core.model import Job, OperatorConfig, PodView
from resilient_operator.core.plan import Delivery
from resilient_operator.core.status import InPlace, JobStatus
from resilient_operator.core.timeutil import parse


def agent(job: Job, config: OperatorConfig) -> render.Agent | None:
    """The agent settings injected into this job's pods, or None when its recoveries recreate."""
    if inplace.recreate_reason(job, config):
        return None
    # Kept pods must outlive detection, a settling wait and the handover itself; after a hang, the operator's
    # next read of the verdicts and the wait for the gang's.
    linger = 2 * job.spec.node_loss_timeout + config.settle_seconds + config.in_place_ack_seconds
    if poll := failures.hang_poll(job.spec.progress_timeout):
        linger += poll + failures.HANG_GATHER_SECONDS
    return render.Agent(config.plan_public_key, config.agent_port, linger)


def delivery(job: Job, config: OperatorConfig, pod: PodView, rank: int, attempt: int, replicas: int,
             resume: Verdict | None, master: str) -> Delivery:
    """One kept pod's signed-to-be plan and the labels that move it into `attempt` once it acknowledges."""
    plan = AgentPlan(job_uid=job.uid, pod_uid=pod.uid, attempt=attempt, nnodes=replicas, node_rank=rank,
                     master_addr=render.pod_host(job, master), master_port=job.spec.master_port,
                     resume_from=resume.path if resume else "", master_agent_port=config.agent_port)
    annotations = {c.ANNOTATION_REPLICAS: str(replicas)}
    if resume:
        annotations[c.ANNOTATION_RESUME_FROM] = resume.path
        annotations[c.ANNOTATION_RESUME_STEP] = str(resume.step)
    return Delivery(pod=pod.name, address=pod.ip or "", port=config.agent_port, plan=plan,
                    labels={c.LABEL_ATTEMPT: str(attempt), c.LABEL_RANK: str(rank)}, annotations=annotations)


def open_handover(status: JobStatus, attempt: int, kept: dict[str, int], ts: str) -> None:
    master = next(name for name, rank in kept.items() if rank == 0)
    status["inPlace"] = {"attempt": attempt, "since": ts, "master": master, "pods": dict(kept)}


def master(status: JobStatus, attempt: int) -> str | None:
    """The kept pod that is rank 0 of `attempt` (None: the attempt was recreated, rank 0 is its own pod)."""
    handover = status.get("inPlace")
    return handover.get("master") if handover and handover.get("attempt") == attempt else None


def give_up(status: JobStatus) -> None:
    """The kept rendezvous host was replaced, and every plan names it: no kept pod waits any more, and the
    attempt's rank 0 is its own new pod from now on."""
    if handover := status.get("inPlace"):
        handover.pop("master", None)
        handover["pods"] = {}


def waiting(status: JobStatus, attempt: int, pods: Sequence[PodView]) -> dict[str, int]:
    """Kept pods of `attempt` whose agents have not taken their plans yet (still in an older attempt, alive)."""
    handover = status.get("inPlace")
    if not handover or handover.get("attempt") != attempt:
        return {}
    alive = {p.name for p in pods if p.attempt < attempt and not p.deleting}
    return {name: rank for name, rank in (handover.get("pods") or {}).items() if name in alive}


def follow(status: JobStatus, attempt: int, pods: Sequence[PodView], now: datetime, config: OperatorConfig,
           undeliverable: Mapping[str, str] | None = None) -> tuple[dict[str, int], dict[str, str], float]:
    """(still waiting, kept pods to replace now -> why, seconds left to wait).

    A kept pod is replaced at once when its plan cannot reach its agent however often it is sent
    (`undeliverable`, by pod uid: no agent listening, a refusal), and every waiting one once the bound is up.
    status.inPlace keeps every kept pod while they move: which ones are still waiting is read from the pods,
    so an acknowledgement costs the job no status write (one per kept pod before)."""
    handover: InPlace | None = status.get("inPlace")
    if not handover or handover.get("attempt") != attempt:
        return {}, {}, 0.0
    pending = waiting(status, attempt, pods)
    since = parse(handover.get("since"))
    elapsed = (now - since).total_seconds() if since else config.in_place_ack_seconds
    if pending and inplace.overdue(elapsed, config):
        handover["pods"] = {}
        why = f"did not take the plan within {config.in_place_ack_seconds:g}s"
        return {}, dict.fromkeys(sorted(pending), why), 0.0
    uids = {p.name: p.uid for p in pods}
    failed = {name: f"the plan could not be delivered ({result}): {_HINTS.get(result, _HINT)}"
              for name in sorted(pending) if (result := (undeliverable or {}).get(uids.get(name) or ""))}
    kept = handover.get("pods") or {}
    for name in failed:
        pending.pop(name)
        kept.pop(name, None)
    return pending, failed, max(0.0, config.in_place_ack_seconds - elapsed)


_HINT = "its agent answered, but not with this attempt's start"
_HINTS = {
    c.DELIVERY_UNREACHABLE: "nothing listens on the agent port (the container's command must be "
                            "resilient_trainer.launch, and a NetworkPolicy must let the operator in)",
    c.DELIVERY_REFUSED: "its agent refused the signature (an agent started with another operator's key?)",
    c.DELIVERY_STALE: "its agent runs a newer attempt",
    c.DELIVERY_BAD_ADDRESS: "the pod has no usable IP",
}
