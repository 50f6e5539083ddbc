"""Every API name, label, annotation, condition, phase and reason the operator uses, defined once."""

from __future__ import annotations

from enum import StrEnum

GROUP = "training.resilient.dev"
VERSION = "v1alpha1"
KIND = "ResilientTrainingJob"
PLURAL = "resilienttrainingjobs"
API_VERSION = f"{GROUP}/{VERSION}"

# Labels stamped on every pod (and the Service) the operator creates. The attempt label lets a
# restarted operator rebuild state from the cluster alone.
LABEL_JOB = f"{GROUP}/job-name"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_RANK = f"{GROUP}/rank"
LABEL_ROLE = f"{GROUP}/role"
ROLE_WORKER = "worker"

# Annotations on pods: what the attempt was launched with, so status can be rebuilt from pods.
ANNOTATION_REPLICAS = f"{GROUP}/replicas"
ANNOTATION_RESUME_FROM = f"{GROUP}/resume-from"
ANNOTATION_RESUME_STEP = f"{GROUP}/resume-step"
ANNOTATION_TEMPLATE_HASH = f"{GROUP}/template-hash"  # the spec.template a pod was rendered from (InPlace reuse)


# Phases (status.phase); the CRD's enum lists the same values.
class Phase(StrEnum):
    """status.phase: where the job is in its life (core/reconcile.py draws the machine)."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    BACKING_OFF = "BackingOff"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"  # Kueue-managed: waiting for (re-)admission of the job's Workload
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


# Condition types (positive polarity, Kubernetes conventions).
class ConditionType(StrEnum):
    """status.conditions[].type."""

    RUNNING = "Running"
    RECOVERING = "Recovering"
    CAPACITY = "CapacityAvailable"
    STORAGE = "CheckpointStorageReady"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    NODES_REPORTING = "NodesReporting"
    SPEC_VALID = "SpecValid"
    QUEUED = "Queued"  # True while a Kueue-managed job waits for its Workload to be admitted


# Failure kinds and the budgets they spend.
class FailureKind(StrEnum):
    """What broke (or stopped) an attempt: status.lastFailure.kind, the budget it spends, the goodput bucket."""

    INFRASTRUCTURE = "Infrastructure"
    APPLICATION = "Application"
    HANG = "Hang"  # no step for spec.progressTimeoutSeconds; spends the infrastructure budget (core/budgets.py)
    PLANNED = "Planned"  # a restart the operator chose (grow back, drain): spends restarts.planned


class RestartStrategy(StrEnum):
    """spec.restartStrategy: how a recovery executes the operator's plan (core/inplace.py)."""

    IN_PLACE = "InPlace"  # kept pods get the next attempt's plan; only missing ranks get new pods
    RECREATE = "Recreate"  # the whole gang is deleted and created again


# Reasons: used in conditions, events, status.lastFailure and history.
class Reason(StrEnum):
    """Why: conditions[].reason, event reasons, status.lastFailure.reason, history[].endReason."""

    NODE_LOST = "NodeLost"
    NODE_NOT_READY = "NodeNotReady"
    NODE_UNREACHABLE = "NodeUnreachable"
    NODE_LEASE_STALE = "NodeLeaseStale"
    NODE_DELETED = "NodeDeleted"
    POD_DELETED = "PodDeleted"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    DISRUPTED = "DisruptionTarget"
    APP_FAILED = "ApplicationFailed"
    IMAGE_CANNOT_START = "ContainerCannotStart"
    GROW_BACK = "GrowBack"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    STARTED = "AttemptStarted"
    ALL_RUNNING = "AllWorkersRunning"
    COMPLETED = "Completed"
    INFRA_BUDGET = "InfrastructureBudgetExhausted"
    APP_BUDGET = "ApplicationBudgetExhausted"
    BELOW_MIN = "BelowMinReplicas"
    ENOUGH = "EnoughCapacity"
    BACKOFF = "BackingOff"
    STORAGE_OK = "Readable"
    STORAGE_UNREADABLE = "StorageUnreadable"
    DISCOVERY_SKIPPED = "DiscoverySkipped"  # Listing.reason: not read this pass, the job could not launch anyway
    ROOT_IN_USE = "RootInUse"  # another live job already uses the checkpoint root (and not both opted in)
    CHECKPOINT_SKIPPED = "CheckpointSkipped"
    DISRUPTION = "ClusterDisruption"
    HEARTBEATS = "HeartbeatsFlowing"
    FENCED_WRITER = "FencedGangWriting"  # a fenced attempt's cut-off gang saved a checkpoint
    CHECKPOINT_CORRUPT = "CheckpointCorrupt"  # a trainer refused a checkpoint whose bytes failed their checksums
    INVALID_SPEC = "InvalidSpec"  # the spec passed the CRD but the operator cannot use it
    SPEC_OK = "SpecUsable"
    HANG = "Hang"  # no training step for spec.progressTimeoutSeconds (the launcher ended the pod)
    AVOID_NODE = "AvoidingNode"  # a node that broke an attempt is left out of the next ones for a while
    NODE_TAINTED = "TaintedBadNode"  # (opt-in) a node blamed for repeated failures across jobs was tainted
    DRAIN = "NodeDraining"  # a node of the attempt is cordoned or has a notice taint: planned restart
    SETTLING = "WaitingForNodes"  # full capacity is seconds away: the launch waits, bounded
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    ADMITTED = "Admitted"
    EVICTED_BY_KUEUE = "EvictedByKueue"  # event reason; the condition carries Kueue's own reason
    REQUEUED_TO_GROW = "RequeuedToGrow"
    QUOTA_RELEASED = "QuotaReleased"
    KUEUE_UNAVAILABLE = "KueueUnavailable"  # the integration is on but Kueue's API is not served
    CREATE_REJECTED = "CreateRejected"  # the API refused a pod/Service we rendered (admission, quota)
    IN_PLACE_FALLBACK = "InPlaceFallback"  # a kept pod's agent did not take the plan in time: it is replaced


