"""SIGTERM on every rank (at slightly different times): finish the step, save, exit 143 within the grace period."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from resilient_contract import completion, storage
from tests.trainer.harness import SMALL_MODEL, Launcher, parse, wait_for

pytestmark = pytest.mark.multiproc
# What a stopping pod gets before its SIGKILL: Kubernetes' default terminationGracePeriodSeconds, and
# torchrun's own shutdown timeout for its workers. The save and the exit must fit in it; that is the bound a
# user notices. (Unloaded this takes ~2 s; on CI's starved side lane, with the disk shared with kind, 20 s.)
GRACE_S = 30


@pytest.mark.timeout(120)
def test_sigterm_saves_and_exits(launcher: Launcher, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    run = launcher.start(
        2, [*SMALL_MODEL, "--steps", "200", "--global-batch", "8", "--checkpoint-every", "0",
            "--step-delay", "0.2", "--checkpoint-root", str(root)]
    )
    assert wait_for(lambda: len(parse(run.output(), "RTJ_STEP")) >= 2, timeout=60), run.tail()
    run.kill(signal.SIGTERM, ranks=[1])
    time.sleep(0.3)  # the other rank is signalled a step later; they must still agree on one step
    t0 = time.monotonic()
    run.kill(signal.SIGTERM, ranks=[0])
    codes = run.wait(timeout=GRACE_S)  # fails the test past the grace period
    assert codes == [143, 143], run.tail()
    assert time.monotonic() - t0 < GRACE_S
    preempted = parse(run.output(), "RTJ_PREEMPTED")
    assert len(preempted) == 1
    step = int(preempted[0]["step"])
    verdict = storage.check_step(storage.open_store(str(root)), storage.step_dir_name(step))
    assert verdict.complete and preempted[0]["checkpoint"] == verdict.path
    outcome = completion.read_termination_message(str(tmp_path / "termination-log"))
    assert outcome is not None and outcome.kind == completion.PREEMPTED
    assert completion.read_completed_marker(str(root)) is None
