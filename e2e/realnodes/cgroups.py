"""A real node's cgroups: one tree per node under `/rtj/<cluster>/<node>` in every v1 hierarchy.

The kubelet runs its pods under that root (cgroupRoot, driver cgroupfs); containerd, its shims and the
kubelet itself sit in `<root>/runtime` of the freezer hierarchy, so `kill_all` can stop the whole
machine at once, containers and shims included (shims daemonize: no process tree reaches them).
This host is cgroup v1 hybrid (`/sys/fs/cgroup/<controller>` plus `unified`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
PREFIX = "rtj"


def hierarchies() -> list[Path]:
    """Mounted v1 hierarchies (and the v2 `unified` one): every directory holding `cgroup.procs`."""
    return sorted(p for p in CGROUP_FS.iterdir() if (p / "cgroup.procs").exists() and not p.is_symlink())


def node_root(cluster_netns: str, node: str) -> str:
    """The kubelet's cgroupRoot for `node` of the cluster whose namespace is `cluster_netns`."""
    return f"/{PREFIX}/{cluster_netns}/{node}"


def _mkdir(hierarchy: Path, rel: str) -> None:
    path = hierarchy
    for part in rel.strip("/").split("/"):
        parent, path = path, path / part
        if path.exists():
            continue
        path.mkdir()
        for f in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset child starts empty: tasks could not join
            if (parent / f).exists():
                (path / f).write_text((parent / f).read_text())


def create(rel: str) -> None:
    """Create `rel` (and its `runtime` child) in every hierarchy: the kubelet insists its root exists."""
    for h in hierarchies():
        _mkdir(h, rel)
        _mkdir(h, f"{rel}/runtime")


def join_runtime(rel: str, pid: int) -> None:
    """Put `pid` (containerd, kubelet) into `<rel>/runtime` of the freezer hierarchy; children follow."""
    (CGROUP_FS / "freezer" / rel.strip("/") / "runtime" / "cgroup.procs").write_text(str(pid))


def pids(rel: str) -> list[int]:
    """Every process in `rel` or below, read from the freezer hierarchy."""
    base = CGROUP_FS / "freezer" / rel.strip("/")
    found: list[int] = []
    for dirpath, _, files in os.walk(base):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                found += [int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split()]
    return found


def kill_all(rel: str) -> None:
    """Freeze the node's tree, SIGKILL every process in it, thaw (the kills land); see `wait_empty`."""
    state = CGROUP_FS / "freezer" / rel.strip("/") / "freezer.state"
    if not state.exists():
        return
    state.write_text("FROZEN")
    deadline = time.monotonic() + 5
    while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in pids(rel):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    state.write_text("THAWED")


def wait_empty(rel: str, timeout: float = 20) -> None:
    """Wait until no process is left in `rel` (the caller reaps its own children first)."""
    deadline = time.monotonic() + timeout
    while left := pids(rel):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes left in cgroup {rel}: {left}")
        time.sleep(0.05)


def remove(rel: str) -> None:
    """rmdir `rel` bottom-up in every hierarchy (after `kill_all`), then its empty parents under /rtj."""
    for h in hierarchies():
        base = h / rel.strip("/")
        if base.exists():
            for dirpath, _, _ in sorted(os.walk(base), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
        parent = base.parent
        while parent != h and parent.name:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


def leftovers(cluster_netns: str) -> list[str]:
    """Cgroup directories of this cluster that still exist (for the tests' clean-teardown check)."""
    return [str(h / PREFIX / cluster_netns) for h in hierarchies() if (h / PREFIX / cluster_netns).exists()]


def cleanup_stale(live_netns: list[str]) -> list[str]:
    """Kill and remove the node cgroups of clusters whose network namespace is gone (a SIGKILLed run)."""
    removed = []
    base = CGROUP_FS / "freezer" / PREFIX
    for cluster in sorted(base.iterdir()) if base.exists() else []:
        if cluster.is_dir() and cluster.name not in live_netns:
            for node in [n for n in cluster.iterdir() if n.is_dir()]:
                rel = f"/{PREFIX}/{cluster.name}/{node.name}"
                kill_all(rel)
                with contextlib.suppress(TimeoutError):
                    wait_empty(rel, timeout=10)
                remove(rel)
            remove(f"/{PREFIX}/{cluster.name}")
            removed.append(cluster.name)
    return removed
