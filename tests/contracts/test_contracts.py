"""The contracts both sides import: the env names, the layering rules, the package names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_contract import environment
from resilient_operator.core import render
from tests.operator.builders import job

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> str:
    args = [sys.executable, "-c", code]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_operator_is_the_standard_library() -> None:
    path = run_python("import operator; print(operator.__file__)")
    assert "site-packages" not in path and not path.startswith(str(ROOT)), path
    assert run_python("import operator; print(operator.add(2, 3))") == "5"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tree}/operator:{tree}/trainer_image:{tree}"}
    return subprocess.run([str(lint), "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=120,
                          env=env, check=False)


def test_layer_contracts_hold() -> None:
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("operator/resilient_operator/core/health.py", "import kopf", "never imports the shell"),
        ("operator/resilient_operator/core/capacity.py", "from resilient_operator import kube", "imports the shell"),
        ("trainer_image/resilient_contract/storage/scan.py", "import torch", "imports neither torch"),
        ("trainer_image/resilient_trainer/state.py", "import resilient_operator.core", "never imports the operator"),
    ],
)
def test_layer_contracts_fail_when_violated(tmp_path: Path, module: str, line: str, contract: str) -> None:
    """The contracts are not decoration: a copy of the tree with one forbidden import fails the linter."""
    for part in ("operator", "trainer_image", "e2e"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # injected by the test\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0 and "BROKEN" in out.stdout and contract in out.stdout, out.stdout


def test_env_round_trip() -> None:
    env = environment.WorkerEnv("demo", 2, 3, 1, 8, "demo-a2-0.demo.ml.svc", 29500, "/ckpt", "/ckpt/step-0000000010", 4)
    assert environment.WorkerEnv.from_environ(env.to_environ()) == env
    assert env.world_size == 24
    fresh = environment.WorkerEnv("demo", 1, 4, 0, 1, "a", 29500, "/ckpt")
    assert environment.RESUME_FROM not in fresh.to_environ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({environment.NNODES: ""}, "PET_NNODES is not set"),
        ({environment.NODE_RANK: "4"}, "PET_NODE_RANK=4 must be < PET_NNODES=4"),
        ({environment.ATTEMPT: "zero"}, "RTJ_ATTEMPT='zero' is not an integer"),
        ({environment.CHECKPOINT_ROOT: ""}, "RTJ_CHECKPOINT_ROOT is not set"),
        ({environment.CHECKPOINT_KEEP: "0"}, "RTJ_CHECKPOINT_KEEP=0 must be >= 1"),
    ],
)
def test_env_errors_name_the_variable(change: dict[str, str], message: str) -> None:
    env = environment.WorkerEnv("demo", 1, 4, 0, 1, "a", 29500, "/ckpt").to_environ()
    env.update(change)
    with pytest.raises(environment.ContractError, match=message):
        environment.WorkerEnv.from_environ(env)


def test_rendered_pod_carries_exactly_the_contract() -> None:
    j = job()
    pod = render.pod_manifest(j, 3, 1, 2, None)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    parsed = environment.WorkerEnv.from_environ(env)
    assert (parsed.attempt, parsed.node_rank, parsed.nnodes, parsed.job_name) == (3, 1, 2, "demo")
    assert parsed.master_addr == "demo-a3-0.demo.ml.svc"
    assert set(env) <= set(environment.ALL_NAMES)
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["hostname"] == "demo-a3-1" and pod["spec"]["subdomain"] == "demo"
    assert pod["metadata"]["ownerReferences"][0]["controller"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False  # no API token unless the template asks


def test_checkpoint_keep_travels_from_the_spec_to_the_trainer() -> None:
    """spec.checkpoint.keep is the one place a user sets retention: the pod carries it, the trainer reads it."""

    def pod_env(**spec: object) -> dict[str, str]:
        container = render.pod_manifest(job(**spec), 1, 0, 4, None)["spec"]["containers"][0]
        return {e["name"]: e["value"] for e in container["env"]}

    assert environment.checkpoint_keep(pod_env(checkpoint={"keep": 5})) == 5
    assert environment.checkpoint_keep(pod_env()) == environment.DEFAULT_CHECKPOINT_KEEP == 3  # the CRD's default
    assert environment.checkpoint_keep({}) == 3  # a script run outside the operator


def test_user_env_is_kept_and_contract_names_win() -> None:
    j = job(template={"spec": {"containers": [{"name": "t", "env": [{"name": "MY_FLAG", "value": "1"}],
                                               "envFrom": [{"configMapRef": {"name": "cm"}}]}]}})
    env = {e["name"]: e.get("value") for e in render.pod_manifest(j, 1, 0, 4, None)["spec"]["containers"][0]["env"]}
    assert env["MY_FLAG"] == "1" and env[environment.NNODES] == "4"
    # every contract name is set explicitly (empty on a fresh start): an explicit env wins over envFrom, so a
    # ConfigMap cannot supply RTJ_RESUME_FROM
    assert env[environment.RESUME_FROM] == "" and environment.resume_from(env) is None


def test_contract_names_in_the_template_env_are_refused() -> None:
    j = job(template={"spec": {"containers": [{"name": "t", "env": [
        {"name": "MY_FLAG", "value": "1"}, {"name": environment.RESUME_FROM, "value": "/other/step-9"}]}]}})
    assert j.problem and "spec.template.spec.containers[0].env[1]" in j.problem
    assert environment.RESUME_FROM in j.problem
