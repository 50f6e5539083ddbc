"""The job's status as the core writes it: every key typed, so mypy sees a misspelt field.

A persisted dict, typed the way kopf types its `ProgressRecord`: `TypedDict(total=False)`, since an old
status (or one a user edited) may lack any key. The CRD's status schema declares the same fields
(tests/contracts checks that every field written here is declared there). Patches stay plain dicts.
"""

from __future__ import annotations

from typing import TypedDict


class Restarts(TypedDict, total=False):
    """Restarts spent per budget (core/budgets.py): infrastructure (hangs too), application, planned."""

    infrastructure: int  # node loss, eviction, preemption, hangs: spec.failurePolicy.maxInfrastructureRestarts
    application: int  # a non-zero exit with no infrastructure cause: maxApplicationRestarts, with backoff
    planned: int  # resume, drain, grow back, re-admission: no limit


class CheckpointRef(TypedDict, total=False):
    """A complete checkpoint: status.latestCheckpoint, status.resumedFrom."""

    path: str  # <root>/step-<10 digits>
    step: int


class BadCheckpoint(TypedDict, total=False):
    """A checkpoint a trainer refused: its bytes did not match their checksums (core/badcheckpoints.py)."""

    path: str  # <root>/step-<10 digits>[.a<attempt>]
    step: int
    time: str  # when the operator learnt of it


class LastFailure(TypedDict, total=False):
    """What broke the last attempt (core/failures.py), as the user reads it."""

    kind: str
    reason: str
    message: str
    node: str
    pod: str
    exitCode: int
    attempt: int
    time: str


class LastDrain(TypedDict, total=False):
    """The last planned restart for draining nodes (core/drain.py)."""

    nodes: list[str]
    reason: str
    attempt: int
    time: str
    step: int  # the step the gang had reached: an in-place launch waits for a checkpoint at least this new


class BadNode(TypedDict, total=False):
    """A node this job avoids for a while after it broke an attempt (core/badnodes.py)."""

    node: str
    reason: str
    avoided: bool
    expires: str
    failureTimes: list[str]
    attestedTimes: list[str]


class StepProgress(TypedDict, total=False):
    """The running attempt's step and its slowest rank (core/stragglers.py)."""

    attempt: int
    step: int
    slowestPod: str
    slowestNode: str
    slowestRank: int
    stepSeconds: float
    updatedAt: str


class LostSeconds(TypedDict, total=False):
    """Time lost to interruptions, by recovery stage (core/goodput.py STAGES)."""

    detection: float
    fencing: float
    relaunch: float
    load: float
    recompute: float


class OpenRecovery(TypedDict, total=False):
    """The interruption being recovered from: the stamps of its stages."""

    kind: str
    occurredAt: str
    detectedAt: str
    launchedAt: str
    runningAt: str
    reachedStep: int
    resumedStep: int


class Goodput(TypedDict, total=False):
    """Productive against lost time (core/goodput.py)."""

    productiveSeconds: float
    lostSeconds: float
    ratio: float
    stepsRecomputed: int
    recoveries: int
    stepSeconds: float
    asOf: str
    lost: LostSeconds
    open: OpenRecovery


class GrowBack(TypedDict, total=False):
    """Capacity is back: grow to `replicas` at the first checkpoint after `sinceStep` (core/growback.py)."""

    replicas: int  # the size capacity allows now
    sinceStep: int  # the newest checkpoint when it was noticed: the restart waits for a newer one


class KueueStatus(TypedDict, total=False):
    """A Kueue-managed job's Workload and admission (core/queueing.py)."""

    queueName: str
    workload: str  # the Workload's name (<job>-<generation>)
    generation: int  # bumped each time the Workload is replaced by a new one
    replace: bool  # the Workload asks for the wrong size: delete it once the gang is gone, then recreate
    admittedReplicas: int
    clusterQueue: str
    flavors: dict[str, str]


class LateWrite(TypedDict, total=False):
    """A checkpoint a fenced attempt's gang saved after it was fenced."""

    step: int  # the newest step it saved after the fence
    path: str
    time: str


class HistoryEntry(TypedDict, total=False):
    """One attempt in status.history (core/history.py): the lineage record fencing tokens are checked by."""

    attempt: int
    replicas: int
    resumedFromStep: int
    startTime: str
    endTime: str
    endReason: str
    nodes: list[str]
    lateWrite: LateWrite
    restart: str  # constants.RestartStrategy: how this attempt was started (absent for the first)
    kept: list[str]  # InPlace: the pods of the previous attempt that carry on in this one
    replaced: list[str]  # InPlace: the previous attempt's pods that were not kept
    fallback: str  # InPlace: why a kept pod was replaced after all


class Condition(TypedDict, total=False):
    """A Kubernetes condition (core/conditions.py)."""

    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: int


class InPlace(TypedDict, total=False):
    """status.inPlace: the last in-place start; a kept pod still in an older attempt is waiting (core/handover.py)."""

    attempt: int
    since: str
    master: str  # the pod whose agent becomes rank 0: the rendezvous host
    pods: dict[str, int]  # kept pod -> its rank in the new attempt, until its agent acknowledges


class JobStatus(TypedDict, total=False):
    """status of a ResilientTrainingJob (crds/resilienttrainingjobs.yaml)."""

    phase: str  # constants.Phase
    observedGeneration: int
    attempt: int
    replicas: int
    desiredReplicas: int
    workers: str
    worldSize: int
    restartCount: int
    restarts: Restarts
    startTime: str
    completionTime: str
    nextRetryTime: str
    lastFailure: LastFailure
    badNodes: list[BadNode]
    progress: StepProgress
    lastDrain: LastDrain
    latestCheckpoint: CheckpointRef
    resumedFrom: CheckpointRef
    badCheckpoints: list[BadCheckpoint]
    settlingSince: str
    goodput: Goodput
    growBack: GrowBack
    kueue: KueueStatus
    history: list[HistoryEntry]
    inPlace: InPlace
    conditions: list[Condition]
