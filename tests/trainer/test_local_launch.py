"""Local runs like torchrun: the launcher without an operator, `--resume latest`, the `latest` command,
and workers that die with their launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_contract import completion, storage
from resilient_trainer import launch
from tests.trainer.harness import SMALL_MODEL, Launcher, base_env, parse, start_process, wait_for

LAUNCH = [sys.executable, "-m", "resilient_trainer.launch"]
TINY = ["-m", "resilient_trainer.examples.tiny_gpt", *SMALL_MODEL, "--global-batch", "8"]


def local_env(tmp: Path) -> dict[str, str]:
    """No operator variables at all, and no termination-log override: what a workstation has."""
    env = base_env(tmp)
    env.pop(completion.TERMINATION_LOG_ENV)
    return env


def latest_cmd(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "resilient_trainer", "latest", str(root)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_local_args_and_resume_resolution(tmp_path: Path) -> None:
    opts, rest = launch.parse_local(["--nproc-per-node", "3", "--checkpoint-root", "ck", "--log-dir=x"])
    assert (opts.nproc_per_node, opts.checkpoint_root, rest) == (3, "ck", ["--log-dir=x"])
    assert launch.local_torchrun_args(3, rest, ["train.py"]) == [
        "--standalone", "--nnodes=1", "--nproc-per-node=3", "--max-restarts=0", "--log-dir=x",
        "-m", "resilient_trainer.worker", "train.py",
    ]
    assert launch.resolve_resume("latest", str(tmp_path / "none"))[0] is None  # fresh start
    with pytest.raises(ValueError, match="checkpoint-root"):
        launch.resolve_resume("latest", None)


def test_no_termination_file_is_created_outside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The default path is used only where the kubelet mounted it; an old run as root may have created
    /dev/termination-log on this host, so the rule is checked against a stand-in path."""
    default = tmp_path / "termination-log"
    monkeypatch.setattr(completion, "TERMINATION_LOG_DEFAULT", str(default))
    monkeypatch.delenv(completion.TERMINATION_LOG_ENV, raising=False)
    assert completion.termination_log_path() is None
    assert completion.write_termination_message(completion.SUCCEEDED, step=1, attempt=0).startswith("RTJ_")
    assert not default.exists() and completion.read_termination_message() is None
    default.touch()  # in a pod: the kubelet's file
    assert completion.termination_log_path() == str(default)
    completion.write_termination_message(completion.SUCCEEDED, step=1, attempt=0)
    assert completion.read_termination_message() == completion.Outcome(completion.SUCCEEDED,
                                                                      {"step": "1", "attempt": "0"})


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_local_run_resume_latest_and_latest_command(launcher: Launcher, tmp_path: Path) -> None:
    env = local_env(tmp_path)
    first = start_process(launcher, [*LAUNCH, "--nproc-per-node", "2", "--checkpoint-root", "ck", "--", *TINY,
                                     "--steps", "3", "--checkpoint-every", "2"], env, "local1")
    assert first.wait(150) == [0], first.tail(40)
    root = tmp_path / "ck"  # relative to the launcher's cwd, exported as an absolute path
    assert parse(first.output(), "RTJ_START")[0]["world_size"] == "2"
    assert parse(first.output(), "RTJ_CHECKPOINT")[-1]["path"] == str(root / storage.step_dir_name(3))
    assert completion.read_completed_marker(str(root)) is not None

    # A newer, incomplete directory (a crashed save) is reported and skipped, by both commands.
    (root / storage.step_dir_name(9)).mkdir()
    found = latest_cmd(root, env)
    assert found.returncode == 0 and found.stdout.strip() == str(root / storage.step_dir_name(3))
    assert f"skipped {root / storage.step_dir_name(9)}: no .metadata" in found.stderr

    second = start_process(launcher, [*LAUNCH, "--nproc-per-node", "1", "--checkpoint-root", str(root),
                                      "--resume", "latest", "--", *TINY, "--steps", "4"], env, "local2")
    assert second.wait(150) == [0], second.tail(40)
    out = second.output()
    assert f"skipped {root / storage.step_dir_name(9)}" in out
    assert parse(out, "RTJ_RESUMED") == [{"from": str(root / storage.step_dir_name(3)), "step": "3"}]
    assert [s["step"] for s in parse(out, "RTJ_STEP")] == ["4"]
    assert latest_cmd(tmp_path / "missing", env).returncode == 1


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_workers_die_with_their_launcher(launcher: Launcher, tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import os, pathlib, time\n"
        "pathlib.Path(f\"pid-{os.environ['RANK']}\").write_text(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    run = start_process(launcher, [*LAUNCH, "--nproc-per-node", "2", "--", str(script)], local_env(tmp_path),
                        "sleepers")
    pid_files = [tmp_path / f"pid-{r}" for r in (0, 1)]
    assert wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files), timeout=60), run.tail()
    workers = [int(p.read_text()) for p in pid_files]
    os.kill(run.ranks[0].pid, signal.SIGKILL)  # the launcher only, not its process group
    run.ranks[0].wait(10)
    assert wait_for(lambda: not any(alive(pid) for pid in workers), timeout=5), f"orphaned workers {workers}"


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"
