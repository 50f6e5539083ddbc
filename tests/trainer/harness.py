"""Launch real multi-process torch.distributed runs on 127.0.0.1 and always clean them up.

Each rank is its own subprocess in its own session (process group), so a test can SIGKILL one rank or
all of them, and teardown can kill whatever is left by process group id. Ranks get torchrun's env
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) directly: no agent in between, so a SIGKILL
really kills the worker and nobody restarts it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

EXAMPLE = "resilient_trainer.examples.tiny_gpt"
REPO = Path(__file__).resolve().parents[2]
# Small and fast: the tests check bitwise/ordering properties, not learning.
SMALL_MODEL = ["--d-model", "32", "--layers", "2", "--heads", "2", "--vocab", "67", "--seq-len", "16"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "PET_"))}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        PYTHONPATH=str(REPO / "trainer_image") + os.pathsep + env.get("PYTHONPATH", ""),
        CUDA_VISIBLE_DEVICES="",
        RTJ_TERMINATION_LOG=str(tmp / "termination-log"),
    )
    return env


def parse(text: str, kind: str) -> list[dict[str, str]]:
    """All `KIND k=v ...` lines of one kind (the example's documented output format)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == kind:
            out.append(dict(w.split("=", 1) for w in words[1:] if "=" in w))
    return out


@dataclass
class Run:
    """One multi-rank run; ranks[i] is rank i's Popen, logs[i] its combined stdout/stderr file."""

    ranks: list[subprocess.Popen]
    logs: list[Path]
    started: float = field(default_factory=time.monotonic)

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.ranks:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"ranks still running after {timeout}s:\n{self.tail()}")
        return codes

    def kill(self, sig: int = signal.SIGKILL, ranks: Sequence[int] | None = None) -> None:
        for i, p in enumerate(self.ranks):
            if ranks is not None and i not in ranks:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        if sig == signal.SIGKILL:
            for i, p in enumerate(self.ranks):
                if ranks is None or i in ranks:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=10)

    def output(self, rank: int = 0) -> str:
        return self.logs[rank].read_text(errors="replace")

    def tail(self, lines: int = 25) -> str:
        return "\n".join(
            f"--- rank {i} ---\n" + "\n".join(self.output(i).splitlines()[-lines:]) for i in range(len(self.ranks))
        )


class Launcher:
    """Fixture object: starts runs and kills every process group it started at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.runs: list[Run] = []
        self.counter = 0

    def start(
        self,
        world_size: int,
        args: Sequence[str],
        *,
        module: str = EXAMPLE,
        env: dict[str, str] | None = None,
    ) -> Run:
        self.counter += 1
        port = free_port()
        ranks, logs = [], []
        for rank in range(world_size):
            e = base_env(self.tmp)
            e.update(
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            e.update(env or {})
            log = self.tmp / f"run{self.counter}-rank{rank}.log"
            with open(log, "wb") as f:
                ranks.append(
                    subprocess.Popen(
                        [sys.executable, "-m", module, *args],
                        env=e,
                        cwd=self.tmp,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            logs.append(log)
        run = Run(ranks, logs)
        self.runs.append(run)
        return run

    def run(self, world_size: int, args: Sequence[str], timeout: float = 120, **kw: object) -> Run:
        """Start, wait, and require every rank to exit 0."""
        run = self.start(world_size, args, **kw)  # type: ignore[arg-type]
        codes = run.wait(timeout)
        assert codes == [0] * world_size, f"exit codes {codes}\n{run.tail()}"
        return run

    def cleanup(self) -> None:
        for run in self.runs:
            run.kill(signal.SIGKILL)


def wait_for(predicate: object, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return False


def start_process(launcher: Launcher, cmd: Sequence[str], env: dict[str, str], name: str) -> Run:
    """Start one arbitrary command (e.g. a launcher per simulated node), tracked for cleanup."""
    log = launcher.tmp / f"{name}.log"
    with open(log, "wb") as f:
        p = subprocess.Popen(
            list(cmd), env=env, cwd=launcher.tmp, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    run = Run([p], [log])
    launcher.runs.append(run)
    return run
