"""The launcher's hang watchdog and progress reports, driven by a fake clock over real rank files."""

from __future__ import annotations

from pathlib import Path

import pytest

from resilient_contract import completion, environment, progress
from resilient_trainer import launch

T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, timeout: float | None, monkeypatch: pytest.MonkeyPatch) -> tuple[launch.Watchdog, Clock,
                                                                                          list[str]]:
    env = environment.WorkerEnv(job_name="demo", attempt=2, nnodes=2, node_rank=1, nproc_per_node=2,
                                master_addr="m", master_port=1, checkpoint_root=str(tmp_path / "ckpt"),
                                resume_from=str(tmp_path / "ckpt" / "step-0000000040"))
    monkeypatch.setenv(completion.TERMINATION_LOG_ENV, str(tmp_path / "termination-log"))
    monkeypatch.setenv("HOSTNAME", "demo-a2-1")
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    killed: list[str] = []
    clock = Clock()
    dog = launch.Watchdog(env, str(ranks), timeout, clock=clock, on_hang=lambda: killed.append("killed"))
    return dog, clock, killed


def step(tmp_path: Path, rank: int, n: int, seconds: float, at: float) -> None:
    progress.write_rank(str(tmp_path / "ranks"), rank, n, seconds, at)


def test_a_rank_that_stops_is_a_hang_naming_it_and_its_last_step(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    dog, clock, killed = make(tmp_path, 10, monkeypatch)
    for n in range(41, 45):  # ranks 2 and 3 (node rank 1 x 2 procs) step once a second...
        step(tmp_path, 2, n, 1.0, T0 + n - 40)
        step(tmp_path, 3, n if n < 43 else 42, 1.0, T0 + min(n, 42) - 40)  # ...until rank 3 stops after 42
    clock.now = T0 + 11.9
    dog.check()
    assert not killed  # rank 3's last step was at T0+2: 9.9 s ago
    clock.now = T0 + 12.1
    dog.check()
    assert killed == ["killed"]
    outcome = completion.read_termination_message(str(tmp_path / "termination-log"))
    assert outcome and outcome.kind == completion.HUNG
    assert outcome.fields["step"] == "42" and outcome.fields["rank"] == "3" and outcome.fields["attempt"] == "2"
    # ...and in the pod's progress report, where the operator reads an in-place agent's verdict
    report = progress.read_report(str(tmp_path / "ckpt"), "demo-a2-1")
    assert report is not None and report.hung == progress.Hang(step=42, rank=3, stalled_seconds=10.1,
                                                               timeout_seconds=10)
    assert dog.hang_reported
    dog.check()
    assert killed == ["killed"]  # declared once


def test_slow_but_progressing_is_never_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dog, clock, killed = make(tmp_path, 10, monkeypatch)
    for n in range(1, 20):  # a step every 8 s: slow, but always within the timeout
        clock.now = T0 + 8 * n
        step(tmp_path, 2, 40 + n, 8.0, clock.now)
        step(tmp_path, 3, 40 + n, 8.0, clock.now)
        clock.now += 7.9
        dog.check()
    assert not killed


def test_no_first_step_counts_from_launch_with_room_for_the_load(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    dog, clock, killed = make(tmp_path, 30, monkeypatch)
    clock.now = T0 + 30 * launch.FIRST_STEP_TIMEOUTS - 1
    dog.check()
    assert not killed
    clock.now = T0 + 30 * launch.FIRST_STEP_TIMEOUTS + 1
    dog.check()
    outcome = completion.read_termination_message(str(tmp_path / "termination-log"))
    assert killed and outcome and outcome.fields["step"] == "40"  # the step it resumed from


def test_without_a_timeout_it_only_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dog, clock, killed = make(tmp_path, None, monkeypatch)
    step(tmp_path, 2, 41, 0.5, T0 + 1)
    step(tmp_path, 3, 41, 2.5, T0 + 1)
    clock.now = T0 + 3600
    dog.check()
    assert not killed
    report = progress.read_report(str(tmp_path / "ckpt"), "demo-a2-1")
    assert report == progress.Report(pod="demo-a2-1", attempt=2, step=41, time=T0 + 3600, first_step_at=T0 + 1,
                                     step_seconds=2.5, slowest_rank=3)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'{"pod": "other", "attempt": 1, "step": 1, "time": 1}',
                                 b'{"pod": "p", "attempt": "1", "step": 1, "time": 1}',
                                 b'{"pod": "p", "attempt": 1, "step": -1, "time": 1}',
                                 b'{"pod": "p", "attempt": 1, "step": 1, "time": 1, "pad": "' + b"x" * 5000 + b'"}'])
def test_hostile_reports_are_ignored(raw: bytes) -> None:
    assert progress.parse_report(raw, "p") is None


@pytest.mark.parametrize("hung", ['"yes"', "[]", '{"step": 1}', '{"step": -1, "rank": 0, "stalledSeconds": 1, '
                                  '"timeoutSeconds": 1}', '{"step": 1, "rank": 1e400, "stalledSeconds": 1, '
                                  '"timeoutSeconds": 1}', '{"step": 1, "rank": 0, "stalledSeconds": "1", '
                                  '"timeoutSeconds": 1}'])
def test_a_hostile_hang_verdict_is_no_verdict(hung: str) -> None:
    """The report stands (its step is still progress); the verdict that is not one is dropped."""
    report = progress.parse_report(f'{{"pod": "p", "attempt": 1, "step": 1, "time": 1, "hung": {hung}}}'.encode(),
                                   "p")
    assert report is not None and report.step == 1 and report.hung is None


def test_report_reader_does_not_follow_links(tmp_path: Path) -> None:
    (tmp_path / progress.DIRNAME).mkdir()
    secret = tmp_path / "secret.json"
    secret.write_text('{"pod": "p", "attempt": 1, "step": 5, "time": 1}')
    (tmp_path / progress.DIRNAME / "p.json").symlink_to(secret)
    assert progress.read_report(str(tmp_path), "p") is None
