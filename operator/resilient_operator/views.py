"""The boundary: API objects (dicts) in, the core's typed views out. A template the core cannot use is
refused here with a reason naming the field, instead of crashing a reconcile on every retry.

Everything in a job spec or on a pod is tenant-written: labels, annotations and templates are parsed
defensively; quantities go through the kubernetes client's own parser; the identity of a pod is its
controller ownerReference (uid), never a label.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from resilient_contract import environment
from resilient_contract.storage import roots, s3
from resilient_operator import constants as c
from resilient_operator.core import timeutil
from resilient_operator.core.model import (
    LOCAL_STAGING_VOLUME,
    Admission,
    ElasticPolicy,
    FailurePolicy,
    Job,
    JobSpec,
    LaunchResume,
    LocalStaging,
    NodeView,
    Placement,
    PodView,
    StagingMedium,
    Taint,
    Termination,
    Toleration,
    WorkloadView,
)

# One reconcile renders every pod of an attempt from the template; bound what that may cost.
MAX_RENDERED_BYTES = 64 * 2**20


class SpecProblem(ValueError):
    """The spec cannot be used; the message names the field and says what to change."""


def job_view(obj: Mapping[str, Any]) -> Job:
    meta = obj["metadata"]
    status = obj.get("status")
    base: dict[str, Any] = {
        "name": meta["name"],
        "namespace": meta.get("namespace", "default"),
        "uid": meta.get("uid", ""),
        "generation": _int(meta.get("generation"), 1),
        "status": dict(status) if isinstance(status, Mapping) else {},
        "queue_name": queue_name(meta),
    }
    raw = obj.get("spec")
    try:
        return Job(spec=job_spec(raw if isinstance(raw, Mapping) else {}), **base)
    except SpecProblem as exc:
        return Job(spec=_stand_in(raw), problem=str(exc), **base)


MAX_GRACE_SECONDS = 3600.0  # an in-place drain waits at most this long for the stopped gang's checkpoint


def grace_seconds(template: Mapping[str, Any]) -> float:
    """The pods' terminationGracePeriodSeconds (Kubernetes' 30 when unset). Only a wait is bounded by it, so a
    value the API server will refuse at pod creation is not this parser's to refuse: it counts as unset."""
    pod = template.get("spec")
    value = pod.get("terminationGracePeriodSeconds") if isinstance(pod, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return 30.0
    return float(min(value, MAX_GRACE_SECONDS))


def job_spec(spec: Mapping[str, Any]) -> JobSpec:
    """Parse a (CRD-defaulted) spec; raise SpecProblem naming the first field the core cannot use."""
    try:
        ep, fp = _mapping(spec, "elasticPolicy"), _mapping(spec, "failurePolicy")
        replicas = int(spec["replicas"])
        template = _mapping(spec, "template")
        parsed = JobSpec(
            replicas=replicas,
            nproc_per_node=int(spec["nprocPerNode"]),
            elastic=ElasticPolicy(
                min_replicas=int(ep["minReplicas"]),
                max_replicas=int(ep.get("maxReplicas", replicas)),
                multiple_of=int(ep["replicasMultipleOf"]),
                grow_back=bool(ep["growBack"]),
            ),
            template=template,
            checkpoint_root=str(_mapping(spec, "checkpoint")["root"]),
            keep=int(spec["checkpoint"]["keep"]),
            failure=FailurePolicy(
                max_infrastructure_restarts=int(fp["maxInfrastructureRestarts"]),
                max_application_restarts=int(fp["maxApplicationRestarts"]),
                backoff_seconds=int(fp["applicationBackoffSeconds"]),
                max_backoff_seconds=int(fp["maxApplicationBackoffSeconds"]),
            ),
            node_loss_timeout=float(spec["nodeLossTimeoutSeconds"]),
            master_port=int(spec["masterPort"]),
            suspend=bool(spec["suspend"]),
            placement=placement(template),
            progress_timeout=float(spec["progressTimeoutSeconds"]) if spec.get("progressTimeoutSeconds") else None,
            bad_node_seconds=float(spec.get("badNodeSeconds", 3600)),
            share_root=spec["checkpoint"].get("shareRoot") is True,
            # unset (a job the API server did not default): the CRD's default, InPlace
            restart_strategy=(c.RestartStrategy.RECREATE if spec.get("restartStrategy") == c.RestartStrategy.RECREATE
                              else c.RestartStrategy.IN_PLACE),
            local_staging=local_staging(_mapping(spec, "checkpoint"), template),
            grace_seconds=grace_seconds(template),
        )
    except SpecProblem:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecProblem(f"spec is missing or has a malformed field ({type(exc).__name__}: {exc})") from None
    size = len(json.dumps(template, default=str))
    if size * parsed.elastic.max_replicas > MAX_RENDERED_BYTES and size * parsed.replicas > MAX_RENDERED_BYTES:
        raise SpecProblem(
            f"spec.template is {size // 1024} KiB; {parsed.replicas} workers would render "
            f"{size * parsed.replicas // 2**20} MiB of pods, more than the operator's bound of "
            f"{MAX_RENDERED_BYTES // 2**20} MiB: shrink the template (move data into ConfigMaps) or the job"
        )
    return parsed


def _mapping(parent: Mapping[str, Any], key: str, where: str = "spec") -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecProblem(f"{where}.{key} must be an object, not {type(value).__name__}")
    return value


def _list(parent: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecProblem(f"{where}.{key} must be a list, not {type(value).__name__}")
    return value


def _string_map(parent: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = _mapping(parent, key, where)
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise SpecProblem(f"{where}.{key} must map strings to strings")
    return dict(value)


def _quantity(value: Any, where: str) -> Decimal:
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        raise SpecProblem(f"{where}: {str(value)[:40]!r} is not a resource quantity") from None


def placement(template: Mapping[str, Any]) -> Placement:
    """Validate the template parts the operator reads or edits, and extract what scheduling needs."""
    where = "spec.template"
    meta = _mapping(template, "metadata", where)
    _string_map(meta, "labels", f"{where}.metadata")
    _string_map(meta, "annotations", f"{where}.metadata")
    pod = _mapping(template, "spec", where)
    where = "spec.template.spec"
    containers = _list(pod, "containers", where)
    if not containers:
        raise SpecProblem(f"{where}.containers must list at least one container")
    requests: dict[str, Decimal] = {}
    for i, container in enumerate(containers):
        at = f"{where}.containers[{i}]"
        if not isinstance(container, Mapping):
            raise SpecProblem(f"{at} must be an object")
        for j, var in enumerate(_list(container, "env", at)):
            if not isinstance(var, Mapping) or not isinstance(var.get("name"), str):
                raise SpecProblem(f"{at}.env[{j}] must be an object with a name")
            if var["name"] in environment.ALL_NAMES:
                raise SpecProblem(f"{at}.env[{j}]: {var['name']} is set by the operator (the worker contract); "
                                  "remove it from the template")
        for j, source in enumerate(_list(container, "envFrom", at)):
            if not isinstance(source, Mapping):
                raise SpecProblem(f"{at}.envFrom[{j}] must be an object")
        resources = _mapping(container, "resources", at)
        limits = _mapping(resources, "limits", f"{at}.resources")
        merged = {**limits, **_mapping(resources, "requests", f"{at}.resources")}
        for name, value in merged.items():
            requests[name] = requests.get(name, Decimal(0)) + _quantity(value, f"{at}.resources.{name}")
    selector = _string_map(pod, "nodeSelector", where)
    tolerations = []
    for i, tol in enumerate(_list(pod, "tolerations", where)):
        if not isinstance(tol, Mapping):
            raise SpecProblem(f"{where}.tolerations[{i}] must be an object")
        tolerations.append(Toleration(_str_or_none(tol.get("key")), str(tol.get("operator") or "Equal"),
                                      _str_or_none(tol.get("effect"))))
    affinity = _mapping(pod, "affinity", where)
    node_affinity = _mapping(affinity, "nodeAffinity", f"{where}.affinity")
    required = _mapping(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution",
                        f"{where}.affinity.nodeAffinity")
    for i, term in enumerate(_list(required, "nodeSelectorTerms", f"{where}.affinity.nodeAffinity.required")):
        if not isinstance(term, Mapping) or not isinstance(term.get("matchFields", []), list):
            raise SpecProblem(f"{where}.affinity.nodeAffinity...nodeSelectorTerms[{i}] must be an object")
    return Placement(requests, selector, tuple(tolerations))


MAX_STAGING_BYTES = 2**63 - 1  # what a Kubernetes quantity holds in bytes
# A positive quantity of bytes: the CRD's CEL rule for sizeLimit, the same expression (no sign, no milli)
SIZE_BYTES = re.compile(r"\+?([0-9]*[1-9][0-9]*\.?[0-9]*|[0-9]*\.[0-9]*[1-9][0-9]*)([KMGTPE]i|[kMGTPE]|[eE]\+?[0-9]+)?")


def local_staging(checkpoint: Mapping[str, Any], template: Mapping[str, Any]) -> LocalStaging | None:
    """spec.checkpoint.localStaging (None when absent: no local tier). The template may not already hold what
    the operator adds for it (its volume, a mount at its path): the pod would be refused on every launch."""
    where = "spec.checkpoint.localStaging"
    raw = checkpoint.get("localStaging")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecProblem(f"{where} must be an object, not {type(raw).__name__}")
    medium = raw.get("medium")
    if medium is None:
        medium = StagingMedium.DISK
    if medium not in (StagingMedium.DISK, StagingMedium.MEMORY):
        raise SpecProblem(f"{where}.medium must be {StagingMedium.DISK} or {StagingMedium.MEMORY}, "
                          f"not {str(medium)[:40]!r}")
    size = raw.get("sizeLimit")
    if size is not None and not _positive_bytes(size):
        raise SpecProblem(f"{where}.sizeLimit must be a positive size in bytes such as 200Gi, not {str(size)[:40]!r}")
    pod = _mapping(template, "spec", "spec.template")
    for i, volume in enumerate(_list(pod, "volumes", "spec.template.spec")):
        if isinstance(volume, Mapping) and volume.get("name") == LOCAL_STAGING_VOLUME:
            raise SpecProblem(f"spec.template.spec.volumes[{i}]: the volume name {LOCAL_STAGING_VOLUME} is the "
                              f"operator's own ({where}); rename it")
    for i, container in enumerate(_list(pod, "containers", "spec.template.spec")):
        at = f"spec.template.spec.containers[{i}]"
        for j, mount in enumerate(_list(container, "volumeMounts", at) if isinstance(container, Mapping) else []):
            if not isinstance(mount, Mapping):
                raise SpecProblem(f"{at}.volumeMounts[{j}] must be an object")
            path = mount.get("mountPath")
            if mount.get("name") == LOCAL_STAGING_VOLUME or (
                    isinstance(path, str) and posixpath.normpath(path) == environment.LOCAL_CHECKPOINT_MOUNT):
                raise SpecProblem(f"{at}.volumeMounts[{j}]: the operator mounts {LOCAL_STAGING_VOLUME} at "
                                  f"{environment.LOCAL_CHECKPOINT_MOUNT} ({where}); remove this mount")
    return LocalStaging(str(medium), None if size is None else str(size))


def _positive_bytes(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return False
    if isinstance(value, str) and not SIZE_BYTES.fullmatch(value):
        return False  # also what parse_quantity would let through: " 5", "NaN", "10K"
    try:
        number = Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return False
    return 1 <= number <= MAX_STAGING_BYTES


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _stand_in(raw: Any) -> JobSpec:
    """A spec for a job the core will refuse: only what status summaries read is taken from the raw spec."""
    spec = raw if isinstance(raw, Mapping) else {}
    return JobSpec(
        replicas=_int(spec.get("replicas"), 0),
        nproc_per_node=_int(spec.get("nprocPerNode"), 1),
        elastic=ElasticPolicy(1, 1, 1, False),
        template={},
        checkpoint_root="",
        keep=1,
        failure=FailurePolicy(0, 0, 1, 1),
        node_loss_timeout=float(_int(spec.get("nodeLossTimeoutSeconds"), 20)),
        master_port=29500,
        suspend=bool(spec.get("suspend")),
        placement=Placement({}, {}, ()),
    )


def _text(value: Any, limit: int = 4096) -> str:
    """A string field of a pod's status, bounded (the kubelet keeps termination messages to 4 KiB)."""
    return value[-limit:] if isinstance(value, str) else ""


def _int(value: Any, default: Any = None) -> Any:
    """A label, annotation or field as an int; anyone who can edit the object can write anything there."""
    if isinstance(value, bool):
        return default
    try:
        return int(str(value)) if value is not None else default
    except ValueError:
        return default


INT32_MAX = 2**31 - 1
MAX_STEP = 10**10 - 1  # the largest step the checkpoint layout names


def _bounded(value: Any, lo: int, hi: int, default: Any = None) -> Any:
    """`_int`, and `default` unless within [lo, hi]: whatever lands in status must fit its int64 fields."""
    parsed = _int(value, default) if value is None or len(str(value)) <= 24 else default
    return parsed if parsed is default or (isinstance(parsed, int) and lo <= parsed <= hi) else default


def root_key(obj: Mapping[str, Any]) -> str | None:
    """A job's checkpoint root, normalized so that two spellings of one directory or prefix compare equal
    (`file:///a/b/`, `/a//b` and `/a/b` are one root); None when the spec names none."""
    spec = obj.get("spec")
    checkpoint = spec.get("checkpoint") if isinstance(spec, Mapping) else None
    root = checkpoint.get("root") if isinstance(checkpoint, Mapping) else None
    if not isinstance(root, str) or not root:
        return None
    if roots.is_object_store(root):
        return s3.SCHEME + "/".join(p for p in root[len(s3.SCHEME):].split("/") if p)
    root = root.removeprefix(roots.FILE_SCHEME)
    return posixpath.normpath("/" + root.lstrip("/"))


def root_holder(job: Job, obj: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> str | None:
    """`namespace/name` of the oldest live job (not finished, not being deleted) that uses the same root as
    this one and was created before it, unless both opted into sharing (spec.checkpoint.shareRoot)."""
    meta = obj.get("metadata") or {}
    mine = (str(meta.get("creationTimestamp") or ""), job.namespace, job.name)
    holders = []
    for other in others:
        ometa = other.get("metadata") or {}
        if ometa.get("uid") == job.uid or ometa.get("deletionTimestamp"):
            continue
        status = other.get("status")
        if isinstance(status, Mapping) and status.get("phase") in c.TERMINAL_PHASES:
            continue
        checkpoint = (other.get("spec") or {}).get("checkpoint") or {}
        if job.spec.share_root and isinstance(checkpoint, Mapping) and checkpoint.get("shareRoot") is True:
            continue
        theirs = (str(ometa.get("creationTimestamp") or ""), str(ometa.get("namespace") or ""),
                  str(ometa.get("name") or ""))
        if theirs < mine:
            holders.append(theirs)
    return f"{min(holders)[1]}/{min(holders)[2]}" if holders else None


def controller_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of an object's controller ownerReference to one of our jobs, or None."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") == c.KIND:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def pod_view(obj: Mapping[str, Any]) -> PodView:
    meta = obj["metadata"]
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    status = obj.get("status") or {}
    disruption = None
    ready = False
    ready_since = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            disruption = cond.get("reason") or c.REASON_DISRUPTED
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            ready = True
            ready_since = timeutil.parse(cond.get("lastTransitionTime"))
    terms: list[Termination] = []
    waiting: list[str] = []
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "terminated" in state:
            t = state["terminated"] or {}
            terms.append(Termination(_bounded(t.get("exitCode"), -INT32_MAX, INT32_MAX, 0), _text(t.get("reason")),
                                     _text(t.get("message")),
                                     timeutil.parse(t.get("finishedAt"))))
        elif "waiting" in state:
            waiting.append((state["waiting"] or {}).get("reason") or "")
    resume_path = annotations.get(c.ANNOTATION_RESUME_FROM)
    resume_step = _bounded(annotations.get(c.ANNOTATION_RESUME_STEP), 0, MAX_STEP)
    return PodView(
        name=meta["name"],
        attempt=_bounded(labels.get(c.LABEL_ATTEMPT), 0, INT32_MAX, 0),
        rank=_bounded(labels.get(c.LABEL_RANK), 0, INT32_MAX, -1),
        node_name=(obj.get("spec") or {}).get("nodeName"),
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        reason=status.get("reason") or "",
        message=status.get("message") or "",
        disruption=disruption,
        terminations=tuple(terms),
        waiting_reasons=tuple(waiting),
        ready=ready,
        owner_uid=controller_uid(meta),
        launch_replicas=_bounded(annotations.get(c.ANNOTATION_REPLICAS), 1, INT32_MAX),
        ready_since=ready_since,
        uid=_text(meta.get("uid")),
        ip=_text(status.get("podIP")) or None,
        template_hash=_text(annotations.get(c.ANNOTATION_TEMPLATE_HASH)) or None,
        launch_resume=LaunchResume(resume_path, resume_step)
        if isinstance(resume_path, str) and resume_step is not None
        else None,
    )


def node_view(node: Mapping[str, Any], lease_renewed: datetime | None) -> NodeView:
    """`lease_renewed` is when the operator saw the node's Lease change (core.probes), never renewTime."""
    meta = node["metadata"]
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready, since = "Unknown", None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = cond.get("status") or "Unknown"
            since = timeutil.parse(cond.get("lastTransitionTime"))
    allocatable = {}
    for name, value in (status.get("allocatable") or {}).items():
        try:
            allocatable[name] = Decimal(parse_quantity(value))
        except (ValueError, TypeError, ArithmeticError):
            allocatable[name] = Decimal(0)  # a node reporting garbage holds nothing
    return NodeView(
        name=meta["name"],
        ready=ready,
        ready_since=since,
        taints=tuple(Taint(t["key"], t.get("effect", ""), t.get("value") or "") for t in spec.get("taints") or []),
        unschedulable=bool(spec.get("unschedulable")),
        lease_renewed=lease_renewed,
        allocatable=allocatable,
        labels=dict(meta.get("labels") or {}),
    )


# ---- Kueue ------------------------------------------------------------------------------------------
def _label(meta: Mapping[str, Any], key: str) -> str | None:
    labels = meta.get("labels")
    value = labels.get(key) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) and value else None


def queue_name(meta: Mapping[str, Any]) -> str | None:
    """The LocalQueue a job asks for (kueue.x-k8s.io/queue-name), or None: not Kueue-managed."""
    return _label(meta, c.LABEL_QUEUE_NAME)


def priority_class(meta: Mapping[str, Any]) -> str | None:
    """The WorkloadPriorityClass a Kueue-managed job names (kueue.x-k8s.io/priority-class), if any."""
    return _label(meta, c.LABEL_PRIORITY_CLASS)


def workload_view(obj: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]]) -> WorkloadView:
    """A Workload (written by Kueue and by us) and the ResourceFlavors its admission names."""
    meta, spec, status = obj["metadata"], _dict(obj.get("spec")), _dict(obj.get("status"))
    pod_set = _named(spec.get("podSets"), c.WORKER_POD_SET) or {}
    admission = None
    raw = status.get("admission")
    if isinstance(raw, Mapping):
        assignment = _named(raw.get("podSetAssignments"), c.WORKER_POD_SET)
        if assignment is not None:
            names = {str(k): str(v) for k, v in _dict(assignment.get("flavors")).items()}
            selector: dict[str, str] = {}
            tolerations: list[Mapping[str, Any]] = []
            for flavor in sorted(set(names.values())):
                fspec = _dict(_dict(flavors.get(flavor)).get("spec"))
                selector.update({str(k): str(v) for k, v in _dict(fspec.get("nodeLabels")).items()})
                tolerations += [t for t in _list_of(fspec.get("tolerations")) if isinstance(t, Mapping)]
            admission = Admission(
                cluster_queue=str(raw.get("clusterQueue") or ""),
                count=_int(assignment.get("count"), _int(pod_set.get("count"), 0)),
                flavors=names, node_selector=selector, tolerations=tuple(tolerations))
    reclaimable = _int((_named(status.get("reclaimablePods"), c.WORKER_POD_SET) or {}).get("count"), 0)
    return WorkloadView(
        name=meta["name"],
        resource_version=str(meta.get("resourceVersion") or ""),
        count=_int(pod_set.get("count"), 0),
        min_count=_int(pod_set.get("minCount")),
        conditions=tuple(cond for cond in _list_of(status.get("conditions")) if isinstance(cond, Mapping)),
        admission=admission,
        reclaimable=reclaimable,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def workload_flavors(obj: Mapping[str, Any]) -> set[str]:
    """The ResourceFlavors a Workload's admission names (to read their node labels)."""
    names: set[str] = set()
    for assignment in _list_of(_dict(_dict(obj.get("status")).get("admission")).get("podSetAssignments")):
        names.update(str(v) for v in _dict(_dict(assignment).get("flavors")).values())
    return names


# A Workload is written by Kueue, by us, and by anyone allowed to edit it in the job's namespace:
# every level is checked before it is read.
def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list_of(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _named(items: Any, name: str) -> Mapping[str, Any] | None:
    return next((i for i in _list_of(items) if isinstance(i, Mapping) and i.get("name") == name), None)