# The vocabularies above under the flat names the code has always used (c.RUNNING, c.COND_QUEUED, ...).
PENDING = Phase.PENDING
STARTING = Phase.STARTING
RUNNING = Phase.RUNNING
RESTARTING = Phase.RESTARTING
WAITING_FOR_CAPACITY = Phase.WAITING_FOR_CAPACITY
BACKING_OFF = Phase.BACKING_OFF
SUSPENDED = Phase.SUSPENDED
QUEUED = Phase.QUEUED
SUCCEEDED = Phase.SUCCEEDED
FAILED = Phase.FAILED
COND_RUNNING = ConditionType.RUNNING
COND_RECOVERING = ConditionType.RECOVERING
COND_CAPACITY = ConditionType.CAPACITY
COND_STORAGE = ConditionType.STORAGE
COND_SUSPENDED = ConditionType.SUSPENDED
COND_SUCCEEDED = ConditionType.SUCCEEDED
COND_FAILED = ConditionType.FAILED
COND_NODES_REPORTING = ConditionType.NODES_REPORTING
COND_SPEC_VALID = ConditionType.SPEC_VALID
COND_QUEUED = ConditionType.QUEUED
INFRASTRUCTURE = FailureKind.INFRASTRUCTURE
APPLICATION = FailureKind.APPLICATION
HANG = FailureKind.HANG
PLANNED = FailureKind.PLANNED
REASON_NODE_LOST = Reason.NODE_LOST
REASON_NODE_NOT_READY = Reason.NODE_NOT_READY
REASON_NODE_UNREACHABLE = Reason.NODE_UNREACHABLE
REASON_NODE_LEASE_STALE = Reason.NODE_LEASE_STALE
REASON_NODE_DELETED = Reason.NODE_DELETED
REASON_POD_DELETED = Reason.POD_DELETED
REASON_EVICTED = Reason.EVICTED
REASON_PREEMPTED = Reason.PREEMPTED
REASON_DISRUPTED = Reason.DISRUPTED
REASON_APP_FAILED = Reason.APP_FAILED
REASON_IMAGE_CANNOT_START = Reason.IMAGE_CANNOT_START
REASON_GROW_BACK = Reason.GROW_BACK
REASON_IN_PLACE_FALLBACK = Reason.IN_PLACE_FALLBACK
REASON_SUSPENDED = Reason.SUSPENDED
REASON_RESUMED = Reason.RESUMED
REASON_STARTED = Reason.STARTED
REASON_ALL_RUNNING = Reason.ALL_RUNNING
REASON_COMPLETED = Reason.COMPLETED
REASON_INFRA_BUDGET = Reason.INFRA_BUDGET
REASON_APP_BUDGET = Reason.APP_BUDGET
REASON_BELOW_MIN = Reason.BELOW_MIN
REASON_ENOUGH = Reason.ENOUGH
REASON_BACKOFF = Reason.BACKOFF
REASON_STORAGE_OK = Reason.STORAGE_OK
REASON_STORAGE_UNREADABLE = Reason.STORAGE_UNREADABLE
DISCOVERY_SKIPPED = Reason.DISCOVERY_SKIPPED
REASON_ROOT_IN_USE = Reason.ROOT_IN_USE
REASON_CHECKPOINT_SKIPPED = Reason.CHECKPOINT_SKIPPED
REASON_DISRUPTION = Reason.DISRUPTION
REASON_HEARTBEATS = Reason.HEARTBEATS
REASON_FENCED_WRITER = Reason.FENCED_WRITER
REASON_CHECKPOINT_CORRUPT = Reason.CHECKPOINT_CORRUPT
REASON_INVALID_SPEC = Reason.INVALID_SPEC
REASON_SPEC_OK = Reason.SPEC_OK
REASON_HANG = Reason.HANG
REASON_AVOID_NODE = Reason.AVOID_NODE
REASON_NODE_TAINTED = Reason.NODE_TAINTED
REASON_DRAIN = Reason.DRAIN
REASON_SETTLING = Reason.SETTLING
REASON_WAITING_FOR_ADMISSION = Reason.WAITING_FOR_ADMISSION
REASON_ADMITTED = Reason.ADMITTED
REASON_EVICTED_BY_KUEUE = Reason.EVICTED_BY_KUEUE
REASON_REQUEUED_TO_GROW = Reason.REQUEUED_TO_GROW
REASON_QUOTA_RELEASED = Reason.QUOTA_RELEASED
REASON_KUEUE_UNAVAILABLE = Reason.KUEUE_UNAVAILABLE
REASON_CREATE_REJECTED = Reason.CREATE_REJECTED
TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})

