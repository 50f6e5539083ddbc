"""Content integrity: per-item checksums written with the shards, a manifest committed before `.metadata`, every
byte verified on load, and a corrupt checkpoint refused with a fallback to the previous complete one.

Real DCP saves and loads throughout; real gloo ranks (W=2) where ranks matter; a real S3 server for `s3://`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from resilient_contract import completion, environment
from resilient_contract.storage import LocalStore, Verdict, check_step, discover, open_store, step_dir_name
from resilient_contract.storage.listing import Listing
from resilient_contract.storage.names import CORRUPT_FILE, MANIFEST_FILE
from resilient_trainer import integrity, outcome
from resilient_trainer.checkpointer import Checkpointer, CheckpointError, CorruptCheckpointError
from resilient_trainer.dist import DistContext
from resilient_trainer.state import TrainState
from tests.trainer.conftest import S3Root
from tests.trainer.harness import Launcher, Run, parse
from tests.trainer.test_checkpointer import ctx, make, snapshot  # noqa: F401 (ctx: a fixture)
from tests.trainer.test_reshard import assert_bitwise_equal
from tests.trainer.test_upload_process import start as start_no_guard_script


def flip_byte(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x01
    path.write_bytes(bytes(data))


def items(step_dir: Path) -> list[tuple[str, int, int]]:
    """(shard, offset, length) of every item `.metadata` references (DCP's own reader)."""
    meta = FileSystemReader(str(step_dir)).read_metadata()
    return sorted({(s.relative_path, s.offset, s.length) for s in meta.storage_data.values()})


@pytest.fixture(autouse=True)
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(completion.TERMINATION_LOG_ENV, str(path))
    monkeypatch.delenv(environment.RESUME_FROM, raising=False)
    monkeypatch.delenv(environment.ATTEMPT, raising=False)
    monkeypatch.setattr(outcome, "_NOTES", {})
    return path


def two_saves(root: str, ctx: DistContext) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # noqa: F811
    """Step 1 then step 2 (async, the thread upload), with different weights; the snapshots of both."""
    model, opt = make()
    ckpt = Checkpointer(root, model, opt, ctx=ctx, train_state=TrainState(step=1, samples_seen=10, global_batch=10))
    ckpt.save(1)
    ckpt.wait()
    first = snapshot(model)
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    ckpt.train_state.step, ckpt.train_state.samples_seen = 2, 20
    ckpt.save(2)
    ckpt.close()
    return first, snapshot(model)


# ---- the manifest ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_the_manifest_checksums_every_item_of_every_shard(ctx: DistContext, tmp_path: Path) -> None:  # noqa: F811
    two_saves(str(tmp_path), ctx)
    step = tmp_path / step_dir_name(2)
    doc = json.loads((step / MANIFEST_FILE).read_bytes())
    assert doc["version"] == 1 and doc["algorithm"] == integrity.DEFAULT_ALGORITHM == "xxh3-64"
    segments = {(name, off, length) for name, segs in doc["files"].items() for off, length, _ in segs}
    assert set(items(step)) == segments  # one segment per item, exactly where `.metadata` says the item is
    for name, segs in doc["files"].items():  # and each digest is that of the bytes on disk
        data = (step / name).read_bytes()
        assert segs[-1][0] + segs[-1][1] == len(data)
        for off, length, expected in segs:
            assert integrity.digest(doc["algorithm"], data[off:off + length]) == expected


@pytest.mark.timeout(60)
def test_the_manifest_is_durable_before_metadata_is_committed(ctx: DistContext, tmp_path: Path,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 writes the manifest and only then `.metadata`; a commit that dies in between leaves no `.metadata`
    (so no complete checkpoint without checksums). The writer-process kill of the same window: below."""
    from torch.distributed.checkpoint import FileSystemWriter

    seen = []
    real_write, real_finish = integrity.write_manifest, FileSystemWriter.finish

    def spy(writer: object, data: bytes) -> None:
        seen.append(("manifest", (tmp_path / step_dir_name(3) / ".metadata").exists()))
        real_write(writer, data)

    def dies(self: FileSystemWriter, *args: object, **kwargs: object) -> None:
        seen.append(("finish", (tmp_path / step_dir_name(3) / MANIFEST_FILE).exists()))
        raise OSError("killed between the manifest and .metadata")

    monkeypatch.setattr(integrity, "write_manifest", spy)
    monkeypatch.setattr(FileSystemWriter, "finish", dies)
    model, opt = make()
    ckpt = Checkpointer(str(tmp_path), model, opt, ctx=ctx, async_save=False)
    with pytest.raises(CheckpointError):
        ckpt.save(3)
    ckpt.close()
    assert seen == [("manifest", False), ("finish", True)]
    assert not (tmp_path / step_dir_name(3) / ".metadata").exists()
    monkeypatch.setattr(FileSystemWriter, "finish", real_finish)
    assert not check_step(LocalStore(str(tmp_path)), step_dir_name(3)).complete


# ---- verification and fallback, in one process ----------------------------------------------------------------
@pytest.mark.timeout(90)
def test_a_flipped_byte_is_refused_and_the_resume_falls_back(ctx: DistContext, tmp_path: Path,  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             termination_log: Path) -> None:
    first, _ = two_saves(str(tmp_path), ctx)
    bad = tmp_path / step_dir_name(2)
    flip_byte(next(bad.glob("*.distcp")))
    assert check_step(LocalStore(str(tmp_path)), bad.name).complete  # sizes alone cannot see it

    monkeypatch.setenv(environment.RESUME_FROM, str(bad))
    model, opt = make(seed=5)
    ts = TrainState(global_batch=10)
    ckpt = Checkpointer(str(tmp_path), model, opt, ctx=ctx, train_state=ts, async_save=False)
    assert ckpt.resume() == str(tmp_path / step_dir_name(1))
    assert ts == TrainState(1, 10, 0, 10)
    assert_bitwise_equal(first, snapshot(model), "model")  # step 1's weights, not a mix with step 2's

    # marked: the completeness rule (so discovery, `latest` and the operator) refuses it from now on
    assert (bad / CORRUPT_FILE).exists()
    verdict = check_step(LocalStore(str(tmp_path)), bad.name)
    assert not verdict.complete and verdict.corrupt and CORRUPT_FILE in verdict.reason
    listing = discover(str(tmp_path))
    assert listing.latest is not None and listing.latest.step == 1
    assert Listing.from_dict(listing.to_dict()) == listing  # the flag survives the sandbox's JSON
    # named in the termination message at once, and in the one the run ends with
    said = completion.read_termination_message(str(termination_log))
    assert said is not None and said.kind == completion.CHECKPOINT_REFUSED
    assert completion.refused_checkpoints(said) == (bad.name,) and said.fields["resumed_from"] == step_dir_name(1)
    # training goes on: the next save of step 2 replaces the corrupt directory (a local run: no attempts)
    assert ckpt.save(2) == str(bad) and not (bad / CORRUPT_FILE).exists()
    assert check_step(LocalStore(str(tmp_path)), bad.name).complete
    ckpt.close()
    outcome.record_success(ctx, step=2)
    done = completion.read_termination_message(str(termination_log))
    assert done is not None and done.succeeded and completion.refused_checkpoints(done) == (bad.name,)


@pytest.mark.timeout(60)
def test_a_damaged_manifest_is_refused(ctx: DistContext, tmp_path: Path) -> None:  # noqa: F811
    two_saves(str(tmp_path), ctx)
    step = tmp_path / step_dir_name(2)
    (step / MANIFEST_FILE).write_bytes(b'{"version": 1, "algorithm": "xxh3-64", "files": {"x": [[0, 1]]}}')
    model, opt = make(seed=5)
    ckpt = Checkpointer(str(tmp_path), model, opt, ctx=ctx, async_save=False)
    with pytest.raises(CorruptCheckpointError, match=r"manifest .* unreadable"):
        ckpt.load(str(step))
    doc = {"version": 1, "algorithm": "xxh3-64", "files": {}}  # parses, but vouches for no shard
    (step / MANIFEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(CorruptCheckpointError, match="not in its checksum manifest"):
        ckpt.load(str(step))
    ckpt.close()


@pytest.mark.timeout(60)
def test_a_checkpoint_without_a_manifest_still_loads(ctx: DistContext, tmp_path: Path) -> None:  # noqa: F811
    """Checkpoints written before checksums existed: no manifest, loaded as before (unverified)."""
    _, second = two_saves(str(tmp_path), ctx)
    step = tmp_path / step_dir_name(2)
    (step / MANIFEST_FILE).unlink()
    assert check_step(LocalStore(str(tmp_path)), step.name).complete
    model, opt = make(seed=5)
    ts = TrainState(global_batch=10)
    ckpt = Checkpointer(str(tmp_path), model, opt, ctx=ctx, train_state=ts, async_save=False)
    assert ckpt.resume(str(step)) == str(step) and ts.step == 2
    assert_bitwise_equal(second, snapshot(model), "model")
    ckpt.close()


@pytest.mark.timeout(60)
def test_nothing_to_fall_back_to_fails_and_names_it(ctx: DistContext, tmp_path: Path,  # noqa: F811
                                                     termination_log: Path) -> None:
    model, opt = make()
    saver = Checkpointer(str(tmp_path), model, opt, ctx=ctx, async_save=False)
    path = saver.save(4)
    saver.close()
    assert path is not None
    flip_byte(next(Path(path).glob("*.distcp")), 0.9)
    loader = Checkpointer(str(tmp_path), *make(seed=5), ctx=ctx, async_save=False)
    with pytest.raises(CheckpointError, match=r"corrupt.*no older complete checkpoint"):
        loader.resume(path)
    loader.close()
    said = completion.read_termination_message(str(termination_log))
    assert said is not None and said.kind == completion.CHECKPOINT_REFUSED
    assert completion.refused_checkpoints(said) == (step_dir_name(4),) and said.fields["resumed_from"] == "none"
    # a resume pointed at it again is refused up front, from the mark alone
    again = Checkpointer(str(tmp_path), *make(seed=5), ctx=ctx, async_save=False)
    with pytest.raises(CorruptCheckpointError, match=CORRUPT_FILE):
        again.load(path)
    again.close()


def test_refused_checkpoint_names_are_parsed_bounded() -> None:
    def parse_refused(text: str) -> tuple[str, ...]:
        return completion.refused_checkpoints(completion.parse_message(text))

    name, other = step_dir_name(60), step_dir_name(50, 3)
    assert parse_refused(f"RTJ_SUCCEEDED step=9 refused_checkpoint={name},{other},{name}") == (name, other)
    assert parse_refused(f"RTJ_CHECKPOINT_REFUSED refused_checkpoint=../{name},step-1,x attempt=1") == ()
    assert parse_refused("RTJ_PREEMPTED refused_checkpoint=" + ",".join([name] * 500)) == ()  # too long to believe
    many = ",".join(step_dir_name(i) for i in range(completion.MAX_REFUSED_NAMED + 3))
    assert len(parse_refused(f"RTJ_HUNG refused_checkpoint={many}")) == completion.MAX_REFUSED_NAMED
    assert completion.refused_checkpoints(None) == ()
    assert Verdict(1, "p", False, "r", corrupt=True) != Verdict(1, "p", False, "r")


# ---- S3 ---------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_on_s3_a_flipped_byte_is_refused_and_the_resume_falls_back(ctx: DistContext,  # noqa: F811
                                                                   s3_root: S3Root) -> None:
    first, _ = two_saves(s3_root.uri, ctx)
    keys = s3_root.keys(step_dir_name(2))
    assert f"{step_dir_name(2)}/{MANIFEST_FILE}" in keys and f"{step_dir_name(2)}/.metadata" in keys, keys
    fs, base = s3_root.fs(), s3_root.uri[len("s3://"):]
    shard = next(f"{base}/{k}" for k in keys if k.endswith(".distcp"))
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 3] ^= 0x80
    fs.pipe_file(shard, bytes(data))

    model, opt = make(seed=5)
    ts = TrainState(global_batch=10)
    ckpt = Checkpointer(s3_root.uri, model, opt, ctx=ctx, train_state=ts, async_save=False)
    assert ckpt.resume(f"{s3_root.uri}/{step_dir_name(2)}") == f"{s3_root.uri}/{step_dir_name(1)}"
    assert ts.step == 1
    assert_bitwise_equal(first, snapshot(model), "model")
    ckpt.close()
    assert f"{step_dir_name(2)}/{CORRUPT_FILE}" in s3_root.keys(step_dir_name(2))
    verdict = check_step(open_store(s3_root.uri), step_dir_name(2))
    assert verdict.corrupt and not verdict.complete
    listing = discover(s3_root.uri)
    assert listing.latest is not None and listing.latest.step == 1


# ---- real ranks: both upload modes, and a writer process killed between the manifest and `.metadata` ----------
SCRIPT = '''
import os, sys
import torch
from torch import nn
from resilient_trainer import dist as rdist, outcome, parallel
from resilient_trainer.checkpointer import Checkpointer
from resilient_trainer.state import TrainState

mode, upload_in, root = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = rdist.init()
torch.manual_seed(0)
model = parallel.shard_model(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 8)), ctx)
opt = torch.optim.AdamW(model.parameters())
state = TrainState(global_batch=8)
ckpt = Checkpointer(root, model, opt, ctx=ctx, train_state=state, upload_in=upload_in, keep_last=5)

def total():
    return sum(float(p.full_tensor().double().sum()) for p in model.parameters())

if mode == "resume":
    source = ckpt.resume()
    print(f"RTJ_RESUMED from={os.path.basename(source)} step={state.step} sum={total():.9f}", flush=True)
    outcome.record_success(ctx, step=state.step)
else:
    for step in (1, 2):
        for p in model.parameters():
            p.grad = torch.full_like(p, float(step))
        opt.step()
        state.step = step
        ckpt.save(step)
        ckpt.wait()
        print(f"RTJ_SAVED step={step} sum={total():.9f}", flush=True)
ckpt.close()
rdist.shutdown()
'''


def start(launcher: Launcher, tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> Run:
    script = tmp_path / "integrity_probe.py"
    script.write_text(SCRIPT)
    return launcher.start(2, [str(script), *args], module="resilient_trainer.worker", env=env)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
@pytest.mark.parametrize("upload_in", ["thread", "process"])
def test_two_ranks_refuse_a_corrupt_shard_and_resume_the_previous_checkpoint(
        launcher: Launcher, tmp_path: Path, upload_in: str) -> None:
    root = tmp_path / "ckpt"
    saved = start(launcher, tmp_path, ["save", upload_in, str(root)])
    assert saved.wait(200) == [0, 0], saved.tail()
    sums = {s["step"]: s["sum"] for s in parse(saved.output(0), "RTJ_SAVED")}
    bad = root / step_dir_name(2)
    manifest = json.loads((bad / MANIFEST_FILE).read_bytes())
    assert sorted(manifest["files"]) == ["__0_0.distcp", "__1_0.distcp"]  # both ranks' checksums reached rank 0
    flip_byte(bad / "__1_0.distcp")  # rank 1's shard: rank 0 must learn of it too

    env = {environment.RESUME_FROM: str(bad)}
    resumed = start(launcher, tmp_path, ["resume", upload_in, str(root)], env=env)
    assert resumed.wait(200) == [0, 0], resumed.tail()
    for rank in range(2):  # every rank fell back to the same checkpoint, with step 1's exact state
        assert parse(resumed.output(rank), "RTJ_RESUMED") == [
            {"from": step_dir_name(1), "step": "1", "sum": sums["1"]}], resumed.tail()
    assert "is corrupt" in resumed.output(0) and "falling back to" in resumed.output(0)
    said = completion.read_termination_message(str(tmp_path / "termination-log"))
    assert said is not None and said.succeeded and completion.refused_checkpoints(said) == (bad.name,)
    assert (bad / CORRUPT_FILE).exists()


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_writer_process_killed_after_the_manifest_leaves_no_metadata(launcher: Launcher, tmp_path: Path) -> None:
    """The writer process is held after it committed the manifest, before `.metadata` (the test hook), and
    killed there: the step has its manifest but no `.metadata`, so it is no checkpoint; step 1 resumes, verified."""
    root = tmp_path / "ckpt"
    env = {environment.ATTEMPT: "1", environment.JOB_UID: "job-1"}  # the test hold applies under an attempt
    run = start_no_guard_script(launcher, tmp_path, ["kill", str(root)], env=env)
    step2 = root / step_dir_name(2)
    deadline = time.monotonic() + 200
    while not ((step2 / MANIFEST_FILE).exists() and parse(run.output(0), "RTJ_SAVING")[1:]):
        assert time.monotonic() < deadline, run.tail()
        assert all(p.poll() is None for p in run.ranks), run.tail()
        time.sleep(0.2)
    doc = json.loads((step2 / MANIFEST_FILE).read_bytes())
    assert sorted(doc["files"]) == ["__0_0.distcp", "__1_0.distcp"]
    os.kill(int(parse(run.output(0), "RTJ_SAVING")[1]["writer"]), signal.SIGKILL)
    assert run.wait(120) == [3, 3], run.tail()
    assert not (step2 / ".metadata").exists()
    listing = discover(str(root))
    assert listing.latest is not None and listing.latest.step == 1
    assert (root / step_dir_name(1) / MANIFEST_FILE).exists()
    saved = parse(run.output(0), "RTJ_SAVED")[0]["sum"]
    again = start_no_guard_script(launcher, tmp_path, ["resume", str(root), listing.latest.path])
    assert again.wait(200) == [0, 0], again.tail()
    assert parse(again.output(0), "RTJ_RESUMED") == [{"step": "1", "sum": saved}]
