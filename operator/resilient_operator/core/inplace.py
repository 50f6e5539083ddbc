"""restartStrategy InPlace: which pods of a broken or stopped attempt carry on into the next one, their new ranks,
and when to recreate instead.

The operator plans a recovery as it always did (the size the healthy capacity allows, the newest complete
checkpoint, the fencing); this policy decides how to execute it. A pod is kept when it is Running on a
healthy node the job does not avoid and is not draining, was rendered from the current template, and its
agent can be reached (uid and IP known). Kept pods take ranks 0..k-1 in their old order (so the lowest one
is the new rendezvous host), new pods take the rest; extra kept pods beyond the new size are replaced. A
pod on a lost node, including a partitioned one whose containers still run, is never kept.

Pure: the same observations give the same answer, so a restarted operator reaches the same arrangement.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resilient_operator import constants as c
from resilient_operator.core.health import Health
from resilient_operator.core.model import Job, LocalStaging, OperatorConfig, PodView


def template_hash(template: Mapping[str, Any], local_staging: LocalStaging | None = None) -> str:
    """A short digest of spec.template and what else shapes the pod: a pod rendered from another is never reused.

    spec.checkpoint.localStaging adds a volume, which a kept pod cannot gain: it counts as the template. Without
    it the digest is the template's alone, as before, so pods of running jobs stay keepable across an upgrade."""
    shaped: Any = template
    if local_staging is not None:
        shaped = {"template": template, "localStaging": dataclasses.asdict(local_staging)}
    return hashlib.sha256(json.dumps(shaped, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def job_hash(job: Job) -> str:
    """The digest this job's pods carry (render stamps it; a pod whose digest differs is never kept)."""
    return template_hash(job.spec.template, job.spec.local_staging)


def recreate_reason(job: Job, config: OperatorConfig) -> str | None:
    """Why this job's recoveries recreate every pod (None: in place where pods can be kept)."""
    if job.spec.restart_strategy != c.RestartStrategy.IN_PLACE:
        return "spec.restartStrategy is Recreate"
    if not config.plan_public_key:
        return "the operator has no plan signing key"
    return None


def keepable(pods: Sequence[PodView], health: Health, avoid: Collection[str], current_hash: str) -> list[PodView]:
    """The pods that may carry on: Running, not deleting, on a healthy node not avoided, current template."""
    return [p for p in pods
            if p.phase == "Running" and not p.deleting and p.uid and p.ip and p.node_name
            and health.healthy(p.node_name) and p.node_name not in avoid and p.template_hash == current_hash]


@dataclass(frozen=True)
class Arrangement:
    """The next attempt: kept pod -> its new rank, the ranks new pods take, and the pods not kept."""

    kept: dict[str, int]
    new_ranks: tuple[int, ...]
    replaced: tuple[str, ...]

    @property
    def master(self) -> str | None:
        """The kept pod that becomes rank 0 (the rendezvous host), if any pod is kept."""
        return next((name for name, rank in self.kept.items() if rank == 0), None)


def arrange(previous: Sequence[PodView], keep: Sequence[PodView], replicas: int) -> Arrangement:
    """Kept pods first, in their old rank order; at most `replicas` of them; new ranks after them."""
    ordered = sorted(keep, key=lambda p: (p.rank, p.name))[:replicas]
    kept = {p.name: rank for rank, p in enumerate(ordered)}
    return Arrangement(kept, tuple(range(len(kept), replicas)),
                       tuple(sorted(p.name for p in previous if p.name not in kept)))


def overdue(since_seconds: float, config: OperatorConfig) -> bool:
    """The kept pods' agents had their time to acknowledge: replace the ones that did not."""
    return since_seconds >= config.in_place_ack_seconds
