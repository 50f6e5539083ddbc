"""Checkpoint benchmark: what a save costs the training loop, and how fast a resharded load is.

    python bench/checkpoint_bench.py --size-mb 1000 --world-sizes 2,4 --reps 3
    python bench/checkpoint_bench.py --device cuda --size-mb 8000 --world-sizes 1   # GPU, pinned staging
    python bench/checkpoint_bench.py --parallel ddp --size-mb 126 --world-sizes 1,2   # a DDP user's baseline

State: an FSDP2-sharded stack of Linear layers plus AdamW state (params + exp_avg + exp_avg_sq ~= size).
Per world size W, in one process group, repetitions are interleaved (async, blocking, gather per rep):
- loop:     THE figure: wall time a save adds to the training loop. Fixed synthetic compute steps run
            from the save() call until the upload finished; loop = that wall time - steps * (median
            step time without a save). It includes what "blocked" misses: steps slowed down because
            staging/upload threads take CPU (or memory bandwidth) from training.
- async:    Checkpointer.save() with dcp.async_save: blocked = the save() call (directory, state dict,
            start of background staging) + the time optimizer steps wait for staging to finish (the
            pre-hook). Fixed synthetic compute steps run while staging/upload are in flight: their median
            vs steps without a save = slowdown. GB/s staged = all ranks' state / staging duration.
- blocking: Checkpointer.save(blocking=True) (dcp.save).
- gather:   get_state_dict(full_state_dict, cpu_offload) to rank 0 + torch.save; the others wait at a
            barrier, as they would at their next collective.
- rank0:    (--parallel ddp only) what a DDP script such as nanoGPT's does: rank 0 torch.saves its own
            replica's model and optimizer state_dict (no gather: every rank holds all of it); the others
            wait at a barrier. With --parallel ddp the state is replicated: --size-mb is per rank.
Blocked time is the max over ranks, then the median over repetitions.
Reshard load N->M (M = the other world size, or N/2 when one is given): Checkpointer.load of the DCP
checkpoint written at N, vs rank-0 torch.load of the gathered file + per-tensor broadcast + local shard.
Files are usually in the page cache for both (just written), so this compares CPU/communication cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from resilient_trainer import dist as rdist
from resilient_trainer import parallel
from resilient_trainer.checkpointer import Checkpointer
from resilient_trainer.state import TrainState


def build(size_mb: float, ctx: rdist.DistContext, mode: str = "fsdp") -> tuple[nn.Module, torch.optim.Optimizer]:
    # params + 2 AdamW moments, fp32: 12 bytes per parameter.
    n_params = int(size_mb * 1e6 / 12)
    d = 1024
    layers = max(1, round(n_params / (d * d)))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(d, d, bias=False) for _ in range(layers))).to(ctx.device)
    if mode == "ddp":
        model = parallel.replicate_model(model, ctx)
    else:
        model = parallel.shard_model(model, ctx, blocks=list(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():  # materialise optimizer state without a (slow) forward pass
        p.grad = torch.ones_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def local_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    total = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                t = v.to_local() if hasattr(v, "to_local") else v
                total += t.numel() * t.element_size()
    return total


def compute_step(x: torch.Tensor) -> float:
    """A fixed synthetic training step (the real loop's compute), timed."""
    t0 = time.perf_counter()
    for _ in range(8):
        x = torch.tanh(x @ x) * 0.5
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def max_over_ranks(value: float, ctx: rdist.DistContext) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.checkpoint_group)
    return float(t.item())


