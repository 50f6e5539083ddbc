"""pytest plugin: the CPU seconds each test cost its lane, the costliest first (`-p e2e.cputime`).

hack/test_lanes.sh runs each lane in a CPU cgroup of its own and names that cgroup's usage file in
`RTJ_LANE_CPU_FILE` (cgroup v1 `cpuacct.usage`, in ns, or v2 `cpu.stat`). Every process the test starts counts
(the session cluster's pods, torch ranks, helpers); real nodes' and kind's nodes, in cgroups of their own, do
not. pytest's `--durations` says how long a test waited; this says what it burnt, which is what a 2-core
machine running two lanes runs out of. Without the variable (or the file) the plugin does nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from pathlib import Path

import pytest

SHOWN = int(os.environ.get("RTJ_LANE_CPU_SHOWN", "40"))
_key = pytest.StashKey[list[tuple[float, float, str]]]()


def usage_seconds(path: Path) -> float:
    """The cgroup's CPU time so far, in seconds (v1 cpuacct.usage or v2 cpu.stat)."""
    text = path.read_text()
    if path.name == "cpu.stat":
        fields = dict(line.split() for line in text.splitlines() if line.strip())
        return int(fields["usage_usec"]) / 1e6
    return int(text.strip()) / 1e9


def _source() -> Path | None:
    name = os.environ.get("RTJ_LANE_CPU_FILE")
    return Path(name) if name and Path(name).is_file() else None


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_key] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    source = _source()
    if source is None:
        return (yield)
    cpu, wall = usage_seconds(source), time.monotonic()
    try:
        return (yield)
    finally:
        item.config.stash[_key].append((usage_seconds(source) - cpu, time.monotonic() - wall, item.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    recorded = config.stash.get(_key, None) or []
    rows = sorted(recorded, reverse=True)
    if not rows:
        return
    total = sum(cpu for cpu, _, _ in rows)
    terminalreporter.section(f"CPU seconds by test (the lane's cgroup: {total:.0f} CPU-s in {len(rows)} tests)")
    for cpu, wall, nodeid in rows[:SHOWN]:
        cores = cpu / max(wall, 1e-9)
        terminalreporter.write_line(f"{cpu:8.1f} CPU-s {wall:7.1f} s wall {cores:5.2f} cores  {nodeid}")
