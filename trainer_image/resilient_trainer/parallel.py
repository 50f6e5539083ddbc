"""Shard (FSDP2) or replicate (DDP) a model so gradients are *summed* across ranks, and check it.

The constant-global-batch contract (resilient_trainer.state) divides the loss by the global batch B
once, in the loss, and sums gradients over micro-steps and ranks. Plain `fully_shard` / DDP instead
divide the reduced gradient by the world size: the run trains, but its update depends on the world size,
so a resume at another size is silently off (measured 1.5e-3 relative after a few steps, against 6e-7
with sums). Hence one call that applies the settings, and a check that refuses a model without them:

    model = shard_model(model, ctx, blocks=model.layers)   # FSDP2: fully_shard each block, then the root
    model = replicate_model(model, ctx)                     # or DDP with a summing comm hook
    check_reductions(model)                                 # Checkpointer(...) calls this for you

`sync_gradients(model, mb.last)` reduces only on the last micro-step. With FSDP2 it is an optimisation
(FSDP2 reduce-scatters each micro-step's fresh gradient and accumulates the sharded results, so reducing
every micro-step is correct). With DDP (`replicate_model`) it is REQUIRED: DDP all-reduces the
*accumulated* `.grad`, so a sum over ranks on every micro-step counts the earlier micro-steps W times
(stock DDP's average hides this). `guard_reductions(model, optimizer)` (installed by `Checkpointer`)
checks before every `optimizer.step()` that each DDP gradient bucket was reduced exactly once since the
last step and that FSDP2's last backward reduced, and raises `GradientSyncError` naming the fix otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from resilient_trainer.dist import DistContext, require_context

HOW_TO_FIX = (
    "shard with resilient_trainer.parallel.shard_model(model, ctx, blocks=...) (FSDP2) or "
    "replicate_model(model, ctx) (DDP); or, on every FSDP module, call set_gradient_divide_factor(1.0) "
    "and set_force_sum_reduction_for_comms(True)"
)


class ReductionConfigError(RuntimeError):
    """The model averages gradients across ranks: its update would depend on the world size."""


class GradientSyncError(RuntimeError):
    """An optimizer step after gradients were reduced more than once, or not at all, since the last step."""


SYNC_FIX = ("wrap each micro-step's forward/backward in `with parallel.sync_gradients(model, mb.last):` "
            "(reduce on the last micro-step only)")


@dataclass
class ReductionCounter:
    """The DDP comm hook's state: how often each gradient bucket was all-reduced since the last step."""

    group: dist.ProcessGroup | None = None
    counts: dict[int, int] = field(default_factory=dict)


def shard_model(
    model: nn.Module, ctx: DistContext, blocks: Iterable[nn.Module] = (), **fully_shard_kwargs: Any
) -> nn.Module:
    """FSDP2: `fully_shard` each of `blocks` (e.g. transformer layers), then the root; gradients summed."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    require_context(ctx, "shard_model")
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
    """DDP comm hook: all-reduce with SUM and no division by the world size (and count it)."""
    if isinstance(state, ReductionCounter):
        group = state.group
        state.counts[bucket.index()] = state.counts.get(bucket.index(), 0) + 1
    else:
        group = state if isinstance(state, dist.ProcessGroup) else None
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


sum_allreduce_hook.__annotations__ = {}  # DDP inspects annotations; postponed ones are strings


def replicate_model(model: nn.Module, ctx: DistContext, **ddp_kwargs: Any) -> nn.Module:
    """DDP with gradients summed across ranks (a SUM all-reduce comm hook instead of the average).

    `model` is the module (plain or compiled), already on `ctx.device`; `ddp_kwargs` go to DDP.
    DDP broadcasts rank 0's parameters and buffers when it is built, so every rank starts from rank 0's
    weights. With `torch.compile` either order works (`torch.compile(replicate_model(model, ctx))`, or
    nanoGPT's `replicate_model(torch.compile(model), ctx)`); checkpoint keys are the plain module's.
    Wrap each micro-step in `sync_gradients(model, mb.last)`: required with DDP (see above)."""
    from torch.nn.parallel import DistributedDataParallel

    require_context(ctx, "replicate_model")
    if ctx.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [ctx.device.index])
    ddp = DistributedDataParallel(model, **ddp_kwargs)
    ddp.register_comm_hook(ReductionCounter(), sum_allreduce_hook)
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


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "_orig_mod", model)  # torch.compile's wrapper


def _has_gradients(optimizer: torch.optim.Optimizer) -> bool:
    return any(p.grad is not None and bool(p.grad.count_nonzero()) for group in optimizer.param_groups
               for p in group["params"])


def guard_reductions(model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """Before every `optimizer.step()`: each DDP bucket was all-reduced exactly once since the last step,
    and FSDP2's last backward reduced; else GradientSyncError. Returns the hook handle (`.remove()`)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    counters = [state for module in _unwrap(model).modules() if isinstance(module, DistributedDataParallel)
                for hook, state in getattr(module, "_comm_hooks", []) if isinstance(state, ReductionCounter)]
    fsdp = [module for module in _unwrap(model).modules() if isinstance(module, FSDPModule)]

    def check(*_: Any) -> None:
        for counter in counters:
            counts, counter.counts = counter.counts, {}
            twice = sorted(b for b, n in counts.items() if n > 1)
            if twice:
                raise GradientSyncError(
                    f"gradients were all-reduced {max(counts.values())} times since the last optimizer step "
                    f"(DDP buckets {twice[:8]}): DDP reduces the accumulated .grad, so with summed gradients "
                    f"every earlier micro-step counts once per rank and the update depends on the world size. "
                    f"Fix: {SYNC_FIX}")
            if not counts and _has_gradients(optimizer):  # (all zero: DCP initialising optimizer state)
                raise GradientSyncError(
                    "optimizer.step() without any gradient all-reduce since the last step (every micro-step "
                    f"ran under no_sync / sync_gradients(model, False)): each rank would step on its own "
                    f"gradients. Fix: {SYNC_FIX}")
        for module in fsdp:
            state = module._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                group = getattr(state, "_fsdp_param_group", None)
                groups = [group] if group is not None else []
            if any(not getattr(group, "reduce_grads", True) for group in groups):
                raise GradientSyncError(
                    "optimizer.step() after a backward with gradient sync off (set_requires_gradient_sync("
                    "False) is still in effect): the last micro-step's gradients were never reduced. Fix: "
                    f"{SYNC_FIX}")

    return optimizer.register_step_pre_hook(check)


@contextlib.contextmanager
def sync_gradients(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce gradients in this backward only if `enabled` (the last micro-step); FSDP2 or DDP.
    Required with DDP (replicate_model); an optimisation with FSDP2."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    model = _unwrap(model)
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield
