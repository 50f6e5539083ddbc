"""Fixtures for the trainer tests: a launcher that always kills the process groups it started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.trainer.harness import Launcher


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    lw = Launcher(tmp_path)
    try:
        yield lw
    finally:
        lw.cleanup()


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    lw = Launcher(tmp_path_factory.mktemp("runs"))
    try:
        yield lw
    finally:
        lw.cleanup()
