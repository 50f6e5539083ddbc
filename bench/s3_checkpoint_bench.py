"""What a save costs the training loop with an `s3://` root, vs a local filesystem, vs gather + torch.save + upload.

    python bench/s3_checkpoint_bench.py --size-mb 200 --world-size 2 --reps 3 [--step-model device]
        [--upload-in process]

One real SeaweedFS S3 server on loopback (e2e/s3server.py, built by hack/seaweedfs/build.sh), one process
group, the same FSDP2 state as bench/checkpoint_bench.py (Linear stack + AdamW moments), repetitions
interleaved so the three variants see the same machine load:
- fs async:  Checkpointer(<local dir>).save(): dcp.async_save, THREAD upload (`--upload-in process`: the
             writer process), background staging.
- s3 async:  Checkpointer(s3://bucket/prefix).save(): the same through FsspecWriter over s3fs.
- gather:    get_state_dict(full_state_dict, cpu_offload) to rank 0 + torch.save to a local file + upload of
             that file to the bucket; the other ranks wait at a barrier, as at their next collective.
loop = THE figure, the wall time a save adds to the training loop: fixed synthetic compute steps run from the
save() call until the upload finished, minus steps x the median step time without a save (so it includes
what "blocked" misses: steps slowed by staging/upload threads). For gather, everything is paid by the loop.
Medians over repetitions of the max over ranks. The trainer reaches the store only through the standard AWS
environment, as in a pod.
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
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "trainer_image")]

from checkpoint_bench import build, compute_step, device_step, local_bytes, max_over_ranks, memcpy_floor  # noqa: E402

from resilient_trainer import dist as rdist  # noqa: E402
from resilient_trainer.checkpointer import Checkpointer  # noqa: E402
from resilient_trainer.state import TrainState  # noqa: E402

BUCKET = "bench"


def async_loop_cost(ckpt: Checkpointer, step: int, step_fn: Callable[[], float]) -> tuple[float, float, float]:
    """(loop cost, blocked, upload wall) of one async save while training steps run."""
    idle = statistics.median(step_fn() for _ in range(5))
    t0 = time.perf_counter()
    ckpt.save(step)
    call = time.perf_counter() - t0
    busy = 0
    while True:
        inflight = ckpt._inflight
        if inflight is None or inflight[1].done():
            break
        step_fn()
        busy += 1
        ckpt.wait_staged()  # what the optimizer step pre-hook does before parameters change
    ckpt.wait()
    wall = time.perf_counter() - t0
    return wall - busy * idle, call + ckpt.staging_wait_s, wall


def gather_upload(model: torch.nn.Module, opt: torch.optim.Optimizer, ctx: rdist.DistContext, local: Path,
                  key: str) -> float:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from resilient_contract import storage

    dist.barrier(group=ctx.checkpoint_group)
    t0 = time.perf_counter()
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ctx.rank == 0:
        torch.save({"model": msd, "optim": osd}, local)
        storage.s3.filesystem().put_file(str(local), key)
        local.unlink()
    del msd, osd
    dist.barrier(group=ctx.checkpoint_group)
    return time.perf_counter() - t0


def run(args: argparse.Namespace, ctx: rdist.DistContext, job: dict[str, Any]) -> dict[str, Any]:
    model, opt = build(args.size_mb, ctx)
    fs_ckpt = Checkpointer(job["fs_root"], model, opt, ctx=ctx, train_state=TrainState(), keep_last=1,
                           upload_in=args.upload_in)
    s3_ckpt = Checkpointer(job["s3_root"], model, opt, ctx=ctx, train_state=TrainState(), keep_last=1,
                           upload_in=args.upload_in)
    x = torch.randn(args.compute_dim, args.compute_dim, device=ctx.device) * 0.01

    def step_fn() -> float:
        return device_step(args.device_step_s) if args.step_model == "device" else compute_step(x)

    for _ in range(2):
        step_fn()
    res: dict[str, list[float]] = {k: [] for k in ("fs_loop", "fs_blocked", "fs_upload", "s3_loop", "s3_blocked",
                                                   "s3_upload", "gather", "idle_step")}
    step = 0
    for rep in range(args.reps + 1):  # rep 0 warms up (stager buffers, connections)
        for kind, ckpt in (("fs", fs_ckpt), ("s3", s3_ckpt)):
            step += 1
            dist.barrier(group=ctx.checkpoint_group)
            loop, blocked, upload = async_loop_cost(ckpt, step, step_fn)
            if rep:
                res[f"{kind}_loop"].append(max_over_ranks(loop, ctx))
                res[f"{kind}_blocked"].append(max_over_ranks(blocked, ctx))
                res[f"{kind}_upload"].append(max_over_ranks(upload, ctx))
        step += 1
        gathered = gather_upload(model, opt, ctx, Path(job["scratch"]) / f"full-{step}.pt",
                                 f"{job['s3_root'][5:]}-full/step-{step:010d}.pt")
        if rep:
            res["gather"].append(max_over_ranks(gathered, ctx))
            res["idle_step"].append(statistics.median(step_fn() for _ in range(5)))
    fs_ckpt.close()
    s3_ckpt.close()
    local = local_bytes(model, opt)
    return {"world_size": ctx.world_size, "local_bytes": local, "memcpy_s": memcpy_floor(local, ctx, 5),
            **{k: statistics.median(v) for k, v in res.items()}}


def worker(rank: int, world_size: int, port: int, args: argparse.Namespace, job: dict[str, Any]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")
    torch.set_num_threads(args.threads)
    ctx = rdist.init(timeout_s=600, device=torch.device("cpu"))
    try:
        out = run(args, ctx, job)
        if rank == 0:
            Path(job["result"]).write_text(json.dumps(out))
    finally:
        rdist.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=200.0, help="model + optimizer state, all ranks together")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--compute-dim", type=int, default=384, help="size of the synthetic compute step")
    p.add_argument("--step-model", choices=("cpu", "device"), default="cpu",
                   help="cpu: a CPU-bound matmul step; device: a MODEL of device compute (the host waits "
                        "--device-step-s with the GIL released)")
    p.add_argument("--device-step-s", type=float, default=0.1)
    p.add_argument("--upload-in", choices=("thread", "process"), default="thread",
                   help="the Checkpointer's upload: a thread of the training process, or its writer process")
    args = p.parse_args()

    from e2e.s3server import Identity, S3Server

    workdir = Path(tempfile.mkdtemp(prefix="rtj-s3bench-"))
    identity = Identity.for_bucket("bench", BUCKET)
    server = S3Server.start(workdir / "seaweedfs", identities=[identity])
    try:
        server.create_bucket(BUCKET)
        os.environ.update(server.client_env(identity))  # inherited by the spawned ranks: the pod's environment
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        job = {"fs_root": str(workdir / "fs"), "s3_root": f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/ckpt",
               "scratch": str(workdir), "result": str(workdir / "result.json")}
        mp.start_processes(worker, args=(args.world_size, port, args, job), nprocs=args.world_size,
                           start_method="spawn")
        r = json.loads(Path(job["result"]).read_text())
    finally:
        server.remove()
        shutil.rmtree(workdir, ignore_errors=True)

    total_mb = r["local_bytes"] * r["world_size"] / 1e6
    print(f"\nstate {total_mb:.0f} MB (params + AdamW moments, fp32) at W={r['world_size']}, CPU, {args.reps} "
          f"interleaved reps, medians of the max over ranks; S3 = SeaweedFS on loopback; upload in a "
          f"{args.upload_in}")
    print("loop = wall time one save adds to the training loop; blocked = save() call + staging waits; "
          "upload = save() call to upload done")
    print(f"{'variant':<34} {'loop s/save':>11} {'blocked s':>9} {'upload s':>8}")
    print(f"{'async_save -> local filesystem':<34} {r['fs_loop']:>11.3f} {r['fs_blocked']:>9.3f} "
          f"{r['fs_upload']:>8.2f}")
    print(f"{'async_save -> s3:// (FsspecWriter)':<34} {r['s3_loop']:>11.3f} {r['s3_blocked']:>9.3f} "
          f"{r['s3_upload']:>8.2f}")
    print(f"{'gather + torch.save + upload':<34} {r['gather']:>11.3f} {r['gather']:>9.3f} {r['gather']:>8.2f}")
    model = ("device-modelled (a MODEL of device compute: the host waits, GIL released)"
             if args.step_model == "device" else "CPU-bound (matmul)")
    print(f"step without a save: {r['idle_step'] * 1e3:.1f} ms, {model}; memcpy floor {r['memcpy_s']:.3f} s per "
          f"rank; gather / s3 loop {r['gather'] / r['s3_loop']:.1f}x, s3 loop / memcpy "
          f"{r['s3_loop'] / r['memcpy_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
