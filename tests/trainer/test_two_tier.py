"""Two tiers ($RTJ_LOCAL_CHECKPOINT_DIR): shards land node-locally, are uploaded to the root, and `.metadata` is
committed on the root only once every rank's shards are there; the newest committed local copy is kept for a
recovery in place, and every byte loaded from it is verified against the root's checksum manifest.

Real DCP saves and loads, real gloo ranks (W=2, the writer process), a real S3 server for `s3://`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from resilient_contract import completion, environment
from resilient_contract.storage import LocalStore, check_step, discover, step_dir_name
from resilient_contract.storage.names import CORRUPT_FILE, MANIFEST_FILE
from resilient_trainer import outcome, tiered
from resilient_trainer.checkpointer import Checkpointer, CheckpointError
from resilient_trainer.dist import DistContext
from resilient_trainer.state import TrainState
from tests.trainer.conftest import S3Root
from tests.trainer.harness import Launcher, Run, parse
from tests.trainer.test_checkpointer import ctx, make, snapshot  # noqa: F401 (ctx: a fixture)
from tests.trainer.test_integrity import flip_byte, two_saves
from tests.trainer.test_reshard import assert_bitwise_equal

LOCAL_LOG = "resilient_trainer.tiered"


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(completion.TERMINATION_LOG_ENV, str(tmp_path / "termination-log"))
    for name in (environment.RESUME_FROM, environment.ATTEMPT, environment.LOCAL_CHECKPOINT_DIR,
                 tiered.TEST_HOLD_UPLOAD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(outcome, "_NOTES", {})


def local_steps(local: Path) -> dict[str, list[str]]:
    """Each local step directory and the files in it."""
    return {d.name: sorted(f.name for f in d.iterdir()) for d in sorted(local.iterdir())} if local.exists() else {}


def loaded_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOCAL_LOG and "shard file(s)" in r.getMessage()]


# ---- in one process (W=1): files and S3, the thread upload ------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_failed_upload_leaves_no_metadata_and_the_local_tier_stays_bounded(
        ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    root, local = tmp_path / "root", tmp_path / "local"
    model, opt = make()
    ckpt = Checkpointer(str(root), model, opt, ctx=ctx, train_state=TrainState(step=1), local_dir=str(local))
    ckpt.save(1)
    ckpt.wait()
    first = snapshot(model)
    hold = tmp_path / "release-upload"
    monkeypatch.setenv(tiered.TEST_HOLD_UPLOAD_ENV, str(hold))
    ckpt.train_state.step = 2
    ckpt.save(2)  # its shards go to the local tier, then it waits before the upload
    monkeypatch.delenv(tiered.TEST_HOLD_UPLOAD_ENV)
    (root / step_dir_name(2) / "__0_0.distcp").mkdir()  # the root refuses this shard: a directory is in the way
    hold.touch()
    with pytest.raises(CheckpointError, match=step_dir_name(2)):
        ckpt.wait()
    step2 = root / step_dir_name(2)
    assert not (step2 / ".metadata").exists() and not (step2 / MANIFEST_FILE).exists()
    listing = discover(str(root))
    assert listing.latest is not None and listing.latest.step == 1
    # the committed local copy of step 1 is kept; the failed step 2's is not marked, so never loaded
    assert tiered.LOCAL_MARK in local_steps(local)[step_dir_name(1)]
    assert tiered.marked_step(str(local), str(step2)) is None
    # the next save removes the failed local step, and its commit the older one: one local step left
    ckpt.train_state.step = 3
    assert ckpt.save(3) is not None
    ckpt.close()
    assert local_steps(local) == {step_dir_name(3): [tiered.LOCAL_MARK, "__0_0.distcp"]}
    assert check_step(LocalStore(str(root)), step_dir_name(3)).complete
    # and the root's step 1 is still the one that resumes step 1
    loader = Checkpointer(str(root), *make(seed=5), ctx=ctx, async_save=False)
    loader.load(str(root / step_dir_name(1)))
    assert_bitwise_equal(first, snapshot(loader.model), "model")
    loader.close()


@pytest.mark.timeout(60)
def test_a_corrupt_local_copy_is_read_again_from_the_root(
        ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    root, local = tmp_path / "root", tmp_path / "local"
    monkeypatch.setenv(environment.LOCAL_CHECKPOINT_DIR, str(local))
    _, second = two_saves(str(root), ctx)
    shard = local / step_dir_name(2) / "__0_0.distcp"
    assert shard.read_bytes() == (root / step_dir_name(2) / "__0_0.distcp").read_bytes()
    flip_byte(shard, 0.6)
    caplog.set_level(logging.INFO, logger=LOCAL_LOG)
    model, opt = make(seed=5)
    ts = TrainState(global_batch=10)
    ckpt = Checkpointer(str(root), model, opt, ctx=ctx, train_state=ts, async_save=False)
    path = str(root / step_dir_name(2))
    # the checkpoint is sound (its root copy verifies): no fallback, no corrupt mark, the same state
    assert ckpt.resume(path) == path and ts.step == 2
    ckpt.close()
    assert_bitwise_equal(second, snapshot(model), "model")
    assert not (root / step_dir_name(2) / CORRUPT_FILE).exists()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == LOCAL_LOG]
    assert warned and "does not match the checksum manifest" in warned[0], warned
    assert "1 shard file(s) from the local tier" in loaded_from(caplog)[0]
    assert "1 item(s) re-read from the root" in loaded_from(caplog)[0]


@pytest.mark.timeout(60)
def test_a_local_tier_inside_the_root_is_refused(ctx: DistContext, tmp_path: Path) -> None:  # noqa: F811
    with pytest.raises(CheckpointError, match="overlaps the checkpoint root"):
        Checkpointer(str(tmp_path), *make(), ctx=ctx, local_dir=str(tmp_path / "local"))


@pytest.mark.timeout(120)
def test_on_s3_shards_are_uploaded_and_resume_from_either_tier(
        ctx: DistContext, s3_root: S3Root, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    local = tmp_path / "local"
    monkeypatch.setenv(environment.LOCAL_CHECKPOINT_DIR, str(local))
    _, second = two_saves(s3_root.uri, ctx)
    keys = s3_root.keys(step_dir_name(2))
    for name in ("__0_0.distcp", MANIFEST_FILE, ".metadata"):
        assert f"{step_dir_name(2)}/{name}" in keys, keys
    remote = s3_root.fs().cat_file(f"{s3_root.uri[len('s3://'):]}/{step_dir_name(2)}/__0_0.distcp")
    assert local_steps(local) == {step_dir_name(2): [tiered.LOCAL_MARK, "__0_0.distcp"]}
    assert (local / step_dir_name(2) / "__0_0.distcp").read_bytes() == remote
    path = f"{s3_root.uri}/{step_dir_name(2)}"
    caplog.set_level(logging.INFO, logger=LOCAL_LOG)
    for tier in ("local", "bucket"):  # in place (this node's copy), then a fresh node (the bucket only)
        if tier == "bucket":
            monkeypatch.delenv(environment.LOCAL_CHECKPOINT_DIR)
        model, opt = make(seed=5)
        ts = TrainState(global_batch=10)
        ckpt = Checkpointer(s3_root.uri, model, opt, ctx=ctx, train_state=ts, async_save=False)
        assert ckpt.resume(path) == path and ts.step == 2
        ckpt.close()
        assert_bitwise_equal(second, snapshot(model), tier)
    assert len(loaded_from(caplog)) == 1 and "1 shard file(s) from the local tier" in loaded_from(caplog)[0]


# ---- real ranks (W=2), the writer process; resumed at W=2 and W=1 ----------------------------------------------
SCRIPT = '''
import logging, os, sys
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from resilient_trainer import dist as rdist, parallel
from resilient_trainer.checkpointer import Checkpointer
from resilient_trainer.state import TrainState

logging.basicConfig(level=logging.WARNING)
logging.getLogger("resilient_trainer.tiered").setLevel(logging.INFO)
mode, upload_in, root, dump = sys.argv[1:5]
ctx = rdist.init()
torch.manual_seed(0)
model = parallel.shard_model(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 8)), ctx)
opt = torch.optim.AdamW(model.parameters())
state = TrainState(global_batch=8)
ckpt = Checkpointer(root, model, opt, ctx=ctx, train_state=state, upload_in=upload_in, keep_last=5)
local = os.environ["RTJ_LOCAL_CHECKPOINT_DIR"]
if mode == "resume":
    ckpt.resume()
else:
    for step in (1, 2, 3):
        for p in model.parameters():
            p.grad = torch.full_like(p, float(step))
        opt.step()
        state.step = step
        ckpt.save(step)
        ckpt.wait()
        print(f"RTJ_SAVED step={step} local={','.join(sorted(os.listdir(local)))}", flush=True)
m, o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if ctx.rank == 0:
    torch.save({"model": m, "optim": o, "train": state.state_dict()}, dump)
ckpt.close()
rdist.shutdown()
'''


def start(launcher: Launcher, tmp_path: Path, world: int, args: list[str], env: dict[str, str]) -> Run:
    script = tmp_path / "two_tier_probe.py"
    script.write_text(SCRIPT)
    return launcher.start(world, [str(script), *args], module="resilient_trainer.worker", env=env)


def load_dump(path: Path) -> Any:
    return torch.load(path, weights_only=False)


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_two_ranks_save_through_the_local_tier_and_resume_at_two_and_one(launcher: Launcher, tmp_path: Path) -> None:
    root, local = tmp_path / "root", tmp_path / "local"
    env = {environment.LOCAL_CHECKPOINT_DIR: str(local)}
    saved = start(launcher, tmp_path, 2, ["save", "process", str(root), str(tmp_path / "saved.pt")], env)
    assert saved.wait(200) == [0, 0], saved.tail()
    for rank in range(2):  # after each commit, only that step is left locally
        said = parse(saved.output(rank), "RTJ_SAVED")
        assert [(s["step"], s["local"]) for s in said] == [(str(n), step_dir_name(n)) for n in (1, 2, 3)], said
    shards = ["__0_0.distcp", "__1_0.distcp"]
    for step in (1, 2, 3):
        step_dir = root / step_dir_name(step)
        assert check_step(LocalStore(str(root)), step_dir.name).complete
        assert {".metadata", MANIFEST_FILE, *shards} <= {f.name for f in step_dir.iterdir()}
    assert local_steps(local) == {step_dir_name(3): [tiered.LOCAL_MARK, *shards]}
    for shard in shards:
        assert (local / step_dir_name(3) / shard).read_bytes() == (root / step_dir_name(3) / shard).read_bytes()
    expected = load_dump(tmp_path / "saved.pt")
    resume_env = {**env, environment.RESUME_FROM: str(root / step_dir_name(3))}
    for world in (2, 1):
        dump = tmp_path / f"resumed-{world}.pt"
        resumed = start(launcher, tmp_path, world, ["resume", "thread", str(root), str(dump)], resume_env)
        assert resumed.wait(200) == [0] * world, resumed.tail()
        assert_bitwise_equal(expected, load_dump(dump), f"resumed at W={world}")
        for rank in range(world):  # in place: every shard this rank loaded came from the local tier
            out = resumed.output(rank)
            assert "from the local tier" in out and " 0 from the root, 0 item(s) re-read" in out, out[-2000:]
    assert local_steps(local) == {step_dir_name(3): [tiered.LOCAL_MARK, *shards]}  # a load keeps it
    assert os.listdir(root / step_dir_name(3)).count(CORRUPT_FILE) == 0
