"""The upload in a per-rank writer process: a script without a `__main__` guard is not re-run in it, and a
writer killed mid-upload leaves no `.metadata` while the previous complete checkpoint still resumes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from resilient_contract import environment, storage
from tests.trainer.harness import Launcher, Run, parse

# Deliberately no `if __name__ == "__main__":` guard: spawn would re-run all of this in the writer.
SCRIPT = '''
import os, sys
import torch
from torch import nn
from resilient_trainer import dist as rdist, parallel
from resilient_trainer.checkpointer import Checkpointer, CheckpointError
from resilient_trainer.state import TrainState
from torch.distributed.checkpoint import _async_process_executor as dcp_process

print(f"RTJ_SCRIPT_START pid={os.getpid()}", flush=True)
mode, root = sys.argv[1], sys.argv[2]
ctx = rdist.init()
torch.manual_seed(0)
model = parallel.shard_model(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), ctx)
opt = torch.optim.AdamW(model.parameters())
state = TrainState()
ckpt = Checkpointer(root, model, opt, ctx=ctx, train_state=state, upload_in="process", keep_last=5)
if mode == "resume":
    step = ckpt.load(sys.argv[3])
    total = sum(float(p.full_tensor().sum()) for p in model.parameters())
    print(f"RTJ_RESUMED step={step} sum={total:.6f}", flush=True)
else:
    for step in (1, 2):
        if step == 2 and mode == "kill":
            os.environ["RTJ_TEST_HOLD_METADATA"] = os.path.join(root, "never")
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        state.step = step
        ckpt.save(step)
        writer = dcp_process._CHECKPOINT_PROCESS
        print(f"RTJ_SAVING step={step} writer={writer.pid}", flush=True)
        try:
            ckpt.wait()
        except CheckpointError as exc:
            print(f"RTJ_FAILED step={step} error={type(exc).__name__}", flush=True)
            os._exit(3)
        total = sum(float(p.full_tensor().sum()) for p in model.parameters())
        print(f"RTJ_SAVED step={step} sum={total:.6f}", flush=True)
ckpt.close()
rdist.shutdown()
'''


def start(launcher: Launcher, tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> Run:
    script = tmp_path / "train_no_guard.py"
    script.write_text(SCRIPT)
    return launcher.start(2, [str(script), *args], module="resilient_trainer.worker", env=env)


@pytest.mark.timeout(240)
def test_a_script_without_main_guard_saves_through_the_writer_process(launcher: Launcher, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    run = start(launcher, tmp_path, ["save", str(root)])
    assert run.wait(200) == [0, 0], run.tail()
    for rank in range(2):
        out = run.output(rank)
        assert out.count("RTJ_SCRIPT_START") == 1, out  # the writer did not run the script again
        writers = {line["writer"] for line in parse(out, "RTJ_SAVING")}
        assert len(writers) == 1 and str(run.ranks[rank].pid) not in writers  # one writer, another process
    assert [s["step"] for s in parse(run.output(0), "RTJ_SAVED")] == ["1", "2"]
    for step in (1, 2):
        assert storage.check_step(storage.LocalStore(str(root)), storage.step_dir_name(step)).complete


@pytest.mark.timeout(300)
def test_a_writer_killed_mid_upload_leaves_no_metadata(launcher: Launcher, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    env = {environment.ATTEMPT: "1", environment.JOB_UID: "job-1"}  # the test hold applies under an attempt
    run = start(launcher, tmp_path, ["kill", str(root)], env=env)
    step2 = root / storage.step_dir_name(2)
    deadline = time.monotonic() + 200
    while not (len(list(step2.glob("*.distcp"))) >= 2 and parse(run.output(0), "RTJ_SAVING")[1:]):
        assert time.monotonic() < deadline, run.tail()
        assert all(p.poll() is None for p in run.ranks), run.tail()
        time.sleep(0.2)
    writer = int(parse(run.output(0), "RTJ_SAVING")[1]["writer"])
    os.kill(writer, signal.SIGKILL)  # rank 0's writer, held just before it commits step 2
    assert run.wait(120) == [3, 3], run.tail()
    assert parse(run.output(0), "RTJ_FAILED")[0]["step"] == "2"
    assert not (step2 / ".metadata").exists()
    listing = storage.discover(str(root))
    assert listing.latest is not None and listing.latest.path.endswith(storage.step_dir_name(1))
    saved = parse(run.output(0), "RTJ_SAVED")[0]["sum"]
    again = start(launcher, tmp_path, ["resume", str(root), listing.latest.path])
    assert again.wait(200) == [0, 0], again.tail()
    assert parse(again.output(0), "RTJ_RESUMED") == [{"step": "1", "sum": saved}]
