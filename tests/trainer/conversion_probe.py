"""Run under torch.distributed (tests/trainer/test_conversion.py): a converted nanoGPT-shaped script (DDP,
dropout, a mean loss, gradient accumulation, extra state) and the shutdown race.

    python -m tests.trainer.conversion_probe train --steps N --out FILE    # root/resume from the RTJ_ env
    python -m tests.trainer.conversion_probe shutdown-race ROOT            # rank 0 prints RTJ_PROBE lines
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import Dataset

from resilient_trainer import dist as rdist
from resilient_trainer import outcome, parallel
from resilient_trainer.checkpointer import Checkpointer, CheckpointError
from resilient_trainer.data import GlobalBatchLoader
from resilient_trainer.state import TrainState, mix_seed

SEQ, VOCAB = 8, 32


class RandomWindows(Dataset):
    """nanoGPT's random windows, made map-style: window i starts at an offset drawn from (seed, i)."""

    def __init__(self, tokens: torch.Tensor, seed: int, length: int = 10_000) -> None:
        self.tokens, self.seed, self.length = tokens, seed, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(mix_seed(self.seed, i))
        start = int(torch.randint(len(self.tokens) - SEQ - 1, (1,), generator=g))
        return self.tokens[start : start + SEQ + 1]


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 32))
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.emb(idx))
        x = x + self.mlp(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())  # a mean, as nanoGPT's


class BestLoss:
    """Extra state: anything with state_dict()/load_state_dict()."""

    def __init__(self) -> None:
        self.best, self.updates = float("inf"), 0

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.updates = float(state["best"]), int(state["updates"])


def train(args: argparse.Namespace) -> int:
    ctx = rdist.init(timeout_s=60)
    torch.manual_seed(0)
    model = parallel.replicate_model(Model(), ctx)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = TrainState(seed=5, global_batch=12)
    best = BestLoss()
    ckpt = Checkpointer(os.environ["RTJ_CHECKPOINT_ROOT"], model, optim, ctx=ctx, train_state=state,
                        extra={"best": best})
    resumed = ckpt.resume()
    if ctx.rank == 0:
        print(f"RTJ_RESUMED from={resumed} best={best.best!r} updates={best.updates}", flush=True)
    tokens = torch.Generator().manual_seed(1)
    data = RandomWindows(torch.randint(VOCAB, (4000,), generator=tokens), seed=state.seed)
    loader = GlobalBatchLoader(data, state, ctx, micro_batch=args.micro_batch)
    model.train()
    while state.step < args.steps:
        total = torch.zeros(())
        for mb in loader.micro_batches():
            rng = contextlib.nullcontext() if args.global_rng else mb.rng()
            with parallel.sync_gradients(model, mb.last), rng:
                loss = model(mb.data[:, :-1], mb.data[:, 1:])
                mb.scale_mean(loss).backward()
            total += loss.detach() * mb.size
        optim.step()
        optim.zero_grad(set_to_none=True)
        state.advance()
        dist.all_reduce(total)  # the global loss: sum of per-sample losses over all ranks / B
        global_loss = float(total / state.global_batch)
        best.best, best.updates = min(best.best, global_loss), best.updates + 1
        if state.step % 3 == 0 and state.step < args.steps:
            ckpt.save(state.step)
    ckpt.save(state.step, blocking=True)
    ckpt.close()
    if ctx.rank == 0 and args.out:
        full = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
        torch.save({"model": full, "best": best.state_dict()}, args.out)
    outcome.record_success(ctx, step=state.step, checkpoint_root=ckpt.root)
    rdist.shutdown()
    return 0


class SlowWriter(FileSystemWriter):
    """Shards take a while: the save is still in flight when the script shuts down."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        time.sleep(1.0)
        return super().write_data(plan, planner)


def shutdown_race(root: str) -> int:
    """1. the script skips close() and calls rdist.shutdown() (after record_success) with a save in flight:
    both are made to wait, and the checkpoint is a real 2-rank one. 2. the script destroys the process group
    itself with a save in flight: the save is refused, never written as one process per rank."""
    ctx = rdist.init(timeout_s=60)
    torch.manual_seed(0)
    model = parallel.shard_model(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), ctx)
    optim = torch.optim.AdamW(model.parameters())
    slow = Checkpointer(root, model, optim, ctx=ctx, writer_factory=lambda p: SlowWriter(p, sync_files=False))
    path = slow.save(1)
    pending = slow.pending()
    outcome.record_success(ctx, step=1, checkpoint_root=root)  # waits for the save first
    if ctx.rank == 0:
        print(f"RTJ_PROBE case=record_success pending_before={pending} pending_after={slow.pending()} "
              f"path={path}", flush=True)
    second = slow.save(2)
    rdist.run_shutdown_hooks()  # what rdist.shutdown() does first (it then destroys the group)
    if ctx.rank == 0:
        print(f"RTJ_PROBE case=shutdown pending_after={slow.pending()} path={second}", flush=True)

    stager = slow._stager
    assert stager is not None
    real_stage = stager._stage

    def slow_stage(*a: Any, **kw: Any) -> Any:
        time.sleep(1.0)  # the upload thread starts its save after the group was destroyed below
        return real_stage(*a, **kw)

    stager._stage = slow_stage  # type: ignore[method-assign]
    third = slow.save(3)
    dist.destroy_process_group()  # bypassing rdist.shutdown(): the save must not run without its group
    try:
        slow.wait()
        verdict = "saved"
    except CheckpointError as exc:
        verdict = "refused" if "process group of this 2-rank run is gone" in str(exc) else f"other:{exc}"
    if ctx.rank == 0:
        print(f"RTJ_PROBE case=destroyed verdict={verdict} path={third}", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--micro-batch", type=int, default=2)
    t.add_argument("--out", default=None)
    t.add_argument("--global-rng", action="store_true", help="no mb.rng(): dropout from the global RNG (control)")
    sub.add_parser("shutdown-race").add_argument("root")
    args = p.parse_args()
    return train(args) if args.mode == "train" else shutdown_race(args.root)


if __name__ == "__main__":
    sys.exit(main())
