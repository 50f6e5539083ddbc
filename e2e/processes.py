"""Stopping the processes the harness starts (control-plane components, registries, containerd)."""

from __future__ import annotations

import subprocess


def terminate(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM, `grace` seconds to exit, then SIGKILL; always reaped (one that already exited is only reaped)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
