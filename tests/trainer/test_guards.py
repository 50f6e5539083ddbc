"""What cannot go wrong silently: a model that averages gradients across ranks (plain fully_shard, the
divide factor set on the root only, plain DDP) and a resume that changes the global batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.harness import REPO, Launcher, parse

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(120)
def test_averaging_models_and_global_batch_changes_are_refused(launcher: Launcher, tmp_path: Path) -> None:
    run = launcher.run(2, [str(tmp_path / "ckpt")], module="tests.trainer.guard_probe",
                       env={"PYTHONPATH": f"{REPO / 'trainer_image'}:{REPO}"}, timeout=100)
    assert parse(run.output(), "RTJ_PROBE") == [{
        "plain_fsdp": "refused", "root_only": "refused", "shard_model": "accepted",
        "plain_ddp": "refused", "replicate_model": "accepted",
        "batch_change_allow_False": "refused", "batch_change_allow_True": "resumed:12:8",
    }]
    message = next(line for line in run.output().splitlines() if line.startswith("RTJ_MESSAGE"))
    assert "FSDP module 0: gradient_divide_factor=None" in message, "names the block that still averages"
    assert "<root>" not in message and "shard_model" in message, "and says how to fix it"
