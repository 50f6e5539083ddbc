"""Manifests for the worker pods and the headless Service, with the injected environment.

Names carry the attempt (`<job>-a<attempt>-<rank>`), so pods of a fenced attempt that are still
terminating never collide with the new gang, and a restarted operator can read the attempt back.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resilient_contract import completion, environment, plan, progress
from resilient_contract.environment import WorkerEnv
from resilient_contract.storage.listing import Verdict
from resilient_operator import constants as c
from resilient_operator.core.drain import pdb_name
from resilient_operator.core.inplace import job_hash
from resilient_operator.core.model import LOCAL_STAGING_VOLUME, Job, LocalStaging, StagingMedium


def pod_name(job: str, attempt: int, rank: int) -> str:
    return f"{job}-a{attempt}-{rank}"


def service_name(job: str) -> str:
    return job


def master_addr(job: Job, attempt: int) -> str:
    """Rank 0's stable DNS name through the headless Service (resolves via the pod's search path)."""
    return pod_host(job, pod_name(job.name, attempt, 0))


def pod_host(job: Job, pod: str) -> str:
    """A worker pod's DNS name through the headless Service (its hostname and subdomain are set so)."""
    return f"{pod}.{service_name(job.name)}.{job.namespace}.svc"


@dataclass(frozen=True)
class Agent:
    """What a pod's agent needs for restartStrategy InPlace (resilient_contract.plan): the operator's public key,
    the port to listen on, and how long to stay after its workers failed, waiting for a plan."""

    public_key: str
    port: int
    linger_seconds: float


def owner_reference(job: Job) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
    }


def service_manifest(job: Job) -> dict[str, Any]:
    """Headless, publishing not-ready addresses so rendezvous works before readiness."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job.name),
            "namespace": job.namespace,
            "labels": {c.LABEL_JOB: job.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {c.LABEL_JOB: job.name, c.LABEL_ROLE: c.ROLE_WORKER},
            "ports": [{"name": "rendezvous", "port": job.spec.master_port, "targetPort": job.spec.master_port}],
        },
    }


def pdb_manifest(job: Job, attempt: int, replicas: int) -> dict[str, Any]:
    """The attempt's PodDisruptionBudget: no voluntary eviction of any rank (see core/drain.py)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": pdb_name(job.name, attempt),
            "namespace": job.namespace,
            "labels": {c.LABEL_JOB: job.name, c.LABEL_ATTEMPT: str(attempt)},
            "annotations": {c.ANNOTATION_REPLICAS: str(replicas)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {c.LABEL_JOB: job.name, c.LABEL_ATTEMPT: str(attempt),
                                         c.LABEL_ROLE: c.ROLE_WORKER}},
        },
    }


def worker_env(job: Job, attempt: int, rank: int, replicas: int, resume: Verdict | None) -> WorkerEnv:
    return WorkerEnv(
        job_name=job.name,
        attempt=attempt,
        nnodes=replicas,
        node_rank=rank,
        nproc_per_node=job.spec.nproc_per_node,
        master_addr=master_addr(job, attempt),
        master_port=job.spec.master_port,
        checkpoint_root=job.spec.checkpoint_root,
        resume_from=resume.path if resume else None,
        desired_nnodes=job.spec.replicas,
        checkpoint_keep=job.spec.keep,
        job_uid=job.uid or None,
    )


def avoid_nodes(spec: dict[str, Any], nodes: Sequence[str]) -> None:
    """Keep the scheduler off nodes we know are lost but Kubernetes may still call Ready.

    The node-lifecycle controller notices a silent node only after its grace period; without this
    a relaunched worker can land on the dead node and break the new attempt at once. The rule is
    ANDed into every required node-affinity term the user wrote (terms are ORed).
    """
    if not nodes:
        return
    # the API allows one value per metadata.name requirement; requirements in a term are ANDed
    rules = [{"key": "metadata.name", "operator": "NotIn", "values": [name]} for name in sorted(nodes)]
    affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchFields", []).extend(copy.deepcopy(rules))


def add_local_staging(spec: dict[str, Any], staging: LocalStaging) -> None:
    """The node-local emptyDir a save's shards land in before their upload, mounted in every container that
    gets the environment naming it (views.py refused templates that already use its name or path)."""
    empty_dir: dict[str, Any] = {"medium": "Memory"} if staging.medium == StagingMedium.MEMORY else {}
    if staging.size_limit is not None:
        empty_dir["sizeLimit"] = staging.size_limit
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": LOCAL_STAGING_VOLUME, "emptyDir": empty_dir}]
    for container in spec["containers"]:
        container["volumeMounts"] = [*(container.get("volumeMounts") or []),
                                     {"name": LOCAL_STAGING_VOLUME, "mountPath": environment.LOCAL_CHECKPOINT_MOUNT}]


def pod_manifest(job: Job, attempt: int, rank: int, replicas: int, resume: Verdict | None,
                 lost_nodes: Sequence[str] = (), master: str | None = None,
                 agent: Agent | None = None) -> dict[str, Any]:
    """Rank `rank` of `attempt`; `master` is rank 0's pod when that is a kept pod of an earlier attempt."""
    template = copy.deepcopy(dict(job.spec.template))
    meta = template.get("metadata") or {}
    spec = template["spec"]
    name = pod_name(job.name, attempt, rank)
    labels = {
        **(meta.get("labels") or {}),
        c.LABEL_JOB: job.name,
        c.LABEL_ATTEMPT: str(attempt),
        c.LABEL_RANK: str(rank),
        c.LABEL_ROLE: c.ROLE_WORKER,
    }
    annotations = {**(meta.get("annotations") or {}), c.ANNOTATION_REPLICAS: str(replicas),
                   c.ANNOTATION_TEMPLATE_HASH: job_hash(job)}
    if resume:
        annotations[c.ANNOTATION_RESUME_FROM] = resume.path
        annotations[c.ANNOTATION_RESUME_STEP] = str(resume.step)
    env_of = worker_env(job, attempt, rank, replicas, resume)
    if master is not None:
        env_of = dataclasses.replace(env_of, master_addr=pod_host(job, master))
    injected = env_of.to_environ()
    # Set explicitly even when empty: a container's env wins over its envFrom, so no ConfigMap can supply it.
    injected.setdefault(environment.RESUME_FROM, "")
    if job.spec.progress_timeout:  # the launcher's hang watchdog (resilient_contract.progress)
        injected[progress.TIMEOUT_ENV] = f"{job.spec.progress_timeout:g}"
    if agent is not None:
        injected[plan.AGENT_PORT_ENV] = str(agent.port)
        injected[plan.PUBLIC_KEY_ENV] = agent.public_key
        injected[plan.LINGER_ENV] = f"{agent.linger_seconds:g}"
    if job.spec.local_staging is not None:
        injected[environment.LOCAL_CHECKPOINT_DIR] = environment.LOCAL_CHECKPOINT_MOUNT
        add_local_staging(spec, job.spec.local_staging)
    uid_ref = [{"name": plan.POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}] if agent else []
    for container in spec["containers"]:
        env = [e for e in container.get("env") or [] if e.get("name") not in injected
               and not (agent and e.get("name") == plan.POD_UID_ENV)]
        container["env"] = env + [{"name": k, "value": v} for k, v in injected.items()] + uid_ref
        container.setdefault("terminationMessagePath", completion.TERMINATION_LOG_DEFAULT)
    spec["restartPolicy"] = "Never"
    spec.setdefault("automountServiceAccountToken", False)  # workers need no API access unless asked
    avoid_nodes(spec, lost_nodes)
    spec["hostname"] = name
    spec["subdomain"] = service_name(job.name)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }

