"""Fast single-process tests: torch-free imports, completion messages, retention rules, batch schedule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from resilient_contract import completion, storage
from resilient_trainer import retention
from resilient_trainer.state import TrainState, accumulation_steps, micro_batches, mix_seed

TORCH_FREE = ["resilient_trainer", "resilient_trainer.outcome", "resilient_trainer.worker",
              "resilient_trainer.__main__", "resilient_contract.environment", "resilient_contract.storage",
              "resilient_contract.dcp_metadata", "resilient_contract.completion", "resilient_trainer.retention"]


def test_operator_side_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        f"for m in {TORCH_FREE!r}: __import__(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'numpy')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_completion_message_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(completion.TERMINATION_LOG_ENV, str(tmp_path / "tl"))
    line = completion.write_termination_message(completion.SUCCEEDED, step=12, attempt=2)
    assert line == "RTJ_SUCCEEDED step=12 attempt=2"
    outcome = completion.read_termination_message()
    assert outcome == completion.Outcome(completion.SUCCEEDED, {"step": "12", "attempt": "2"})
    assert outcome.succeeded
    assert completion.parse_message("noise\nRTJ_PREEMPTED step=3 checkpoint=/c/step-0000000003\n").kind == (
        completion.PREEMPTED
    )
    assert completion.parse_message("terminate called without an active exception") is None
    with pytest.raises(ValueError):
        completion.format_message(completion.SUCCEEDED, path="has space")
    completion.write_completed_marker(str(tmp_path), step=5)
    assert completion.read_completed_marker(str(tmp_path)) == {"kind": completion.SUCCEEDED, "step": "5"}
    assert storage.parse_step_dir(completion.COMPLETED_MARKER_FILE) is None


# ---- retention -------------------------------------------------------------------------------------
def make_ckpt(root: Path, step: int, complete: bool = True) -> str:
    path = root / storage.step_dir_name(step)
    dcp.save({"w": torch.full((64,), float(step))}, checkpoint_id=str(path), no_dist=True)
    if not complete:
        (path / storage.METADATA_FILE).unlink()
    return path.name


def names(root: Path) -> list[int]:
    return sorted(s for n in os.listdir(root) if (s := storage.parse_step_dir(n)) is not None)


def test_retention_keeps_last_k_and_protected(tmp_path: Path) -> None:
    for s in (10, 20, 30, 40):
        make_ckpt(tmp_path, s)
    make_ckpt(tmp_path, 25, complete=False)  # older partial: garbage
    make_ckpt(tmp_path, 50, complete=False)  # newer partial: may be in flight
    retention.apply(str(tmp_path), keep_last=2, protect=(storage.step_dir_name(10),))
    assert names(tmp_path) == [10, 30, 40, 50]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(retention.TRASH_PREFIX)]


def test_retention_after_crashed_save_deletes_nothing_needed(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 10)
    make_ckpt(tmp_path, 20, complete=False)  # the crashed save
    assert retention.plan(storage.open_store(str(tmp_path)), keep_last=1).delete == ()
    # A truncated shard beside a .metadata is just as incomplete.
    name = make_ckpt(tmp_path, 30)
    shard = next((tmp_path / name).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    retention.apply(str(tmp_path), keep_last=1)
    assert names(tmp_path) == [10, 20, 30]  # 10 is still the newest complete one
    make_ckpt(tmp_path, 40)
    retention.apply(str(tmp_path), keep_last=1)
    assert names(tmp_path) == [40]
    # No complete checkpoint at all: nothing is deleted.
    empty = tmp_path / "empty"
    empty.mkdir()
    make_ckpt(empty, 5, complete=False)
    assert retention.plan(storage.open_store(str(empty)), keep_last=1).delete == ()
    with pytest.raises(ValueError):
        retention.plan(storage.open_store(str(empty)), keep_last=0)


# ---- constant global batch ----------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize(("global_batch", "micro"), [(16, 2), (12, 2), (7, 3), (8, 8)])
def test_every_sample_exactly_once(world_size: int, global_batch: int, micro: int) -> None:
    step = 7
    seen = []
    accum = accumulation_steps(global_batch, world_size, micro)
    for rank in range(world_size):
        slices = micro_batches(step, global_batch, world_size, rank, micro)
        assert len(slices) == accum  # every rank runs the same number of micro-steps
        for r in slices:
            assert len(r) <= micro
            seen.extend(r)
    assert sorted(seen) == list(range(step * global_batch, (step + 1) * global_batch))


def test_seed_mixing_and_train_state() -> None:
    assert mix_seed(1, 2) != mix_seed(2, 1) and mix_seed(1, 2) == mix_seed(1, 2)
    assert 0 <= mix_seed(2**70, -1) < 2**63
    ts = TrainState(step=3, samples_seen=48, seed=7, global_batch=16)
    other = TrainState()
    other.load_state_dict(ts.state_dict())
    assert other == ts