# Notice taints of well-known termination handlers, checked against their sources:
# - Kubernetes: `node.kubernetes.io/unschedulable` (node-lifecycle controller, on a cordoned node).
# - AWS Node Termination Handler (github.com/aws/aws-node-termination-handler, pkg/node/node.go and its
#   README's TAINT_NODE): `aws-node-termination-handler/spot-itn` (spot interruption notice, 2 minutes),
#   `.../scheduled-maintenance`, `.../asg-lifecycle-termination`, `.../rebalance-recommendation`.
# - GKE: `cloud.google.com/impending-node-termination` (GoogleCloudPlatform/k8s-node-termination-handler
#   and GKE's maintenance handler for GPU VMs, `--taint=cloud.google.com/impending-node-termination::NoSchedule`).
# - Cluster Autoscaler: `ToBeDeletedByClusterAutoscaler` (the node is being scaled down).
# - Karpenter: `karpenter.sh/disrupted` (v1) and `karpenter.sh/disruption` (v1beta1, value `disrupting`).
# Not Azure's `kubernetes.azure.com/scalesetpriority=spot`: it marks every spot node for its whole life,
# not an imminent eviction (Azure's notice is a Scheduled Event, surfaced by a handler's own taint if any).
DEFAULT_DRAIN_TAINTS: tuple[str, ...] = (
    "node.kubernetes.io/unschedulable",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/rebalance-recommendation",
    "cloud.google.com/impending-node-termination",
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
)

# The extended resource NVIDIA's device plugin advertises (tests and docs count GPUs by it).
GPU_RESOURCE = "nvidia.com/gpu"

HISTORY_LIMIT = 20
BAD_CHECKPOINTS_LIMIT = 16  # status.badCheckpoints keeps the newest this many

# Kueue (https://kueue.sigs.k8s.io): a job labelled with a LocalQueue is held until its Workload is admitted.
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
WORKLOADS = "workloads"
RESOURCE_FLAVORS = "resourceflavors"
WORKLOAD_PRIORITY_CLASSES = "workloadpriorityclasses"
LABEL_QUEUE_NAME = f"{KUEUE_GROUP}/queue-name"
LABEL_PRIORITY_CLASS = f"{KUEUE_GROUP}/priority-class"  # a WorkloadPriorityClass name
WORKER_POD_SET = "workers"

# What became of an in-place plan sent to a pod's agent (delivery.py's metric labels; core.handover's
# InPlaceFallback messages explain the definitive ones).
DELIVERY_ACKNOWLEDGED = "acknowledged"
DELIVERY_REFUSED = "refused"
DELIVERY_STALE = "stale"
DELIVERY_MALFORMED = "malformed"
DELIVERY_HTTP_ERROR = "http_error"
DELIVERY_BAD_ANSWER = "bad_answer"
DELIVERY_TIMEOUT = "timeout"
DELIVERY_UNREACHABLE = "unreachable"
DELIVERY_BAD_ADDRESS = "bad_address"
