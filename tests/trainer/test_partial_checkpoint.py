"""A rank SIGKILLed in the middle of a save: no `.metadata`, survivors exit, resume skips the partial.

Also checks retention across the crash (keep_last=1): the last complete checkpoint survives the failed
save, and after the resumed attempt only the newest and the resumed-from checkpoints remain.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from resilient_contract import completion
from resilient_contract.storage import METADATA_FILE, check_step, discover, open_store, parse_step_dir, scan
from resilient_contract.storage.scan import UNBOUNDED_SCAN
from tests.trainer.harness import SMALL_MODEL, Launcher, parse

pytestmark = pytest.mark.multiproc

COMMON = [*SMALL_MODEL, "--global-batch", "8", "--micro-batch", "2", "--steps", "8", "--checkpoint-every", "2",
          "--keep-last", "1", "--collective-timeout", "20"]


@pytest.mark.timeout(240)
def test_rank_killed_mid_save(launcher: Launcher, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    run = launcher.start(
        3, [*COMMON, "--checkpoint-root", str(root), "--crash-in-save-step", "4", "--crash-in-save-rank", "1"]
    )
    t0 = time.monotonic()
    codes = run.wait(timeout=90)
    elapsed = time.monotonic() - t0
    assert codes[1] == -signal.SIGKILL, run.tail()
    assert codes[0] != 0 and codes[2] != 0, f"survivors must fail, not finish: {codes}\n{run.tail()}"
    print(f"survivors exited {codes} {elapsed:.1f}s after start")

    partial = root / "step-0000000004"
    assert partial.is_dir() and not (partial / METADATA_FILE).exists()
    store = open_store(str(root))
    assert not check_step(store, partial.name).complete
    latest = scan(store, UNBOUNDED_SCAN).latest
    assert latest is not None and latest.step == 2, "retention must keep the last complete checkpoint"
    assert completion.read_completed_marker(str(root)) is None
    assert not list(root.glob("step-0000000006")), "no save after the failed one"

    # Resume at W=2 from what discovery reports; the partial directory is ignored, then replaced.
    listing = discover(str(root))
    assert listing.latest is not None and listing.latest.step == 2
    assert [v.step for v in listing.skipped] == [4]
    resumed = launcher.run(2, [*COMMON, "--checkpoint-root", str(root)],
                           env={"RTJ_RESUME_FROM": listing.latest.path})
    assert parse(resumed.output(), "RTJ_RESUMED") == [{"from": listing.latest.path, "step": "2"}]
    assert parse(resumed.output(), "RTJ_RESULT")[0]["step"] == "8"
    names = sorted(n for n in os.listdir(root) if parse_step_dir(n) is not None)
    # keep_last=1: newest complete (8) plus the one this attempt resumed from (2).
    assert names == ["step-0000000002", "step-0000000008"]
    assert all(check_step(store, n).complete for n in names)
    assert completion.read_completed_marker(str(root)) is not None
