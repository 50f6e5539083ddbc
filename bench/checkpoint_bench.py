"""Checkpoint benchmark: what a save really costs the training loop, and how fast a resharded load is.

    python bench/checkpoint_bench.py --sizes-mb 300,1000 --reps 3 --steps 15 --skip-load 2>bench.log
    python bench/checkpoint_bench.py --sizes-mb 300 --skip-1gb --world-sizes 2,1          # + reshard loads
    bench/gpu_checkpoint.sh                                                               # CUDA, pinned, NCCL

State: an FSDP2-sharded stack of Linear layers plus AdamW state (params + exp_avg + exp_avg_sq ~= size),
one state for every variant in one run. Each measurement is a window of --steps training steps with one
save at its first step; at the window's end the loop waits for the save to be durable (a loop that saves
every N steps pays that wait at its next save). Variants are interleaved within each rep, in alternating
order, against a window without a save ("none"), measured in the same rep:
- gather:       get_state_dict(full_state_dict, cpu_offload) to rank 0 + torch.save + fsync; others wait.
- ckpt_before:  the Checkpointer with DCP's DefaultStager (UntypedStorage.copy_, GIL held) and the upload
                in a thread: what shipped before issue 27.
- ckpt_thread:  the Checkpointer as shipped: Tensor.copy_ staging into reused buffers, thread upload.
- ckpt_process: the Checkpointer with upload_in="process": a per-rank writer process, shared-memory staging.
- dcp_thread / dcp_process: plain dcp.async_save (default stager, FileSystemWriter(sync_files=True)).
Figures per save (medians over reps of the max over ranks):
- extra:   THE figure: window wall time minus the "none" window's: all the loop pays (blocked time, steps
           slowed by staging/upload threads taking CPU or the GIL, the wait for durability at the end).
- blocked: time inside save() + staging waits before optimizer steps + the end-of-window wait. Note
           `Checkpointer.last_blocked_s` is only the save() call: it understates the cost.
- durable: save() call -> `.metadata` committed (the upload future done). PSS: peak proportional set size
           of the rank plus its writer process (shared staging buffers counted once), sampled every 50 ms.
Two step models: "device" is a MODEL of device compute (the host sleeps --device-step-s with the GIL
released, as it waits for a GPU); "cpu" is a matmul step that occupies every core. The physical floor:
this rank's bytes copied once by Tensor.copy_ with all ranks copying at once (memcpy floor).
Reshard load N->M (without --skip-load): Checkpointer.load of the DCP checkpoint written at N, vs rank-0
torch.load of the gathered file + per-tensor broadcast + local shard (files in the page cache for both).
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
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import DefaultStager

from resilient_trainer import dist as rdist
from resilient_trainer import parallel, staging
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
    """A fixed synthetic CPU-bound training step (the real loop's compute), timed."""
    t0 = time.perf_counter()
    for _ in range(8):
        x = torch.tanh(x @ x) * 0.5
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def device_step(seconds: float) -> float:
    """A MODEL of a device-bound step: the host waits with the GIL released (as it does for a GPU kernel)."""
    t0 = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - t0


def max_over_ranks(value: float, ctx: rdist.DistContext) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.checkpoint_group)
    return float(t.item())


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


