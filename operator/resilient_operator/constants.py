"""Every API name, label, annotation, condition, phase and reason the operator uses, defined once."""

from __future__ import annotations

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

# Phases (status.phase); the CRD's enum lists the same values.
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
TERMINAL_PHASES = frozenset({SUCCEEDED, FAILED})

# Condition types (positive polarity, Kubernetes conventions).
COND_RUNNING = "Running"
COND_RECOVERING = "Recovering"
COND_CAPACITY = "CapacityAvailable"
COND_STORAGE = "CheckpointStorageReady"
COND_SUSPENDED = "Suspended"
COND_SUCCEEDED = "Succeeded"
COND_FAILED = "Failed"
COND_NODES_REPORTING = "NodesReporting"
COND_SPEC_VALID = "SpecValid"
COND_QUEUED = "Queued"  # True while a Kueue-managed job waits for its Workload to be admitted

# Failure kinds and the budgets they spend.
INFRASTRUCTURE = "Infrastructure"
APPLICATION = "Application"
HANG = "Hang"  # no step for spec.progressTimeoutSeconds; spends the infrastructure budget (core/budgets.py)
PLANNED = "Planned"  # a restart the operator chose (grow back, drain): spends restarts.planned

# Reasons: used in conditions, events, status.lastFailure and history.
REASON_NODE_LOST = "NodeLost"
REASON_NODE_NOT_READY = "NodeNotReady"
REASON_NODE_UNREACHABLE = "NodeUnreachable"
REASON_NODE_LEASE_STALE = "NodeLeaseStale"
REASON_NODE_DELETED = "NodeDeleted"
REASON_POD_DELETED = "PodDeleted"
REASON_EVICTED = "Evicted"
REASON_PREEMPTED = "Preempted"
REASON_DISRUPTED = "DisruptionTarget"
REASON_APP_FAILED = "ApplicationFailed"
REASON_IMAGE_CANNOT_START = "ContainerCannotStart"
REASON_GROW_BACK = "GrowBack"
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_STARTED = "AttemptStarted"
REASON_ALL_RUNNING = "AllWorkersRunning"
REASON_COMPLETED = "Completed"
REASON_INFRA_BUDGET = "InfrastructureBudgetExhausted"
REASON_APP_BUDGET = "ApplicationBudgetExhausted"
REASON_BELOW_MIN = "BelowMinReplicas"
REASON_ENOUGH = "EnoughCapacity"
REASON_BACKOFF = "BackingOff"
REASON_STORAGE_OK = "Readable"
REASON_STORAGE_UNREADABLE = "StorageUnreadable"
DISCOVERY_SKIPPED = "DiscoverySkipped"  # Listing.reason: not read this pass, the job could not launch anyway
REASON_ROOT_IN_USE = "RootInUse"  # another live job already uses the checkpoint root (and not both opted in)
REASON_CHECKPOINT_SKIPPED = "CheckpointSkipped"
REASON_DISRUPTION = "ClusterDisruption"
REASON_HEARTBEATS = "HeartbeatsFlowing"
REASON_FENCED_WRITER = "FencedGangWriting"  # a fenced attempt's cut-off gang saved a checkpoint
REASON_INVALID_SPEC = "InvalidSpec"  # the spec passed the CRD but the operator cannot use it
REASON_SPEC_OK = "SpecUsable"
REASON_HANG = "Hang"  # no training step for spec.progressTimeoutSeconds (the launcher ended the pod)
REASON_AVOID_NODE = "AvoidingNode"  # a node that broke an attempt is left out of the next ones for a while
REASON_NODE_TAINTED = "TaintedBadNode"  # (opt-in) a node blamed for repeated failures across jobs was tainted
REASON_DRAIN = "NodeDraining"  # a node of the attempt is cordoned or has a notice taint: planned restart
REASON_SETTLING = "WaitingForNodes"  # full capacity is seconds away: the launch waits, bounded
REASON_WAITING_FOR_ADMISSION = "WaitingForAdmission"
REASON_ADMITTED = "Admitted"
REASON_EVICTED_BY_KUEUE = "EvictedByKueue"  # event reason; the condition carries Kueue's own reason
REASON_REQUEUED_TO_GROW = "RequeuedToGrow"
REASON_QUOTA_RELEASED = "QuotaReleased"
REASON_KUEUE_UNAVAILABLE = "KueueUnavailable"  # the integration is on but Kueue's API is not served
REASON_CREATE_REJECTED = "CreateRejected"  # the API refused a pod/Service we rendered (admission, quota)

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