def save_phase(args: argparse.Namespace, ctx: rdist.DistContext, workdir: Path) -> dict[str, Any]:
    model, opt = build(args.size_mb, ctx, args.parallel)
    ckpt = Checkpointer(
        str(workdir / f"dcp-w{ctx.world_size}"), model, opt, ctx=ctx, train_state=TrainState(), keep_last=1,
        upload_niceness=args.upload_niceness,
    )
    x = torch.randn(args.compute_dim, args.compute_dim, device=ctx.device) * 0.01
    for _ in range(2):
        compute_step(x)
    res: dict[str, list[float]] = {
        k: []
        for k in ("loop", "async", "call", "staging", "blocking", "gather", "rank0", "upload", "idle_step",
                  "busy_step")
    }
    step = 0
    full_file = workdir / f"full-w{ctx.world_size}.pt"
    for rep in range(args.reps + 1):  # rep 0 warms up (allocates the stager's buffers)
        step += 1
        dist.barrier(group=ctx.checkpoint_group)
        idle = statistics.median(compute_step(x) for _ in range(5))
        t0 = time.perf_counter()
        ckpt.save(step)
        blocked = call = time.perf_counter() - t0
        staged_at = [time.perf_counter()]
        if ckpt._staging is not None:  # background staging: note when the copy finished
            ckpt._staging[1].add_done_callback(lambda _f, marks=staged_at: marks.append(time.perf_counter()))
        busy = []
        while True:
            inflight = ckpt._inflight
            if inflight is None or inflight[1].done():
                break
            busy.append(compute_step(x))
            ckpt.wait_staged()  # what the optimizer step pre-hook does before parameters change
        ckpt.wait()
        loop = time.perf_counter() - t0 - len(busy) * idle
        blocked += ckpt.staging_wait_s
        staging = staged_at[-1] - t0
        upload = time.perf_counter() - t0
        if rep:
            res["loop"].append(max_over_ranks(loop, ctx))
            res["async"].append(max_over_ranks(blocked, ctx))
            res["staging"].append(max_over_ranks(staging, ctx))
            res["call"].append(max_over_ranks(call, ctx))
            res["upload"].append(max_over_ranks(upload, ctx))
            res["idle_step"].append(idle)
            if busy:
                res["busy_step"].append(statistics.median(busy))

        step += 1
        dist.barrier(group=ctx.checkpoint_group)
        t0 = time.perf_counter()
        ckpt.save(step, blocking=True)
        if rep:
            res["blocking"].append(max_over_ranks(time.perf_counter() - t0, ctx))

        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        dist.barrier(group=ctx.checkpoint_group)
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if ctx.rank == 0:
            torch.save({"model": msd, "optim": osd}, full_file)
        del msd, osd
        dist.barrier(group=ctx.checkpoint_group)
        if rep:
            res["gather"].append(max_over_ranks(time.perf_counter() - t0, ctx))

        if args.parallel == "ddp":  # nanoGPT's checkpoint: rank 0 saves its replica, nobody gathers
            dist.barrier(group=ctx.checkpoint_group)
            t0 = time.perf_counter()
            if ctx.rank == 0:
                inner = model.module  # type: ignore[union-attr]
                torch.save({"model": inner.state_dict(), "optimizer": opt.state_dict()}, full_file)
            dist.barrier(group=ctx.checkpoint_group)
            if rep:
                res["rank0"].append(max_over_ranks(time.perf_counter() - t0, ctx))
    ckpt.close()
    return {
        "world_size": ctx.world_size,
        "local_bytes": local_bytes(model, opt),
        "checkpoint": ckpt.last_saved,
        "full_file": str(full_file),
        **{k: statistics.median(v) if v else float("nan") for k, v in res.items()},
    }


@torch.no_grad()
def load_phase(args: argparse.Namespace, ctx: rdist.DistContext, ckpt_dir: str, full_file: str) -> dict[str, Any]:
    from torch.distributed.tensor import distribute_tensor

    model, opt = build(args.size_mb, ctx, args.parallel)
    scratch = Path(ckpt_dir).parent.parent / f"scratch-w{ctx.world_size}"
    ckpt = Checkpointer(str(scratch), model, opt, ctx=ctx, train_state=TrainState(), async_save=False)
    dcp_times, bcast_times = [], []
    for _ in range(args.reps):
        dist.barrier(group=ctx.checkpoint_group)
        t0 = time.perf_counter()
        ckpt.load(ckpt_dir)
        dist.barrier(group=ctx.checkpoint_group)
        dcp_times.append(max_over_ranks(time.perf_counter() - t0, ctx))

        dist.barrier(group=ctx.checkpoint_group)
        t0 = time.perf_counter()
        full = torch.load(full_file, weights_only=False, mmap=False) if ctx.rank == 0 else None
        names = dict(model.named_parameters())
        for fqn in sorted(names):
            param = names[fqn]
            targets: list[tuple[torch.Tensor, torch.Tensor | None]] = [(param, full["model"][fqn] if full else None)]
            for key, value in sorted(opt.state[param].items()):
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    targets.append((value, full["optim"]["state"][fqn][key] if full else None))
            for dst, src in targets:
                buf = src.to(ctx.device) if src is not None else torch.empty(dst.shape, device=ctx.device)
                dist.broadcast(buf, src=0)
                shard = distribute_tensor(buf, dst.device_mesh, dst.placements, src_data_rank=None)
                dst.to_local().copy_(shard.to_local())
        del full
        dist.barrier(group=ctx.checkpoint_group)
        bcast_times.append(max_over_ranks(time.perf_counter() - t0, ctx))
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "world_size": ctx.world_size,
        "dcp_load": statistics.median(dcp_times),
        "rank0_load_broadcast": statistics.median(bcast_times),
    }


