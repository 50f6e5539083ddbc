"""Run under torch.distributed (tests/trainer/test_guards.py): which models and resumes Checkpointer
refuses. Prints one `RTJ_PROBE case=verdict ...` line on rank 0."""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from resilient_trainer import dist as rdist
from resilient_trainer import parallel
from resilient_trainer.checkpointer import Checkpointer, CheckpointError
from resilient_trainer.state import TrainState


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(8, 8) for _ in range(3)))


def plain_fsdp(ctx: rdist.DistContext) -> nn.Module:
    m = model()
    for layer in m:
        fully_shard(layer)
    fully_shard(m)
    return m


def root_only(ctx: rdist.DistContext) -> nn.Module:
    m = plain_fsdp(ctx)
    m.set_gradient_divide_factor(1.0)  # type: ignore[operator]  # the classic mistake: blocks still average
    m.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    return m


CASES = {
    "plain_fsdp": plain_fsdp,
    "root_only": root_only,
    "shard_model": lambda ctx: parallel.shard_model(model(), ctx, blocks=[]),
    "plain_ddp": lambda ctx: DistributedDataParallel(model()),
    "replicate_model": lambda ctx: parallel.replicate_model(model(), ctx),
}


def main() -> int:
    root = sys.argv[1]
    ctx = rdist.init(timeout_s=60)
    verdicts = {}
    for name, build in CASES.items():
        m = build(ctx)
        try:
            Checkpointer(root, m, torch.optim.AdamW(m.parameters()), ctx=ctx).close()
            verdicts[name] = "accepted"
        except parallel.ReductionConfigError as exc:
            verdicts[name] = "refused"
            if name == "root_only" and ctx.rank == 0:
                print(f"RTJ_MESSAGE {exc}", flush=True)

    m = parallel.shard_model(model(), ctx)
    opt = torch.optim.AdamW(m.parameters())
    saver = Checkpointer(root, m, opt, ctx=ctx, train_state=TrainState(step=1, samples_seen=8, global_batch=8))
    path = saver.save(1, blocking=True)
    saver.close()
    for allow in (False, True):
        state = TrainState(global_batch=12)
        loader = Checkpointer(root, m, opt, ctx=ctx, train_state=state, allow_global_batch_change=allow)
        try:
            loader.resume(path)
            verdicts[f"batch_change_allow_{allow}"] = f"resumed:{state.global_batch}:{state.samples_seen}"
        except CheckpointError as exc:
            verdicts[f"batch_change_allow_{allow}"] = "refused" if "global batch 8" in str(exc) else "other"
        loader.close()
    if ctx.rank == 0:
        print("RTJ_PROBE " + " ".join(f"{k}={v}" for k, v in verdicts.items()), flush=True)
    rdist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
