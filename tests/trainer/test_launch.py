"""The launcher maps the env contract onto torchrun exactly, and a 2-node x 2-process run works."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch.distributed.run import parse_args

from resilient_contract import completion, environment
from resilient_trainer import launch
from tests.trainer.harness import SMALL_MODEL, Launcher, base_env, free_port, parse, start_process

ENV = environment.WorkerEnv(
    job_name="demo", attempt=3, nnodes=2, node_rank=1, nproc_per_node=4, master_addr="demo-3-0.demo",
    master_port=29400, checkpoint_root="/ckpt", resume_from="/ckpt/step-0000000100",
)


def test_torchrun_args_map_the_contract() -> None:
    argv = launch.torchrun_args(ENV, ["--log-dir=/tmp/x"], ["-m", "pkg.train", "--steps", "5"])
    assert argv == [
        "--nnodes=2", "--nproc-per-node=4", "--node-rank=1", "--master-addr=demo-3-0.demo",
        "--master-port=29400", "--rdzv-backend=static", "--rdzv-id=demo-3", "--max-restarts=0",
        "--log-dir=/tmp/x", "-m", "resilient_trainer.worker", "-m", "pkg.train", "--steps", "5",
    ]
    args = parse_args(argv)  # torchrun itself reads it back as intended
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "4", 1)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == ("demo-3-0.demo", 29400, "static")
    assert args.max_restarts == 0 and args.module and args.training_script == "resilient_trainer.worker"
    assert args.training_script_args == ["-m", "pkg.train", "--steps", "5"]  # the shim runs the user's module


def test_env_round_trip_through_contract() -> None:
    assert environment.WorkerEnv.from_environ(ENV.to_environ()) == ENV


def test_split_argv() -> None:
    assert launch.split_argv(["--log-dir=x", "--", "train.py", "--", "a"]) == (["--log-dir=x"], ["train.py", "--", "a"])
    assert launch.split_argv(["train.py", "-v"]) == ([], ["train.py", "-v"])


def test_partial_contract_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """With no operator variables at all the launcher runs locally; a half-injected contract is an error."""
    for name in environment.ALL_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.JOB_NAME, "demo")
    assert launch.main(["--", "train.py"]) == 2
    assert environment.NNODES in capsys.readouterr().err
    assert launch.is_local({}) and not launch.is_local({environment.NNODES: "2"})


def node_env(tmp: Path, node_rank: int, port: int, attempt: int = 1, nnodes: int = 2, nproc: int = 2) -> dict:
    env = base_env(tmp)
    env.update(
        environment.WorkerEnv(
            job_name="t", attempt=attempt, nnodes=nnodes, node_rank=node_rank, nproc_per_node=nproc,
            master_addr="127.0.0.1", master_port=port, checkpoint_root=str(tmp / "ckpt"),
        ).to_environ()
    )
    env[completion.TERMINATION_LOG_ENV] = str(tmp / f"termination-log-{node_rank}")
    return env


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_two_nodes_two_processes(launcher: Launcher, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "resilient_trainer.launch", "--", "-m", "resilient_trainer.examples.tiny_gpt",
           *SMALL_MODEL, "--steps", "3", "--global-batch", "8", "--checkpoint-every", "2"]
    nodes = [start_process(launcher, cmd, node_env(tmp_path, r, port), f"node{r}") for r in (0, 1)]
    codes = [n.wait(150)[0] for n in nodes]
    assert codes == [0, 0], "\n".join(n.tail(40) for n in nodes)
    out = nodes[0].output()
    assert parse(out, "RTJ_START")[0]["world_size"] == "4"
    assert parse(out, "RTJ_RESULT")[0]["step"] == "3"
    for r in (0, 1):
        outcome = completion.read_termination_message(str(tmp_path / f"termination-log-{r}"))
        assert outcome is not None and outcome.succeeded and outcome.fields["attempt"] == "1"


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_recorded_success_beats_exit_code(launcher: Launcher, tmp_path: Path) -> None:
    """A worker that records success then aborts at exit (gloo's `terminate called...`) still succeeds;
    one that only fails does not, and a stale message from another attempt is ignored."""
    script = tmp_path / "worker.py"
    script.write_text(
        "import os, sys\n"
        "from resilient_contract import completion\n"
        "if sys.argv[1] == 'ok':\n"
        "    completion.write_termination_message(completion.SUCCEEDED, attempt=os.environ['RTJ_ATTEMPT'])\n"
        "os._exit(1)\n"
    )
    for mode, attempt, expected in (("ok", 1, 0), ("fail", 1, 1)):
        env = node_env(tmp_path, 0, free_port(), attempt=attempt, nnodes=1, nproc=1)
        if mode == "fail":  # stale success from attempt 0 left in the file
            Path(env[completion.TERMINATION_LOG_ENV]).write_text("RTJ_SUCCEEDED attempt=0\n")
        scratch = tmp_path / f"tmp-{mode}"  # the launcher's own temporary files: none left behind
        scratch.mkdir()
        env["TMPDIR"] = str(scratch)
        run = start_process(launcher, [sys.executable, "-m", "resilient_trainer.launch", "--", str(script), mode],
                            env, f"exit-{mode}")
        assert run.wait(100) == [expected], run.tail()
        assert not list(scratch.glob("rtj-progress-*"))
