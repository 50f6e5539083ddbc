"""Checkpointer behaviour in one process (a 1-rank gloo group): staging safety, fresh directories,
loud failures. The multi-rank behaviour is in the reshard/resume/partial tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from resilient_contract import environment, storage
from resilient_trainer.checkpointer import Checkpointer, CheckpointError, upload_mode
from resilient_trainer.dist import DistContext
from resilient_trainer.state import TrainState
from tests.trainer.harness import free_port


@pytest.fixture
def ctx() -> Iterator[DistContext]:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        yield DistContext(0, 1, 0, torch.device("cpu"), dist.new_group(backend="gloo"))
    finally:
        dist.destroy_process_group()


def make(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    return model, opt


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.timeout(60)
def test_optimizer_step_right_after_async_save_does_not_leak_into_it(ctx: DistContext, tmp_path: Path) -> None:
    model, opt = make()
    ts = TrainState(step=7, samples_seen=70, seed=1, global_batch=10)
    ckpt = Checkpointer(str(tmp_path), model, opt, ctx=ctx, train_state=ts)
    stager = ckpt._stager
    assert stager is not None
    real_stage = stager._stage

    def slow_stage(*args: object, **kwargs: object) -> object:
        time.sleep(0.5)  # without the optimizer pre-hook, opt.step() below would win this race
        return real_stage(*args, **kwargs)

    stager._stage = slow_stage  # type: ignore[method-assign]
    before = snapshot(model)
    path = ckpt.save(7)
    assert ckpt._staging is not None, "staging should still be running in the background"
    phases = ckpt.last_save_phases  # where the call's time went: the slow copy is in none of them
    assert set(phases) == {"wait", "dir", "state_dict", "dcp"} and sum(phases.values()) <= ckpt.last_blocked_s
    assert ckpt.last_blocked_s < 0.5
    model(torch.randn(4, 256)).sum().backward()
    opt.step()  # the pre-hook waits for staging; the saved state must be `before`
    ts.step = 8
    assert ckpt.wait() == path
    ckpt.close()
    assert storage.check_step(storage.open_store(str(tmp_path)), storage.step_dir_name(7)).complete

    fresh_model, fresh_opt = make(seed=1)
    fresh_ts = TrainState()
    loader = Checkpointer(str(tmp_path), fresh_model, fresh_opt, ctx=ctx, train_state=fresh_ts)
    assert loader.load(path) == 7 and fresh_ts == TrainState(7, 70, 1, 10)
    for k, v in snapshot(fresh_model).items():
        assert torch.equal(v, before[k]), k
    loader.close()


@pytest.mark.parametrize(("asked", "device", "mode"), [
    ("auto", "cuda", "process"),  # on an H200 the in-process upload cost the loop 36x more per save
    ("auto", "cpu", "thread"),    # on CPU a writer process competes with the step for the same cores
    ("thread", "cuda", "thread"),
    ("process", "cpu", "process"),
])
def test_the_upload_runs_where_it_costs_the_loop_least(asked: str, device: str, mode: str) -> None:
    assert upload_mode(asked, torch.device(device)) == mode


def test_an_unknown_upload_mode_is_refused_by_name(ctx: DistContext, tmp_path: Path) -> None:
    model, opt = make()
    with pytest.raises(ValueError, match="'auto', 'thread' or 'process'"):
        Checkpointer(str(tmp_path), model, opt, ctx=ctx, upload_in="threads")


@pytest.mark.timeout(60)
def test_fresh_directory_per_save(ctx: DistContext, tmp_path: Path) -> None:
    model, opt = make()
    ckpt = Checkpointer(str(tmp_path), model, opt, ctx=ctx, async_save=False)
    stale = tmp_path / storage.step_dir_name(5)
    stale.mkdir()
    (stale / "__9_0.distcp").write_bytes(b"old shard of a crashed attempt")
    path = ckpt.save(5)
    assert path == str(stale) and not (stale / "__9_0.distcp").exists()
    assert ckpt.save(5) is None  # complete already: not rewritten
    ckpt.close()


@pytest.mark.timeout(60)
def test_unloadable_checkpoint_fails_loudly(
    ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = make()
    ckpt = Checkpointer(str(tmp_path), model, opt, ctx=ctx, async_save=False)
    monkeypatch.delenv(environment.RESUME_FROM, raising=False)
    assert ckpt.resume() is None  # fresh start only when nothing was injected
    partial = tmp_path / storage.step_dir_name(3)
    partial.mkdir()
    monkeypatch.setenv(environment.RESUME_FROM, str(partial))
    with pytest.raises(CheckpointError, match=str(partial)):
        ckpt.resume()
    with pytest.raises(CheckpointError, match="not a step"):
        ckpt.load(str(tmp_path / "elsewhere"))
    # A complete checkpoint of a different model: DCP's failure is named, not a BaseException escape.
    monkeypatch.delenv(environment.RESUME_FROM)
    other, other_opt = nn.Linear(3, 3), None
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    Checkpointer(str(tmp_path), other, other_opt, ctx=ctx, async_save=False).save(4)
    with pytest.raises(CheckpointError, match=storage.step_dir_name(4)):
        ckpt.load(str(tmp_path / storage.step_dir_name(4)))
    ckpt.close()


def fenced_env(monkeypatch: pytest.MonkeyPatch, attempt: int, resume: str | None = None) -> None:
    monkeypatch.setenv(environment.ATTEMPT, str(attempt))
    monkeypatch.setenv(environment.JOB_UID, "job-1")
    if resume:
        monkeypatch.setenv(environment.RESUME_FROM, resume)
    else:
        monkeypatch.delenv(environment.RESUME_FROM, raising=False)


@pytest.mark.timeout(120)
def test_a_fenced_gang_cannot_save_and_says_why(ctx: DistContext, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 1 (cut off) keeps training after attempt 2 started from its step 10: its saves are refused,
    and the lineage discovery applies never hands out what it left behind."""
    from resilient_contract import lineage
    from resilient_trainer.checkpointer import FencedError

    model, opt = make()
    fenced_env(monkeypatch, 1)
    old = Checkpointer(str(tmp_path), model, opt, ctx=ctx, async_save=False)
    old.save(10)
    assert (tmp_path / lineage.marker_name("job-1", 1)).exists()
    assert (tmp_path / "step-0000000010" / lineage.WRITER_FILE).read_bytes() == lineage.format_writer("job-1", 1)
    fenced_env(monkeypatch, 2, str(tmp_path / "step-0000000010"))
    new = Checkpointer(str(tmp_path), *make(), ctx=ctx, async_save=False)  # marks the root: attempt 2 from 10
    assert new.resume() == str(tmp_path / "step-0000000010")
    with pytest.raises(FencedError, match="attempt 2 of this job has started"):
        old.save(20)
    assert (tmp_path / "step-0000000020" / lineage.REFUSED_FILE).exists()
    assert not (tmp_path / "step-0000000020" / storage.METADATA_FILE).exists()
    found = storage.discover(str(tmp_path), job="job-1")  # what the operator sees: the attempt kept trying
    assert found.latest is not None and found.latest.step == 10
    assert found.skipped[0].step == 20 and found.skipped[0].fenced_writer == 1
    assert new.save(20) == str(tmp_path / "step-0000000020.a2")  # the cut-off gang's directory is never shared
    found = storage.discover(str(tmp_path), job="job-1")
    assert found.latest is not None and found.latest.path.endswith("step-0000000020.a2")
    old.close()
    new.close()


@pytest.mark.timeout(120)
def test_a_fence_that_lands_while_shards_are_written_stops_the_metadata(ctx: DistContext, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 is caught between its peers' shards and the commit (held by the test hook); attempt 2 starts
    meanwhile; released, rank 0 finds the mark and leaves an incomplete directory, never a checkpoint."""
    from resilient_trainer.checkpointer import TEST_HOLD_METADATA_ENV, FencedError

    release = tmp_path / "release"
    root = tmp_path / "ckpt"
    fenced_env(monkeypatch, 1)
    monkeypatch.setenv(TEST_HOLD_METADATA_ENV, str(release))
    old = Checkpointer(str(root), *make(), ctx=ctx)
    path = old.save(30)  # async: shards written, then held before .metadata
    assert path is not None
    monkeypatch.delenv(TEST_HOLD_METADATA_ENV)
    fenced_env(monkeypatch, 2, None)
    Checkpointer(str(root), *make(), ctx=ctx).close()  # attempt 2's rank 0 marks the root
    release.touch()
    with pytest.raises(FencedError):
        old.wait()
    assert not (Path(path) / storage.METADATA_FILE).exists()
    assert storage.discover(str(root), job="job-1").latest is None
    old.close()
