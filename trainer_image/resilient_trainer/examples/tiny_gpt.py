"""Example: a tiny decoder-only transformer trained with FSDP2 and a constant global batch.

Run (any world size; the update does not depend on it):
    python -m resilient_trainer.launch --nproc-per-node 2 --checkpoint-root /tmp/ck \
        -- -m resilient_trainer.examples.tiny_gpt --steps 40
    torchrun --nproc-per-node 4 -m resilient_trainer.examples.tiny_gpt --steps 40 --checkpoint-root /tmp/ck

Data is synthetic and chosen by GLOBAL sample index (see resilient_trainer.state), so a run resumed at
another world size replays exactly the same samples. CPU uses gloo; CUDA uses NCCL, unchanged.

Output (rank 0, stdout, one line each, `KEY k=v k=v ...`; values never contain spaces):
    RTJ_START world_size=4 global_batch=16 micro_batch=2 accumulation=2 steps=40 attempt=1 parallel=fsdp
    RTJ_RESUMED from=<checkpoint dir | none> step=<step resumed at>
    RTJ_STEP step=<n> loss=<float repr> tokens_per_s=<float> world_size=<W>
    RTJ_CHECKPOINT step=<n> path=<dir> blocked_s=<float>
    RTJ_PREEMPTED step=<n> checkpoint=<dir> world_size=<W>     (then exit 143)
    RTJ_RESULT step=<n> digest=sha256:<hex of all full parameters> loss=<float repr> world_size=<W>
`loss` is sum(per-sample mean token cross-entropy) / global_batch for that step, printed with repr()
so it round-trips exactly. The digest covers every parameter (sorted FQNs, dtype, shape, raw bytes).
On success local rank 0 of each node also writes `RTJ_SUCCEEDED ...` to the termination-message file
(resilient_contract.completion).

Test hooks: --fail-at-step/--fail-rank/--fail-exit-code (application failure), --step-delay,
--crash-in-save-step/--crash-in-save-rank (SIGKILL a rank inside its shard write), --hang-at-step/--hang-rank/
--hang-attempt (a rank stops for good after a step, before reporting it: the launcher's hang watchdog), --dump-state
(torch.save of the gathered full model/optimizer/scheduler/train state, for bitwise comparisons).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.nn import functional as fn

from resilient_contract import environment, progress
from resilient_trainer import dist as rdist
from resilient_trainer import outcome, parallel
from resilient_trainer.checkpointer import Checkpointer
from resilient_trainer.preemption import PreemptionHandler
from resilient_trainer.state import TrainState, accumulation_steps, micro_batches, mix_seed

PREEMPTED_EXIT_CODE = 143


# ---- model ----------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = fn.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(fn.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


# ---- data -----------------------------------------------------------------------------------------
def sample(seed: int, index: int, vocab: int, seq_len: int) -> torch.Tensor:
    """Global sample `index`: an affine recurrence mod vocab (learnable), a pure function of (seed, index)."""
    g = torch.Generator().manual_seed(mix_seed(seed, index))
    x0, a, c = (int(v) for v in torch.randint(0, vocab, (3,), generator=g))
    out = [x0]
    for _ in range(seq_len):
        out.append((a * out[-1] + c) % vocab)
    return torch.tensor(out, dtype=torch.long)


def batch(seed: int, indices: range, vocab: int, seq_len: int) -> torch.Tensor:
    return torch.stack([sample(seed, i, vocab, seq_len) for i in indices])


# ---- helpers --------------------------------------------------------------------------------------
def emit(rank: int, kind: str, **fields: Any) -> None:
    if rank == 0:
        print(kind + "".join(f" {k}={v}" for k, v in fields.items()), flush=True)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Gathered full model and optimizer state on rank 0 (empty elsewhere); a collective."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, optimizer, options=opts)


def digest(model_sd: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(model_sd):
        t = model_sd[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


class _CrashingWriter(FileSystemWriter):
    """Test hook: this rank writes part of its shard, then SIGKILLs itself (a node dying mid-save)."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        with open(os.path.join(str(self.path), "__partial_crash.distcp"), "wb") as f:
            f.write(b"\0" * 1024)
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="total optimizer steps (not steps of this attempt)")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--checkpoint-every", type=int, default=10, help="0: only the final checkpoint")
    p.add_argument("--keep-last", type=int, default=None,
                   help=f"complete checkpoints to keep (default ${environment.CHECKPOINT_KEEP}: spec.checkpoint.keep)")
    p.add_argument("--checkpoint-root", default=os.environ.get(environment.CHECKPOINT_ROOT))
    p.add_argument("--resume-from", default=os.environ.get(environment.RESUME_FROM) or None)
    p.add_argument("--blocking-save", action="store_true", help="dcp.save instead of async_save")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--collective-timeout", type=float, default=rdist.DEFAULT_TIMEOUT_S)
    p.add_argument("--fail-at-step", type=int, default=-1, help="exit before running this step")
    p.add_argument("--hang-at-step", type=int, default=-1,
                   help="test only: --hang-rank stops for good after this step's collective, before reporting it")
    p.add_argument("--hang-rank", type=int, default=0)
    p.add_argument("--hang-attempt", type=int, default=1, help="test only: hang only in this attempt")
    p.add_argument("--fail-rank", type=int, default=0)
    p.add_argument("--fail-exit-code", type=int, default=3)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (tests)")
    p.add_argument("--crash-in-save-step", type=int, default=-1)
    p.add_argument("--crash-in-save-rank", type=int, default=1)
    p.add_argument("--dump-state", default=None, help="torch.save full state here at the end (rank 0)")
    return p.parse_args(argv)


