"""Reshard matrix: a checkpoint saved at world size N loads at M with the full state bitwise equal.

Each saved checkpoint comes from the example program (FSDP2, AdamW, LambdaLR, TrainState) after a few
real steps, with the gathered full state dumped next to it. Loading at M with no further steps dumps
the gathered full state again; both dumps must match bit for bit, including the step and the scheduler.
The model's dims (32, 67, 128) do not divide evenly by 3, so uneven shards are covered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from resilient_contract import storage
from tests.trainer.harness import SMALL_MODEL, Launcher, parse

pytestmark = pytest.mark.multiproc

STEPS = 3
COMMON = [*SMALL_MODEL, "--global-batch", "12", "--micro-batch", "2", "--steps", str(STEPS)]


def assert_bitwise_equal(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        a8 = a.detach().contiguous().reshape(-1).view(torch.uint8)
        b8 = b.detach().contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(a8, b8), f"{where}: tensors differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_bitwise_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def saved(module_launcher: Launcher) -> dict[int, tuple[Path, Path]]:
    """W -> (checkpoint dir, dump of the full state at save time), for W in 4, 3, 2."""
    out = {}
    for w in (4, 3, 2):
        root = module_launcher.tmp / f"ckpt-w{w}"
        dump = module_launcher.tmp / f"saved-w{w}.pt"
        module_launcher.run(
            w, [*COMMON, "--checkpoint-every", "0", "--checkpoint-root", str(root), "--dump-state", str(dump)]
        )
        latest = storage.scan(storage.open_store(str(root)), storage.UNBOUNDED_SCAN).latest
        assert latest is not None and latest.step == STEPS
        out[w] = (Path(latest.path), dump)
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("save_w", "load_w"), [(4, 3), (4, 2), (4, 1), (3, 2), (3, 1), (2, 1), (2, 4)], ids=lambda w: f"w{w}"
)
def test_reshard_load_is_bitwise(
    saved: dict[int, tuple[Path, Path]], module_launcher: Launcher, save_w: int, load_w: int
) -> None:
    ckpt, saved_dump = saved[save_w]
    loaded_dump = module_launcher.tmp / f"loaded-{save_w}-{load_w}.pt"
    run = module_launcher.run(
        load_w,
        [
            *COMMON,
            "--checkpoint-every",
            "0",
            "--checkpoint-root",
            str(ckpt.parent),
            "--resume-from",
            str(ckpt),
            "--dump-state",
            str(loaded_dump),
        ],
    )
    resumed = parse(run.output(), "RTJ_RESUMED")
    assert resumed == [{"from": str(ckpt), "step": str(STEPS)}]
    assert not parse(run.output(), "RTJ_STEP"), "nothing left to train: the load alone is compared"
    before = torch.load(saved_dump, weights_only=False)
    after = torch.load(loaded_dump, weights_only=False)
    assert after["train"]["step"] == STEPS and after["train"]["samples_seen"] == STEPS * 12
    assert after["scheduler"]["last_epoch"] == STEPS
    assert_bitwise_equal(before, after, "state")


@pytest.mark.timeout(180)
def test_ddp_checkpoint_loads_at_another_world_size(module_launcher: Launcher) -> None:
    """DDP state is replicated; DCP stores it once and loads it at any world size (here 2 -> 1)."""
    root = module_launcher.tmp / "ddp"
    saved_dump, loaded_dump = module_launcher.tmp / "ddp-saved.pt", module_launcher.tmp / "ddp-loaded.pt"
    ddp = [*COMMON, "--parallel", "ddp", "--checkpoint-every", "0", "--checkpoint-root", str(root)]
    module_launcher.run(2, [*ddp, "--dump-state", str(saved_dump)])
    ckpt = storage.scan(storage.open_store(str(root)), storage.UNBOUNDED_SCAN).latest
    assert ckpt is not None and ckpt.step == STEPS
    module_launcher.run(1, [*ddp, "--resume-from", ckpt.path, "--dump-state", str(loaded_dump)])
    assert_bitwise_equal(torch.load(saved_dump, weights_only=False), torch.load(loaded_dump, weights_only=False))
