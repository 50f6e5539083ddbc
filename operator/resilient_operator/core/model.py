"""Typed, read-only views of what the shell observed: the job, its pods, the nodes. Pure structs.

The shell builds them from the API's dicts (`resilient_operator.views`), once, refusing shapes the core
cannot use, so the policies read plain, already-validated attributes (quantities as numbers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from resilient_contract.plan import DEFAULT_AGENT_PORT
from resilient_contract.progress import Hang
from resilient_operator import constants as c


@dataclass(frozen=True)
class ElasticPolicy:
    min_replicas: int
    max_replicas: int
    multiple_of: int
    grow_back: bool


@dataclass(frozen=True)
class FailurePolicy:
    max_infrastructure_restarts: int
    max_application_restarts: int
    backoff_seconds: int
    max_backoff_seconds: int


@dataclass(frozen=True)
class Toleration:
    key: str | None
    operator: str  # "Equal" | "Exists"
    effect: str | None


@dataclass(frozen=True)
class Placement:
    """What decides where a worker fits: the template's summed requests, node selector and tolerations."""

    requests: Mapping[str, Decimal]
    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]


LOCAL_STAGING_VOLUME = "rtj-checkpoint-local"  # the emptyDir the operator adds for spec.checkpoint.localStaging


class StagingMedium:
    """spec.checkpoint.localStaging.medium: where the node-local emptyDir lives."""

    DISK = "Disk"  # the node's ephemeral storage (emptyDir medium "")
    MEMORY = "Memory"  # a tmpfs: counts against the pod's memory limit


@dataclass(frozen=True)
class LocalStaging:
    """spec.checkpoint.localStaging: an emptyDir where a save's shards land before they are uploaded to the root."""

    medium: str = StagingMedium.DISK
    size_limit: str | None = None  # a Kubernetes quantity, as written (already checked to be a positive size)


@dataclass(frozen=True)
class JobSpec:
    replicas: int
    nproc_per_node: int
    elastic: ElasticPolicy
    template: Mapping[str, Any]
    checkpoint_root: str
    keep: int
    failure: FailurePolicy
    node_loss_timeout: float
    master_port: int
    suspend: bool
    placement: Placement
    progress_timeout: float | None = None  # spec.progressTimeoutSeconds: no step for this long is a hang
    bad_node_seconds: float = 3600.0  # spec.badNodeSeconds: how long a node that broke an attempt is avoided
    share_root: bool = False  # spec.checkpoint.shareRoot: may share its root with other jobs that opt in too
    restart_strategy: str = c.RestartStrategy.IN_PLACE  # spec.restartStrategy (core/inplace.py)
    local_staging: LocalStaging | None = None  # spec.checkpoint.localStaging; None: shards go straight to the root
    grace_seconds: float = 30.0  # the template's terminationGracePeriodSeconds: how long a stopping pod may save