def _lr_lambda(warmup: int, total: int) -> Any:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return f


def build(args: argparse.Namespace, ctx: rdist.DistContext) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(args.seed)  # same initial weights on every rank, before sharding
    model: nn.Module = TinyGPT(args.vocab, args.d_model, args.layers, args.heads, args.seq_len).to(ctx.device)
    # Gradients are summed across ranks (the loss is already divided by B): see resilient_trainer.parallel.
    if args.parallel == "fsdp":
        model = parallel.shard_model(model, ctx, blocks=model.blocks)  # type: ignore[arg-type]
    else:
        model = parallel.replicate_model(model, ctx)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(args.warmup, args.steps))
    return model, optimizer, scheduler


def train_step(
    args: argparse.Namespace, ctx: rdist.DistContext, model: nn.Module, step: int
) -> torch.Tensor:
    """Forward/backward for this rank's share of global step `step`; returns its summed sample loss."""
    slices = micro_batches(step, args.global_batch, ctx.world_size, ctx.rank, args.micro_batch)
    loss_sum = torch.zeros((), device=ctx.device)
    for m, indices in enumerate(slices):
        last = m == len(slices) - 1
        empty = len(indices) == 0
        data = batch(args.seed, indices if not empty else range(0, 1), args.vocab, args.seq_len).to(ctx.device)
        with parallel.sync_gradients(model, last):
            logits = model(data[:, :-1])
            per_token = fn.cross_entropy(
                logits.reshape(-1, args.vocab).float(), data[:, 1:].reshape(-1), reduction="none"
            )
            per_sample = per_token.view(data.shape[0], -1).mean(dim=1).sum()
            weight = 0.0 if empty else 1.0
            (per_sample * weight / args.global_batch).backward()
        loss_sum += per_sample.detach() * weight
    return loss_sum


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.checkpoint_root:
        print(f"error: --checkpoint-root or ${environment.CHECKPOINT_ROOT} is required", file=sys.stderr)
        return 2
    preempt = PreemptionHandler.install()
    ctx = rdist.init(timeout_s=args.collective_timeout)
    model, optimizer, scheduler = build(args, ctx)
    train_state = TrainState(step=0, samples_seen=0, seed=args.seed, global_batch=args.global_batch)

    writer_factory = None
    if args.crash_in_save_step >= 0 and ctx.rank == args.crash_in_save_rank:
        crash_dir = f"step-{args.crash_in_save_step:010d}"

        def writer_factory(path: str) -> FileSystemWriter:
            cls = _CrashingWriter if os.path.basename(path) == crash_dir else FileSystemWriter
            return cls(path, sync_files=True, overwrite=False)

    ckpt = Checkpointer(
        args.checkpoint_root,
        model,
        optimizer,
        ctx=ctx,
        scheduler=scheduler,
        train_state=train_state,
        keep_last=args.keep_last,
        async_save=not args.blocking_save,
        writer_factory=writer_factory,
    )
    accum = accumulation_steps(args.global_batch, ctx.world_size, args.micro_batch)
    emit(
        ctx.rank,
        "RTJ_START",
        world_size=ctx.world_size,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        accumulation=accum,
        steps=args.steps,
        attempt=os.environ.get(environment.ATTEMPT, "0"),
        parallel=args.parallel,
    )
    resumed = ckpt.resume(args.resume_from)  # refuses a checkpoint recorded with another global batch
    emit(ctx.rank, "RTJ_RESUMED", **{"from": resumed or "none"}, step=train_state.step)

    loss_value = float("nan")
    model.train()
    while train_state.step < args.steps:
        step = train_state.step
        if step == args.fail_at_step and ctx.rank == args.fail_rank:
            print(f"RTJ_FAILING step={step} rank={ctx.rank} exit_code={args.fail_exit_code}", flush=True)
            os._exit(args.fail_exit_code)
        t0 = time.perf_counter()
        loss_sum = train_step(args, ctx, model, step)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        # One all-reduce carries the step's loss and the preemption flag of every rank.
        stats = torch.stack([loss_sum, torch.tensor(1.0 if preempt.requested else 0.0, device=ctx.device)])
        dist.all_reduce(stats)
        loss_value = float((stats[0] / args.global_batch).item())
        train_state.step = step + 1
        train_state.samples_seen = train_state.step * args.global_batch
        if args.step_delay:
            time.sleep(args.step_delay)
        dt = time.perf_counter() - t0
        if (train_state.step == args.hang_at_step and ctx.rank == args.hang_rank
                and os.environ.get(environment.ATTEMPT, "0") == str(args.hang_attempt)):
            print(f"RTJ_HANGING step={train_state.step} rank={ctx.rank}", flush=True)
            while True:  # stuck for good, like a rank in a dead collective; only SIGKILL ends it
                time.sleep(3600)
        progress.report_step(train_state.step, dt, time.time())
        emit(
            ctx.rank,
            "RTJ_STEP",
            step=train_state.step,
            loss=repr(loss_value),
            tokens_per_s=f"{args.global_batch * args.seq_len / dt:.1f}",
            world_size=ctx.world_size,
        )
        if stats[1].item() > 0:
            path = ckpt.save(train_state.step, blocking=True) or os.path.join(
                ckpt.root, f"step-{train_state.step:010d}"
            )
            emit(ctx.rank, "RTJ_PREEMPTED", step=train_state.step, checkpoint=path, world_size=ctx.world_size)
            outcome.record_preempted(ctx, step=train_state.step, checkpoint=path)
            ckpt.close()
            rdist.shutdown()
            return PREEMPTED_EXIT_CODE
        if args.checkpoint_every and train_state.step % args.checkpoint_every == 0 and (
            train_state.step < args.steps
        ):
            saved = ckpt.save(train_state.step)
            emit(ctx.rank, "RTJ_CHECKPOINT", step=train_state.step, path=saved,
                 blocked_s=f"{ckpt.last_blocked_s:.4f}")

    final = ckpt.save(train_state.step, blocking=True)
    if final:
        emit(ctx.rank, "RTJ_CHECKPOINT", step=train_state.step, path=final, blocked_s=f"{ckpt.last_blocked_s:.4f}")
    ckpt.close()
    model_sd, optim_sd = full_state(model, optimizer)
    if ctx.rank == 0 and args.dump_state:
        torch.save(
            {
                "model": model_sd,
                "optim": optim_sd,
                "scheduler": scheduler.state_dict(),
                "train": train_state.state_dict(),
            },
            args.dump_state,
        )
    emit(
        ctx.rank,
        "RTJ_RESULT",
        step=train_state.step,
        digest=digest(model_sd) if ctx.rank == 0 else "",
        loss=repr(loss_value),
        world_size=ctx.world_size,
    )
    dist.barrier()  # everybody finished before anyone records success
    outcome.record_success(ctx, step=train_state.step, checkpoint_root=args.checkpoint_root)
    rdist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
