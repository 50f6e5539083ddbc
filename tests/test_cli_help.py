"""Every command we ship answers --help with its usage and exits 0 (a newcomer's first command)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLIS = {
    # module: a word its usage must contain
    "resilient_trainer.launch": "--nproc-per-node",
    "resilient_trainer": "latest",
    "resilient_operator": "RTJ_NAMESPACES",
    "e2e.localcluster": "up",
    "e2e.demo": "--real-nodes",
}


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("module", sorted(CLIS))
def test_every_cli_answers_help(module: str, flag: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "RTJ_"))}
    out = subprocess.run([sys.executable, "-m", module, flag], check=False, cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower() and CLIS[module] in out.stdout, out.stdout
    assert "Traceback" not in out.stderr, out.stderr


def test_launch_passes_a_scripts_own_help_through() -> None:
    """`-- train.py --help` is the script's --help, not ours."""
    from resilient_trainer import launch

    assert launch.wants_help(["--help"]) and launch.wants_help(["--nproc-per-node", "2", "--help", "--", "t.py"])
    assert not launch.wants_help(["--", "train.py", "--help"])
    assert not launch.wants_help(["train.py", "--help"])