@dataclass(frozen=True)
class Job:
    """The job object as observed: identity, parsed spec, and the raw status the core will rewrite."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: JobSpec
    status: Mapping[str, Any]
    problem: str | None = None  # the spec cannot be used as is: why, naming the field (spec is then a stand-in)
    queue_name: str | None = None  # the kueue.x-k8s.io/queue-name label: Kueue admits the job (core/queueing.py)
    priority: WorkloadPriority | None = None  # the WorkloadPriorityClass its label names, resolved by the shell
    root_in_use_by: str | None = None  # `namespace/name` of an older live job using the same root (the shell's)


@dataclass(frozen=True)
class LaunchResume:
    """What a pod's annotations say its attempt resumed from (to be re-checked against the job's root)."""

    path: str  # the resume-from annotation: a step directory
    step: int  # the resume-step annotation


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str
    message: str
    finished_at: datetime | None = None


@dataclass(frozen=True)
class PodView:
    """One pod of the job, reduced to the facts failure detection needs."""

    name: str
    attempt: int
    rank: int
    node_name: str | None
    phase: str
    deleting: bool
    reason: str = ""  # status.reason, e.g. Evicted
    message: str = ""
    disruption: str | None = None  # reason of a True DisruptionTarget condition
    terminations: tuple[Termination, ...] = ()
    waiting_reasons: tuple[str, ...] = ()
    ready: bool = False
    owner_uid: str | None = None  # uid of the controller ownerReference: identity, never labels
    launch_replicas: int | None = None  # the attempt's size, from our annotation (None if absent or malformed)
    launch_resume: LaunchResume | None = None  # the checkpoint the attempt resumed from, from our annotations
    ready_since: datetime | None = None  # when the Ready condition last turned True
    uid: str = ""  # metadata.uid: an in-place plan names it, so it steers this pod and no other
    ip: str | None = None  # status.podIP: where its agent listens
    template_hash: str | None = None  # our annotation: which spec.template it was rendered from


@dataclass(frozen=True)
class Progress:
    """What one pod's launcher last reported about its ranks' steps (a file in the job's area; untrusted,
    bounded and validated by the shell). Times are the launcher's clock, read against the operator's."""

    pod: str
    attempt: int
    step: int  # the lowest step any local rank completed
    updated: datetime  # when the file was last written (its mtime, as the operator's storage sees it)
    step_seconds: float | None = None  # the slowest local rank's recent mean step time
    slowest_rank: int | None = None  # global rank of that rank
    first_step_at: datetime | None = None  # when the first step of this attempt completed
    hung: Hang | None = None  # the launcher's hang verdict (an in-place agent keeps its pod and reports it)


@dataclass(frozen=True)
class OperatorConfig:
    """Cluster-wide settings from the chart's values (not per job)."""

    # A node hosting workers that gets one of these taints (any effect) is drained by a planned restart.
    drain_taints: frozenset[str] = frozenset(c.DEFAULT_DRAIN_TAINTS)
    # A relaunch waits at most this long for capacity that is seconds away (see core/settle.py).
    settle_seconds: float = 15.0
    # Opt-in cluster-wide bad-node tainting (core/badnodes.py): the taint key, or None when off.
    bad_node_taint: str | None = None
    bad_node_failures: int = 3
    bad_node_window_seconds: float = 3600.0
    bad_node_max_fraction: float = 0.1
    # restartStrategy InPlace (core/inplace.py): the operator's public plan key (empty: every restart
    # recreates), the agents' port, and how long kept pods' agents get to take a plan before they are replaced.
    plan_public_key: str = ""
    agent_port: int = DEFAULT_AGENT_PORT
    in_place_ack_seconds: float = 20.0  # a few POST timeouts (5 s) and resends on a loaded node


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True)
class NodeView:
    """A node and its heartbeat, as the scheduler and node-lifecycle controller would see it."""

    name: str
    ready: str  # "True" | "False" | "Unknown"
    ready_since: datetime | None
    taints: tuple[Taint, ...]
    unschedulable: bool
    lease_renewed: datetime | None
    allocatable: Mapping[str, Decimal]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class WorkloadPriority:
    """A WorkloadPriorityClass (named by the job's kueue.x-k8s.io/priority-class label) and its value."""

    name: str
    value: int


@dataclass(frozen=True)
class Admission:
    """What Kueue granted the job's pod set: the count and where (the assigned flavors' node labels)."""

    cluster_queue: str
    count: int
    flavors: Mapping[str, str]  # resource -> ResourceFlavor
    node_selector: Mapping[str, str]  # the flavors' nodeLabels, added to every worker
    tolerations: tuple[Mapping[str, Any], ...]  # the flavors' tolerations, added to every worker


@dataclass(frozen=True)
class WorkloadView:
    """The job's Kueue Workload as observed (the one it owns with a controller reference)."""

    name: str
    resource_version: str
    count: int  # spec.podSets[workers].count
    min_count: int | None
    conditions: tuple[Mapping[str, Any], ...]
    admission: Admission | None  # set while Kueue holds quota for it
    reclaimable: int  # status.reclaimablePods[workers].count
    deleting: bool = False

    def condition(self, ctype: str) -> Mapping[str, Any] | None:
        return next((cond for cond in self.conditions if cond.get("type") == ctype), None)

    def is_true(self, ctype: str) -> bool:
        cond = self.condition(ctype)
        return bool(cond and cond.get("status") == "True")
