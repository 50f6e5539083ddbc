"""The environment the operator injects into every worker pod: one definition, read by both sides.

Names follow torchrun/PyTorchJob where a name exists (MASTER_ADDR, MASTER_PORT and the `PET_*` variables
that torchrun reads as defaults for its flags), so a plain torchrun script sees what it expects. Our own
additions carry the `RTJ_` prefix. Nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
NNODES = "PET_NNODES"  # number of worker pods in this attempt
NODE_RANK = "PET_NODE_RANK"  # this pod's rank among the worker pods
NPROC_PER_NODE = "PET_NPROC_PER_NODE"  # processes per pod
CHECKPOINT_ROOT = "RTJ_CHECKPOINT_ROOT"
RESUME_FROM = "RTJ_RESUME_FROM"  # absent on a fresh start
ATTEMPT = "RTJ_ATTEMPT"
JOB_NAME = "RTJ_JOB_NAME"
JOB_UID = "RTJ_JOB_UID"  # the job object's uid: fencing tokens name the job incarnation (lineage.py)
DESIRED_NNODES = "RTJ_DESIRED_NNODES"  # the job's desired worker count, for logs and grow-back
CHECKPOINT_KEEP = "RTJ_CHECKPOINT_KEEP"  # spec.checkpoint.keep: complete checkpoints the trainer retains
# spec.checkpoint.localStaging: the pod's node-local directory (an emptyDir the operator mounts) where a save's
# shards land first, before they are uploaded to the root; absent: shards go straight to the root
LOCAL_CHECKPOINT_DIR = "RTJ_LOCAL_CHECKPOINT_DIR"
LOCAL_CHECKPOINT_MOUNT = "/var/run/rtj/checkpoint-local"  # where the operator mounts that emptyDir

ALL_NAMES = (
    MASTER_ADDR,
    MASTER_PORT,
    NNODES,
    NODE_RANK,
    NPROC_PER_NODE,
    CHECKPOINT_ROOT,
    RESUME_FROM,
    ATTEMPT,
    JOB_NAME,
    JOB_UID,
    DESIRED_NNODES,
    CHECKPOINT_KEEP,
    LOCAL_CHECKPOINT_DIR,
)

DEFAULT_MASTER_PORT = 29500
DEFAULT_CHECKPOINT_KEEP = 3  # the CRD's default for spec.checkpoint.keep


class ContractError(ValueError):
    """The injected environment is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class WorkerEnv:
    """What a worker pod knows about its place in the job."""

    job_name: str
    attempt: int
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    checkpoint_root: str
    resume_from: str | None = None
    desired_nnodes: int | None = None
    checkpoint_keep: int = DEFAULT_CHECKPOINT_KEEP
    job_uid: str | None = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def to_environ(self) -> dict[str, str]:
        """The variables as the operator writes them into a pod spec (no empty resume variable)."""
        env = {
            JOB_NAME: self.job_name,
            ATTEMPT: str(self.attempt),
            NNODES: str(self.nnodes),
            NODE_RANK: str(self.node_rank),
            NPROC_PER_NODE: str(self.nproc_per_node),
            MASTER_ADDR: self.master_addr,
            MASTER_PORT: str(self.master_port),
            CHECKPOINT_ROOT: self.checkpoint_root,
            CHECKPOINT_KEEP: str(self.checkpoint_keep),
        }
        if self.resume_from:
            env[RESUME_FROM] = self.resume_from
        if self.desired_nnodes is not None:
            env[DESIRED_NNODES] = str(self.desired_nnodes)
        if self.job_uid:
            env[JOB_UID] = self.job_uid
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Parse the contract; a missing or malformed variable raises ContractError naming it."""
        env = os.environ if environ is None else environ

        def req(name: str) -> str:
            value = env.get(name, "")
            if not value:
                raise ContractError(f"{name} is not set: is this process running under the operator?")
            return value

        nnodes = _integer(NNODES, req(NNODES), 1)
        node_rank = _integer(NODE_RANK, req(NODE_RANK), 0)
        if node_rank >= nnodes:
            raise ContractError(f"{NODE_RANK}={node_rank} must be < {NNODES}={nnodes}")
        desired = env.get(DESIRED_NNODES)
        return cls(
            job_name=req(JOB_NAME),
            attempt=_integer(ATTEMPT, req(ATTEMPT), 1),
            nnodes=nnodes,
            node_rank=node_rank,
            nproc_per_node=_integer(NPROC_PER_NODE, env.get(NPROC_PER_NODE, "1"), 1),
            master_addr=req(MASTER_ADDR),
            master_port=_integer(MASTER_PORT, env.get(MASTER_PORT, str(DEFAULT_MASTER_PORT)), 1),
            checkpoint_root=req(CHECKPOINT_ROOT),
            resume_from=resume_from(env),
            desired_nnodes=_integer(DESIRED_NNODES, desired, 1) if desired else None,
            checkpoint_keep=checkpoint_keep(env),
            job_uid=env.get(JOB_UID) or None,
        )


def _integer(name: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ContractError(f"{name}={value!r} is not an integer") from None
    if number < minimum:
        raise ContractError(f"{name}={number} must be >= {minimum}")
    return number


def checkpoint_keep(environ: Mapping[str, str] | None = None) -> int:
    """How many complete checkpoints to retain: the job's spec.checkpoint.keep as injected, else the
    CRD's default (a script run outside the operator)."""
    env = os.environ if environ is None else environ
    return _integer(CHECKPOINT_KEEP, env.get(CHECKPOINT_KEEP) or str(DEFAULT_CHECKPOINT_KEEP), 1)


def local_checkpoint_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The node-local directory a save's shards land in first (spec.checkpoint.localStaging), or None."""
    env = os.environ if environ is None else environ
    return env.get(LOCAL_CHECKPOINT_DIR) or None


def resume_from(environ: Mapping[str, str] | None = None) -> str | None:
    """The checkpoint the operator chose for this attempt, or None on a fresh start."""
    env = os.environ if environ is None else environ
    return env.get(RESUME_FROM) or None


def attempt_and_job(environ: Mapping[str, str] | None = None) -> tuple[int, str | None] | None:
    """(attempt, job uid) under the operator, for fencing tokens; None outside it (no RTJ_ATTEMPT)."""
    env = os.environ if environ is None else environ
    raw = env.get(ATTEMPT)
    if not raw:
        return None
    return _integer(ATTEMPT, raw, 1), env.get(JOB_UID) or None
