"""The README is code: its resilient script runs, its "Convert your script" diff turns the plain FSDP2
example into a script that resumes at 2 -> 2 ranks bitwise and at 2 -> 1 within 1e-5, and every
environment variable a user may set is listed exactly once in the trainer README."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from resilient_contract import completion, environment, storage
from tests.trainer.harness import REPO, Launcher, base_env, start_process

PLAIN = REPO / "trainer_image/resilient_trainer/examples/fsdp2_plain.py"
REL_TOL = 1e-5


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def code_block(text: str, lang: str) -> str:
    match = re.search(rf"```{lang}\n(.*?)```", text, re.S)
    assert match, f"no ```{lang} block"
    return match.group(1)


def apply_unified_diff(original: str, diff: str) -> str:
    """Apply a unified diff; every context and removed line must match exactly."""
    old = original.splitlines()
    out: list[str] = []
    pos = 0
    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        header = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", lines[i])
        i += 1
        if not header:
            continue
        start = int(header.group(1)) - 1
        out.extend(old[pos:start])
        pos = start
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, body = lines[i][:1], lines[i][1:]
            if tag in (" ", "-"):
                assert old[pos] == body, f"diff does not apply at line {pos + 1}: {old[pos]!r} != {body!r}"
                pos += 1
            if tag in (" ", "+"):
                out.append(body)
            i += 1
    out.extend(old[pos:])
    return "\n".join(out) + "\n"


def local_env(tmp: Path) -> dict[str, str]:
    env = base_env(tmp)
    env.pop(completion.TERMINATION_LOG_ENV)
    return env


def launch(launcher: Launcher, tmp: Path, name: str, nproc: int, root: Path, script: list[str],
           resume: bool = False) -> str:
    cmd = [sys.executable, "-m", "resilient_trainer.launch", "--nproc-per-node", str(nproc),
           "--checkpoint-root", str(root), *(["--resume", "latest"] if resume else []), "--", *script]
    run = start_process(launcher, cmd, local_env(tmp), name)
    assert run.wait(150) == [0], run.tail(40)
    return run.output()


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    return (num / sum(float(a[k].double().pow(2).sum()) for k in a)) ** 0.5


def test_every_user_variable_is_listed_once() -> None:
    text = section((REPO / "trainer_image/README.md").read_text(), "The API")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for name in (*environment.ALL_NAMES, completion.TERMINATION_LOG_ENV):
        assert sum(f"`{name}`" in row.split("|")[1] for row in rows) == 1, name
    assert "absolute" in next(r for r in rows if f"`{environment.CHECKPOINT_ROOT}`" in r)


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_readme_script_runs_locally(launcher: Launcher, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(code_block(section((REPO / "README.md").read_text(), "Make your training script resilient"),
                                 "python"))
    root = tmp_path / "ckpt"
    launch(launcher, tmp_path, "readme", 2, root, [str(script)])
    latest = storage.scan(storage.open_store(str(root)), storage.UNBOUNDED_SCAN).latest
    assert latest is not None and latest.step == 20
    assert completion.read_completed_marker(str(root)) == {"kind": completion.SUCCEEDED, "step": "20",
                                                           "world_size": "2"}


@pytest.mark.multiproc
@pytest.mark.timeout(400)
def test_converted_fsdp2_script_resumes_at_any_world_size(launcher: Launcher, tmp_path: Path) -> None:
    diff = code_block(section((REPO / "README.md").read_text(), "Convert your script"), "diff")
    converted = tmp_path / "train.py"
    converted.write_text(apply_unified_diff(PLAIN.read_text(), diff))
    changed = sum(1 for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))
    print(f"conversion: {changed} changed lines (+/-) in the README diff")
    data = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 256, size=16 * 37 + 1, dtype=np.uint16).tofile(data)  # 37 samples
    common = ["--data", str(data), "--batch-size", "8", "--micro-batch", "2"]

    launch(launcher, tmp_path, "reference", 2, tmp_path / "ref",
           [str(converted), *common, "--steps", "9", "--out", str(tmp_path / "ref.pt")])
    launch(launcher, tmp_path, "first", 2, tmp_path / "first", [str(converted), *common, "--steps", "4"])
    results = {}
    for nproc in (2, 1):
        root = tmp_path / f"resume-{nproc}"
        shutil.copytree(tmp_path / "first", root)
        out = launch(launcher, tmp_path, f"resume{nproc}", nproc, root,
                     [str(converted), *common, "--steps", "9", "--out", str(tmp_path / f"r{nproc}.pt")], resume=True)
        assert f"resuming from {root / storage.step_dir_name(4)}" in out
        assert [line.split()[1] for line in out.splitlines() if line.startswith("step ")] == [
            str(s) for s in range(5, 10)
        ]
        results[nproc] = torch.load(tmp_path / f"r{nproc}.pt", weights_only=True)
    reference = torch.load(tmp_path / "ref.pt", weights_only=True)
    for key in reference:  # 2 -> 2: bitwise
        assert torch.equal(reference[key].view(torch.uint8), results[2][key].view(torch.uint8)), key
    diff_1 = rel_diff(reference, results[1])
    print(f"2 -> 1 ranks: relative parameter difference {diff_1:.2e}")
    assert diff_1 <= REL_TOL