class PeakMemory:
    """Peak PSS (shared staging buffers counted once) of this rank and its writer process, sampled."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval, self.peak_kb = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _pss_kb(me) + sum(_pss_kb(c) for c in _children(me)))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


VARIANTS = ("none", "gather", "ckpt_before", "ckpt_thread", "ckpt_process", "dcp_thread", "dcp_process")
LABELS = {
    "gather": "gather + torch.save on rank 0",
    "ckpt_before": "Checkpointer before (DefaultStager, thread upload)",
    "ckpt_thread": "Checkpointer, Tensor.copy_ stager, thread upload",
    "ckpt_process": "Checkpointer, upload_in='process' (writer process, shm)",
    "dcp_thread": "plain DCP async_save THREAD",
    "dcp_process": "plain DCP async_save PROCESS",
}


class _DefaultStagerAnyTorch(DefaultStager):
    """DCP's DefaultStager, reusable on torch 2.9-2.11 too: those close its state-dict stager after every stage
    (its copy table emptied: the next save fails), so a closed one is replaced, as those versions would need."""

    def _stage(self, state_dict: Any, **kwargs: Any) -> Any:
        if not self._state_dict_stager._deepcopy_dispatch:
            self._state_dict_stager = StateDictStager(pin_memory=self._config.use_pinned_memory,
                                                      share_memory=self._config.use_shared_memory)
        return super()._stage(state_dict, **kwargs)


class Saver:
    """One way of saving, with the same interface for the loop: start(step), before_step(), done(), wait()."""

    def __init__(self, kind: str, model: nn.Module, opt: torch.optim.Optimizer, ctx: rdist.DistContext,
                 root: Path) -> None:
        self.kind, self.model, self.opt, self.ctx, self.root = kind, model, opt, ctx, root
        root.mkdir(parents=True, exist_ok=True)
        self.ckpt: Checkpointer | None = None
        self.future: Any = None
        self.staging: Any = None
        self.process: Any = None  # plain DCP PROCESS mode's own helper (swapped with ours around its saves)
        if kind.startswith("ckpt_"):
            self.ckpt = Checkpointer(str(root / kind), model, opt, ctx=ctx, train_state=TrainState(), keep_last=1,
                                     upload_in="process" if kind == "ckpt_process" else "thread")
            self.ckpt._hook.remove()  # the loop below calls before_step() itself, for every variant alike
            if kind == "ckpt_before":
                assert self.ckpt._stager is not None
                self.ckpt._stager.close()
                self.ckpt._stager = _DefaultStagerAnyTorch(staging.options(ctx.device))  # type: ignore[assignment]

    def start(self, step: int) -> None:
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint import _async_process_executor as dcp_process
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        if self.ckpt is not None:
            self.ckpt.save(step)
            self.staging = self.ckpt
        elif self.kind == "gather":
            msd, osd = get_state_dict(self.model, self.opt,
                                      options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.ctx.rank == 0:
                path = self.root / "full.pt"
                with open(path, "wb") as f:
                    torch.save({"model": msd, "optim": osd}, f)
                    f.flush()
                    os.fsync(f.fileno())  # durable, as DCP's FileSystemWriter(sync_files=True) is
            dist.barrier(group=self.ctx.checkpoint_group)
        elif self.kind.startswith("dcp_"):
            msd, osd = get_state_dict(self.model, self.opt)
            path = self.root / self.kind / f"step-{step:010d}"
            if self.kind == "dcp_process":
                ours, dcp_process._CHECKPOINT_PROCESS = dcp_process._CHECKPOINT_PROCESS, self.process
                self.ours = ours
            out = dcp.async_save(
                {"model": msd, "optim": osd}, storage_writer=FileSystemWriter(str(path), sync_files=True),
                process_group=self.ctx.checkpoint_group,
                async_checkpointer_type=(AsyncCheckpointerType.PROCESS if self.kind == "dcp_process"
                                         else AsyncCheckpointerType.THREAD))
            self.future = out.upload_completion if hasattr(out, "upload_completion") else out

    def before_step(self) -> None:
        """What an optimizer step pre-hook must wait for: the staging copy."""
        if self.ckpt is not None:
            self.ckpt.wait_staged()

    def done(self) -> bool:
        if self.ckpt is not None:
            inflight = self.ckpt._inflight
            return inflight is None or inflight[1].done()
        return self.future is None or self.future.done()

    def wait(self) -> None:
        from torch.distributed.checkpoint import _async_process_executor as dcp_process

        if self.ckpt is not None:
            self.ckpt.wait()
            self.ckpt.join_retention()
        elif self.future is not None:
            self.future.result()
            self.future = None
            if self.kind == "dcp_process":
                self.process, dcp_process._CHECKPOINT_PROCESS = dcp_process._CHECKPOINT_PROCESS, self.ours
            shutil.rmtree(self.root / self.kind, ignore_errors=True)  # keep one, as keep_last=1 does

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()


def run_window(saver: Saver, step: int, steps: int, step_fn: Any, ctx: rdist.DistContext) -> dict[str, float]:
    """`steps` training steps with one save at the first; the loop then waits for durability (what a loop
    that saves every `steps` steps pays). Returns wall time, blocked time, time to durable, peak PSS.

    As in a real loop (and the Checkpointer's optimizer pre-hook), a step's compute runs first and the wait for
    the staging copy comes at its optimizer step, so the copy can hide behind forward and backward (before stop
    48 the bench waited before the step's compute, which charged the whole copy to the loop)."""
    dist.barrier(group=ctx.checkpoint_group)
    blocked = durable = staged_wait = 0.0
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        if saver.kind != "none":
            saver.start(step)
        blocked = time.perf_counter() - t0
        for _ in range(steps):
            step_fn()  # forward and backward: they read the parameters, which the staging copy may still read
            b0 = time.perf_counter()
            saver.before_step()  # the optimizer step's pre-hook: parameters change only after the copy
            staged_wait += time.perf_counter() - b0
            if not durable and saver.done():
                durable = time.perf_counter() - t0
        b0 = time.perf_counter()
        saver.wait()  # not durable yet after `steps` steps: the next save would wait here
        blocked_end = time.perf_counter() - b0
        wall = time.perf_counter() - t0
        durable = durable or wall
    out = {"wall": wall, "blocked": blocked + staged_wait + blocked_end, "durable": durable,
           "pss_mb": mem.peak_kb / 1024}
    if saver.ckpt is not None:  # where the save() call's own time went, and the staging wait after it
        out.update({f"phase_{k}": v for k, v in saver.ckpt.last_save_phases.items()}, phase_staging=staged_wait)
    return out


def memcpy_floor(local: int, ctx: rdist.DistContext, reps: int) -> float:
    """The staging copy's physical floor: this rank's bytes copied by Tensor.copy_, all ranks at once."""
    cuda = ctx.device.type == "cuda"  # then: device -> pinned host memory, as staging copies
    src = torch.empty(local, dtype=torch.uint8, device=ctx.device).fill_(1)
    dst = torch.empty(local, dtype=torch.uint8, pin_memory=cuda)
    dst.copy_(src)  # fault the pages in
    times = []
    for _ in range(reps):
        dist.barrier(group=ctx.checkpoint_group)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(ctx.device)
        times.append(max_over_ranks(time.perf_counter() - t0, ctx))
    return statistics.median(times)


def save_phase(args: argparse.Namespace, ctx: rdist.DistContext, workdir: Path) -> dict[str, Any]:
    model, opt = build(args.size_mb, ctx, args.parallel)
    variants = [v for v in VARIANTS if v == "none" or v in args.variants.split(",")]
    savers = {v: Saver(v, model, opt, ctx, workdir / f"w{ctx.world_size}") for v in variants}
    x = torch.randn(args.compute_dim, args.compute_dim, device=ctx.device) * 0.01
    step_models = {"cpu": lambda: compute_step(x), "device": lambda: device_step(args.device_step_s)}
    out: dict[str, Any] = {"world_size": ctx.world_size, "local_bytes": local_bytes(model, opt), "rows": {}}
    step = 0
    for model_name in args.step_models.split(","):
        fn = step_models[model_name]
        figures: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for rep in range(args.reps + 1):  # rep 0 warms up: buffers, the writer processes
            order = variants if rep % 2 == 0 else variants[::-1]  # interleaved, alternating order
            for v in order:
                step += 1
                res = run_window(savers[v], step, args.steps, fn, ctx)
                if rep:
                    figures[v].append({k: max_over_ranks(val, ctx) for k, val in res.items()})
        base = statistics.median(r["wall"] for r in figures["none"])
        out["rows"][model_name] = {
            v: {"extra": statistics.median(r["wall"] for r in rs) - base,
                **{k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "wall"}}
            for v, rs in figures.items()
        }
        out["rows"][model_name]["none"]["step_s"] = base / args.steps
    out["memcpy_s"] = memcpy_floor(out["local_bytes"], ctx, 5)
    for saver in savers.values():
        saver.close()
    out["checkpoint"] = savers["ckpt_thread"].ckpt.last_saved if "ckpt_thread" in savers else None  # type: ignore[union-attr]
    full_file = workdir / f"full-w{ctx.world_size}.pt"  # the gathered file for the load phase
    if not args.skip_load:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if ctx.rank == 0:
            torch.save({"model": msd, "optim": osd}, full_file)
    out["full_file"] = str(full_file)
    return out


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
    p.add_argument("--sizes-mb", default="300,1000", help="model + optimizer state, all ranks together")
    p.add_argument("--skip-1gb", action="store_true", help="drop sizes >= 1000 MB (for speed)")
    p.add_argument("--world-sizes", default="2")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="training steps per save (the loop saves every N)")
    p.add_argument("--step-models", default="device,cpu",
                   help="device: a MODEL of device compute (the host waits --device-step-s, GIL released); "
                        "cpu: a CPU-bound matmul step on every core")
    p.add_argument("--device-step-s", type=float, default=0.1)
    p.add_argument("--variants", default=",".join(VARIANTS[1:]))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--compute-dim", type=int, default=384, help="size of the synthetic compute step")
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--skip-load", action="store_true", help="only the save figures")
    p.add_argument("--workdir", default=None,
                   help="where checkpoints go: a fresh directory in it, removed after (default: the temp dir)")
    args = p.parse_args()
    sizes = [float(s) for s in args.sizes_mb.split(",") if not (args.skip_1gb and float(s) >= 1000)]
    worlds = [int(w) for w in args.world_sizes.split(",")]
    if args.workdir:  # a fresh directory inside it: a previous run's checkpoints would make saves no-ops
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="rtj-bench-", dir=args.workdir))
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} CPUs",
          flush=True)
    rows, loads = [], []
    try:
        for size in sizes:
            args.size_mb = size
            for w in worlds:
                row = spawn(w, args, {"kind": "save", "workdir": str(workdir / f"{size:.0f}"),
                                      "result": str(workdir / f"s{size:.0f}-{w}.json")})
                rows.append((size, row))
                if args.skip_load or args.parallel == "ddp" or not row.get("checkpoint"):
                    continue
                for m in [m for m in worlds if m != w] or [max(1, w // 2)]:
                    res = spawn(m, args, {"kind": "load", "checkpoint": row["checkpoint"],
                                          "full_file": row["full_file"],
                                          "result": str(workdir / f"l{size:.0f}-{w}-{m}.json")})
                    loads.append((size, w, m, res))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())} (figures taken under this load)")
    print(f"\n{args.reps} interleaved reps (order alternating), medians of the max over ranks; {args.steps} steps per "
          f"save; device {args.device}, {args.parallel}")
    print("extra = loop wall time over the N steps minus the same N steps without saving (what the loop really "
          "pays per save); blocked = time inside save() + staging waits before optimizer steps + any wait for "
          "the upload at the end of the window; durable = save() call -> .metadata committed; PSS = peak of "
          "rank + its writer process")
    for size, row in rows:
        w, local = row["world_size"], row["local_bytes"]
        memcpy = row["memcpy_s"]
        for model_name, table in row["rows"].items():
            label = ("device-modelled step (a MODEL of device compute: the host waits "
                     f"{args.device_step_s * 1e3:.0f} ms, GIL released)" if model_name == "device"
                     else "real device step (matmul on the GPU, synchronised)" if args.device == "cuda"
                     else "CPU-bound step (matmul on every core)")
            print(f"\n{size:.0f} MB, W={w} ({local / 1e6:.0f} MB per rank), {label}; step "
                  f"{table['none']['step_s'] * 1e3:.0f} ms; memcpy floor {memcpy:.3f} s per rank, all ranks copying")
            print(f"{'variant':<58} {'extra s':>8} {'blocked s':>9} {'durable s':>9} {'PSS MB':>7} "
                  f"{'gather/extra':>12} {'extra/memcpy':>12}")
            gather = table.get("gather", {}).get("extra", float("nan"))
            for v, f in table.items():
                if v == "none":
                    continue
                extra = f["extra"]
                ratio = gather / extra if extra > 0 else float("inf")
                print(f"{LABELS[v]:<58} {extra:>8.3f} {f['blocked']:>9.3f} {f['durable']:>9.2f} "
                      f"{f['pss_mb']:>7.0f} {ratio:>12.1f} {extra / memcpy:>12.2f}")
            phased = {v: f for v, f in table.items() if "phase_dcp" in f}
            if phased:
                print("the Checkpointer's blocked time by phase, s (median of the max over ranks): wait = the "
                      "previous upload, dir = claim + fence check + broadcast, state_dict = get_state_dict, dcp = "
                      "DCP's async_save call, staging = the optimizer's wait for the background copy")
                for v, f in phased.items():  # in the order save() records them (last_save_phases), then staging
                    print(f"  {LABELS[v]:<56} " + "  ".join(
                        f"{k.removeprefix('phase_')} {val:.3f}" for k, val in f.items() if k.startswith("phase_")))
    if loads:
        print(f"\n{'MB':>5} {'N->M':>6} {'DCP reshard load s':>18} {'rank0 torch.load+bcast s':>24} {'ratio':>6}")
    for size, n, m, res in loads:
        print(f"{size:>5.0f} {f'{n}->{m}':>6} {res['dcp_load']:>18.3f} {res['rank0_load_broadcast']:>24.3f} "
              f"{res['rank0_load_broadcast'] / res['dcp_load']:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
