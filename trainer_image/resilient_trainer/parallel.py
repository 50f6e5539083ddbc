"""Shard (FSDP2) or replicate (DDP) a model so gradients are *summed* across ranks, and check it.

The constant-global-batch contract (resilient_trainer.state) divides the loss by the global batch B
once, in the loss, and sums gradients over micro-steps and ranks. Plain `fully_shard` / DDP instead
divide the reduced gradient by the world size: the run trains, but its update depends on the world size,
so a resume at another size is silently off (measured 1.5e-3 relative after a few steps, against 6e-7
with sums). Hence one call that applies the settings, and a check that refuses a model without them:

    model = shard_model(model, ctx, blocks=model.layers)   # FSDP2: fully_shard each block, then the root
    model = replicate_model(model, ctx)                     # or DDP with a summing comm hook
    check_reductions(model)                                 # Checkpointer(...) calls this for you

`sync_gradients(model, enabled)` is the one context manager for "reduce only on the last micro-step".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from resilient_trainer.dist import DistContext

HOW_TO_FIX = (
    "shard with resilient_trainer.parallel.shard_model(model, ctx, blocks=...) (FSDP2) or "
    "replicate_model(model, ctx) (DDP); or, on every FSDP module, call set_gradient_divide_factor(1.0) "
    "and set_force_sum_reduction_for_comms(True)"
)


class ReductionConfigError(RuntimeError):
    """The model averages gradients across ranks: its update would depend on the world size."""


def shard_model(
    model: nn.Module, ctx: DistContext, blocks: Iterable[nn.Module] = (), **fully_shard_kwargs: Any
) -> nn.Module:
    """FSDP2: `fully_shard` each of `blocks` (e.g. transformer layers), then the root; gradients summed."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    fully_shard_kwargs.setdefault("mesh", init_device_mesh(ctx.device.type, (ctx.world_size,)))
    for block in blocks:
        fully_shard(block, **fully_shard_kwargs)
    fully_shard(model, **fully_shard_kwargs)
    sum_fsdp_gradients(model)
    return model


def sum_fsdp_gradients(model: nn.Module) -> None:
    """Make every FSDP module of `model` sum gradients; the setters act on one module's own parameters,
    so setting them on the root only leaves the blocks averaging."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum: the loss is already divided by B
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM


def sum_allreduce_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-reduce with SUM and no division by the world size."""
    group = state if isinstance(state, dist.ProcessGroup) else None
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


sum_allreduce_hook.__annotations__ = {}  # DDP inspects annotations; postponed ones are strings


def replicate_model(model: nn.Module, ctx: DistContext, **ddp_kwargs: Any) -> nn.Module:
    """DDP with gradients summed across ranks (a SUM all-reduce comm hook instead of the average)."""
    from torch.nn.parallel import DistributedDataParallel

    if ctx.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [ctx.device.index])
    ddp = DistributedDataParallel(model, **ddp_kwargs)
    ddp.register_comm_hook(None, sum_allreduce_hook)
    return ddp


def reduction_problems(model: nn.Module) -> list[str]:
    """What makes `model` average instead of sum gradients (empty: fine, or not distributed)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    problems = []
    for name, module in model.named_modules():
        if isinstance(module, DistributedDataParallel):
            hooks = [hook for hook, _ in getattr(module, "_comm_hooks", [])]
            if sum_allreduce_hook not in hooks:
                problems.append(f"DDP module {name or '<root>'} averages gradients (no sum_allreduce_hook)")
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch < 2.9: one group per module
            group = getattr(state, "_fsdp_param_group", None)
            groups = [group] if group is not None else []
        for group in groups:
            if group.gradient_divide_factor != 1.0:
                problems.append(
                    f"FSDP module {name or '<root>'}: gradient_divide_factor={group.gradient_divide_factor} "
                    "(None divides by the world size)"
                )
            if not getattr(group, "force_sum_reduction_for_comms", True):
                problems.append(f"FSDP module {name or '<root>'}: force_sum_reduction_for_comms is off")
    return problems


def check_reductions(model: nn.Module) -> None:
    """Raise ReductionConfigError, naming the modules, unless gradients are summed everywhere."""
    problems = reduction_problems(model)
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise ReductionConfigError(
            "the model averages gradients across ranks, so its update depends on the world size and a "
            f"resume at another size would silently train differently: {shown}. Fix: {HOW_TO_FIX}."
        )


@contextlib.contextmanager
def sync_gradients(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce gradients in this backward only if `enabled` (the last micro-step); FSDP2 or DDP."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield
