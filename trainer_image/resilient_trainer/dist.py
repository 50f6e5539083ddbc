"""Process-group setup with bounded timeouts, and a separate gloo group for checkpoint collectives.

Why bounded: when a peer dies, a collective otherwise waits for the default timeout (10-30 min) before
anyone notices; the operator restarts the job faster if survivors fail fast and exit. Why a separate
group: async_save runs its plan/metadata collectives from a background thread; sharing the training
group would interleave them with training collectives on the same communicator (undefined ordering,
deadlock on NCCL). Gloo is also what DCP needs for its CPU-side object collectives.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    checkpoint_group: dist.ProcessGroup


def pick_device(local_rank: int) -> torch.device:
    """CUDA when the build can actually see a GPU (a CUDA build on a CPU machine falls back to CPU)."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init(timeout_s: float = DEFAULT_TIMEOUT_S, device: torch.device | None = None) -> DistContext:
    """Initialise from torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = device or pick_device(local_rank)
    timeout = timedelta(seconds=timeout_s)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        backend = "cpu:gloo,cuda:nccl"  # DCP's object collectives need a CPU backend as well
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timeout)
    ckpt_group = dist.new_group(backend="gloo", timeout=timeout)
    assert isinstance(ckpt_group, dist.ProcessGroup)  # every rank is a member
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, dev, ckpt_group)


def shutdown() -> None:
    """Tear the groups down explicitly; letting interpreter exit do it is what aborts gloo with exit 1."""
    if dist.is_initialized():
        # a dead peer must not turn a finished run into a failure here
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