def worker(rank: int, world_size: int, port: int, args: argparse.Namespace, job: dict[str, Any]) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(args.threads)
    ctx = rdist.init(timeout_s=600, device=torch.device("cpu") if args.device == "cpu" else None)
    try:
        if job["kind"] == "save":
            out = save_phase(args, ctx, Path(job["workdir"]))
        else:
            out = load_phase(args, ctx, job["checkpoint"], job["full_file"])
        if rank == 0:
            Path(job["result"]).write_text(json.dumps(out))
    finally:
        rdist.shutdown()


def spawn(world_size: int, args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    mp.start_processes(worker, args=(world_size, port, args, job), nprocs=world_size, start_method="spawn")
    return json.loads(Path(job["result"]).read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=1000.0, help="model + optimizer state, all ranks together")
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--compute-dim", type=int, default=384, help="size of the synthetic compute step")
    p.add_argument("--upload-niceness", type=int, default=None,
                   help="Checkpointer(upload_niceness=...): 0 = upload threads at training priority "
                        "(the old behaviour); default: the Checkpointer's default")
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp",
                   help="ddp: a replicated model, and the rank-0 torch.save baseline (no gather)")
    p.add_argument("--skip-load", action="store_true", help="only the save figures")
    p.add_argument("--workdir", default=None, help="where checkpoints go (default: a temp dir, removed)")
    args = p.parse_args()
    if args.upload_niceness is None:
        from resilient_trainer.checkpointer import DEFAULT_UPLOAD_NICENESS

        args.upload_niceness = DEFAULT_UPLOAD_NICENESS
    sizes = [int(w) for w in args.world_sizes.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rtj-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows, loads = [], []
    try:
        for w in sizes:
            rows.append(
                spawn(w, args, {"kind": "save", "workdir": str(workdir), "result": str(workdir / f"s{w}.json")})
            )
        for row in [] if args.skip_load or args.parallel == "ddp" else rows:
            n = row["world_size"]
            others = [m for m in sizes if m != n] or [max(1, n // 2)]
            for m in others:
                res = spawn(
                    m,
                    args,
                    {
                        "kind": "load",
                        "checkpoint": row["checkpoint"],
                        "full_file": row["full_file"],
                        "result": str(workdir / f"l{n}-{m}.json"),
                    },
                )
                loads.append((n, m, res))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"\nstate {args.size_mb:.0f} MB (params + AdamW moments, fp32), {args.parallel}, device {args.device}, "
        f"{args.reps} interleaved reps, medians, max over ranks, upload niceness {args.upload_niceness}"
    )
    print(
        "loop = wall time one save adds to the training loop (blocked + slower steps while staging/upload "
        "run); gather = gather + torch.save, all of which the loop pays"
    )
    print(f"{'W':>3} {'loop s/save':>11} {'gather+save s':>13} {'gather/loop':>11} {'rank0 save s':>12} "
          f"{'rank0/loop':>10}")
    for r in rows:
        rank0 = r["rank0"]
        print(f"{r['world_size']:>3} {r['loop']:>11.3f} {r['gather']:>13.3f} {r['gather'] / r['loop']:>11.1f} "
              f"{rank0:>12.3f} {rank0 / r['loop']:>10.2f}")
    print(
        "\nblocked time (second: it misses slower steps): async = save() call + waits for staging at the next "
        "optimizer steps; call = save() alone"
    )
    print(
        f"{'W':>3} {'async s':>8} {'call s':>7} {'blocking s':>10} {'gather+save s':>13} {'gather/async':>12} "
        f"{'gather/call':>11} {'blocking/async':>14} {'upload s':>8} {'step ms idle':>12} {'during upload':>13} "
        f"{'GB/s staged':>11}"
    )
    for r in rows:
        staged = r["local_bytes"] * r["world_size"] / r["staging"] / 1e9
        print(
            f"{r['world_size']:>3} {r['async']:>8.4f} {r['call']:>7.4f} {r['blocking']:>10.3f} {r['gather']:>13.3f} "
            f"{r['gather'] / r['async']:>12.1f} {r['gather'] / r['call']:>11.1f} {r['blocking'] / r['async']:>14.1f} "
            f"{r['upload']:>8.2f} {r['idle_step'] * 1e3:>12.1f} {r['busy_step'] * 1e3:>13.1f} {staged:>11.2f}"
        )
    print(f"\n{'N->M':>6} {'DCP reshard load s':>18} {'rank0 torch.load+bcast s':>24} {'ratio':>6}")
    for n, m, res in loads:
        print(
            f"{f'{n}->{m}':>6} {res['dcp_load']:>18.3f} {res['rank0_load_broadcast']:>24.3f} "
            f"{res['rank0_load_broadcast'] / res['dcp_load']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
