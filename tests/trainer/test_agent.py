"""The launcher as the pod's agent: signed plans switch attempts in place, with real launchers, torchrun and gloo.

Each simulated pod is one `resilient_trainer.launch` process on loopback with its own `$RTJ_POD_UID` and a
real Ed25519 key. The workers run SCRIPT: it records every start (pod, attempt, pid, rank, world size, resume
point) and holds a lock for its whole life, so a worker of a later attempt that finds an earlier attempt's
lock still held proves two generations overlapped. `python -m tests.trainer.test_agent` measures plan ->
new workers running, with and without the parked (pre-imported) next generation.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from resilient_contract import completion, environment, plan, progress
from resilient_trainer import agent, launch
from tests.trainer.harness import Launcher, Run, base_env, free_port, start_process, wait_for

KEY = plan.new_private_key()
JOB_UID = "job-1"
LAUNCH = [sys.executable, "-m", "resilient_trainer.launch", "--"]

SCRIPT = '''
import fcntl, json, os, signal, sys, time
from pathlib import Path

t0 = time.time()
out = Path(os.environ["AGENT_TEST_DIR"])
pod, attempt = os.environ["RTJ_POD_UID"], os.environ["RTJ_ATTEMPT"]
mine = out / f"held-{pod}-a{attempt}-{os.getpid()}"
held = os.open(mine, os.O_CREAT | os.O_RDWR)
fcntl.flock(held, fcntl.LOCK_EX)  # held until this process dies, however it dies
overlap = []
for other in out.glob(f"held-{pod}-a*"):
    if other.name.startswith(f"held-{pod}-a{attempt}-"):
        continue
    fd = os.open(other, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        overlap.append(other.name)
    finally:
        os.close(fd)

def record(event, **fields):
    line = json.dumps({"event": event, "pod": pod, "attempt": int(attempt), "pid": os.getpid(), **fields})
    with open(out / "events", "a") as f:
        f.write(line + "\\n")

record("start", time=t0, rank=os.environ["RANK"], world_size=os.environ["WORLD_SIZE"],
       resume_from=os.environ.get("RTJ_RESUME_FROM"), overlap=overlap)
mode = os.environ.get(f"AGENT_TEST_MODE_{attempt}", "finish")
if mode == "fail":
    sys.exit(3)  # the script's own error
if mode == "peer":  # what gloo raises when a peer's node is gone (test_worker_peer shows the real one)
    raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.9]:4567")
def steps(count=10**6):  # progress for the launcher's watchdog, as a training loop would make
    from resilient_contract import progress
    for n in range(1, count + 1):
        progress.write_rank(os.environ[progress.RANK_DIR_ENV], int(os.environ["RANK"]), n, 0.2, time.time())
        time.sleep(0.2)

if mode == "hang":  # one step, then stuck
    steps(1)
    time.sleep(3600)

import threading
threading.Thread(target=steps, daemon=True).start()
if os.environ.get(f"AGENT_TEST_IGNORE_TERM_{attempt}"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
record("ready", total=int(total.item()), time=time.time())
if mode == "wait":
    while True:
        time.sleep(1)
while mode == "loop":  # training: collectives until a peer goes away
    dist.all_reduce(torch.ones(1))
    time.sleep(0.05)
dist.destroy_process_group()
record("done", total=int(total.item()))
if os.environ.get("AGENT_TEST_FAST_EXIT"):  # no interpreter teardown: a loaded machine can stall it for seconds
    os._exit(0)
'''


def pod_env(tmp: Path, pod: str, *, port: int, agent_port: int, node_rank: int = 0, nnodes: int = 1,
            nproc: int = 1, attempt: int = 1, **extra: str) -> dict[str, str]:
    env = base_env(tmp)
    env.update(environment.WorkerEnv(
        job_name="t", attempt=attempt, nnodes=nnodes, node_rank=node_rank, nproc_per_node=nproc,
        master_addr="127.0.0.1", master_port=port, checkpoint_root=str(tmp / "ckpt"), job_uid=JOB_UID,
    ).to_environ())
    env.update({
        plan.AGENT_PORT_ENV: str(agent_port), plan.PUBLIC_KEY_ENV: plan.public_key(KEY), plan.POD_UID_ENV: pod,
        completion.TERMINATION_LOG_ENV: str(tmp / f"termination-log-{pod}"), "AGENT_TEST_DIR": str(tmp),
        agent.LINGER_ENV: "60",
    })
    env.update(extra)
    return env


def start_pod(launcher: Launcher, tmp: Path, pod: str, torchrun: tuple[str, ...] = (), **kw: Any) -> tuple[Run, int]:
    """One agent process; returns it once its HTTP server answers."""
    agent_port = free_port()
    script = tmp / "script.py"
    script.write_text(SCRIPT)
    cmd = [*LAUNCH[:-1], *torchrun, "--", str(script)]
    run = start_process(launcher, cmd, pod_env(tmp, pod, agent_port=agent_port, **kw), pod)
    assert wait_for(lambda: health(agent_port) is not None or run.ranks[0].poll() is not None, 60), run.tail()
    assert run.ranks[0].poll() is None, run.tail()
    return run, agent_port


def health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{agent.HEALTH_PATH}", timeout=5) as answer:
            return dict(json.load(answer))
    except OSError:
        return None


def post(port: int, body: bytes, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{plan.PATH}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, dict(json.load(answer))
    except urllib.error.HTTPError as err:
        return err.code, dict(json.load(err))


def signed(pod: str, attempt: int, *, port: int, nnodes: int = 1, node_rank: int = 0, resume_from: str = "",
           key: bytes = KEY, job_uid: str = JOB_UID, master_agent_port: int = 0) -> bytes:
    return plan.sign(plan.Plan(job_uid=job_uid, pod_uid=pod, attempt=attempt, nnodes=nnodes, node_rank=node_rank,
                               master_addr="127.0.0.1", master_port=port, resume_from=resume_from,
                               master_agent_port=master_agent_port), key)


def events(tmp: Path, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
    path = tmp / "events"
    lines = path.read_text().splitlines() if path.exists() else []
    found = [json.loads(line) for line in lines]
    return [e for e in found if (event is None or e["event"] == event)
            and all(e.get(k) == v for k, v in match.items())]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def no_overlap(tmp: Path) -> None:
    starts = events(tmp, "start")
    assert starts and not [e for e in starts if e["overlap"]], starts


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_survivor_switches_to_a_smaller_world(launcher: Launcher, tmp_path: Path) -> None:
    """2 pods in a loop of collectives -> one is killed -> the survivor's worker fails on the lost peer and its
    agent lingers; a plan for attempt 2 (world 1) runs new workers that see the plan's environment and finish;
    the launcher exits 0."""
    port1, port2 = free_port(), free_port()
    modes = {"AGENT_TEST_MODE_1": "loop"}
    a, a_port = start_pod(launcher, tmp_path, "pod-a", port=port1, nnodes=2, node_rank=0, **modes)
    b, _ = start_pod(launcher, tmp_path, "pod-b", port=port1, nnodes=2, node_rank=1, **modes)
    assert wait_for(lambda: len(events(tmp_path, "ready", attempt=1)) == 2, 120), a.tail() + b.tail()
    assert {e["total"] for e in events(tmp_path, "ready")} == {3}
    old = events(tmp_path, "start", pod="pod-a")[0]["pid"]
    b.kill(signal.SIGKILL)  # the lost node: its launcher's process group (each generation has its own)
    b_worker = events(tmp_path, "start", pod="pod-b")[0]["pid"]
    assert wait_for(lambda: not alive(b_worker), 10), "a worker outlived its agent"
    assert wait_for(lambda: (health(a_port) or {}).get("state") == agent.LINGERING, 90), a.tail()

    resume = str(tmp_path / "ckpt" / "step-0000000005")
    assert post(a_port, signed("pod-a", 2, port=port2, resume_from=resume)) == (200, {"attempt": 2,
                                                                                      "state": "started"})
    assert not alive(old)
    assert a.wait(120) == [0], a.tail()
    (start,) = events(tmp_path, "start", attempt=2)
    assert (start["pod"], start["rank"], start["world_size"], start["resume_from"]) == ("pod-a", "0", "1", resume)
    assert [e["total"] for e in events(tmp_path, "done")] == [1]
    no_overlap(tmp_path)


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_two_survivors_swap_ranks(launcher: Launcher, tmp_path: Path) -> None:
    """2 -> 2 with the node ranks swapped, on the same rendezvous port (the store's old socket must not be in
    the way): both pods switch in place and finish."""
    port1 = port2 = free_port()
    modes = {"AGENT_TEST_MODE_1": "wait"}
    pods = {name: start_pod(launcher, tmp_path, name, port=port1, nnodes=2, node_rank=rank, **modes)
            for rank, name in enumerate(("pod-a", "pod-b"))}
    assert wait_for(lambda: len(events(tmp_path, "ready", attempt=1)) == 2, 120), pods["pod-a"][0].tail()
    # pod-a (the old store's host) first: on one loopback address pod-b could not listen on the port before
    # pod-a's old store is gone (pods have their own addresses in a cluster)
    for name, new_rank in (("pod-a", 1), ("pod-b", 0)):
        assert post(pods[name][1], signed(name, 2, port=port2, nnodes=2, node_rank=new_rank))[0] == 200
    for run, _ in pods.values():
        assert run.wait(120) == [0], run.tail()
    ranks = {e["pod"]: (e["rank"], e["world_size"]) for e in events(tmp_path, "start", attempt=2)}
    assert ranks == {"pod-a": ("1", "2"), "pod-b": ("0", "2")}
    assert [e["total"] for e in events(tmp_path, "done")] == [3, 3]
    no_overlap(tmp_path)


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_a_rank_waits_for_the_rendezvous_hosts_agent_before_starting(launcher: Launcher, tmp_path: Path) -> None:
    """The plans reach rank 1 before rank 0, on the same rendezvous port: rank 1's agent stops its workers
    but starts the new torchrun only once rank 0's agent runs attempt 2 (before, it could meet rank 0's old
    store, which then went away under it: a failed attempt). Both switch and finish."""
    port = free_port()
    modes = {"AGENT_TEST_MODE_1": "wait"}
    pods = {name: start_pod(launcher, tmp_path, name, port=port, nnodes=2, node_rank=rank, **modes)
            for rank, name in enumerate(("pod-a", "pod-b"))}
    assert wait_for(lambda: len(events(tmp_path, "ready", attempt=1)) == 2, 120), pods["pod-a"][0].tail()
    host_agent = pods["pod-a"][1]
    answers: list[int] = []
    early = threading.Thread(target=lambda: answers.append(post(pods["pod-b"][1], signed(
        "pod-b", 2, port=port, nnodes=2, node_rank=1, master_agent_port=host_agent))[0]))
    early.start()
    assert not wait_for(lambda: answers, 1.0)  # rank 1 waits while the host runs attempt 1
    assert (health(pods["pod-b"][1]) or {}).get("attempt") == 1 and not events(tmp_path, "start", attempt=2)
    assert post(host_agent, signed("pod-a", 2, port=port, nnodes=2, node_rank=0))[0] == 200
    early.join(30)
    assert answers == [200]
    for run, _ in pods.values():
        assert run.wait(120) == [0], run.tail()
    assert sorted(e["pod"] for e in events(tmp_path, "start", attempt=2)) == ["pod-a", "pod-b"]
    assert "starting anyway" not in pods["pod-b"][0].tail()
    no_overlap(tmp_path)


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_foreign_stale_and_malformed_plans_are_refused(launcher: Launcher, tmp_path: Path) -> None:
    """Another key, pod or job: 403; an older attempt: 409; junk: 400; a slow client blocks nobody. The running
    workers are untouched; SIGTERM then ends the pod as today."""
    port = free_port()
    run, agent_port = start_pod(launcher, tmp_path, "pod-a", port=port, attempt=3, AGENT_TEST_MODE_3="wait")
    assert wait_for(lambda: events(tmp_path, "ready"), 90), run.tail()
    worker = events(tmp_path, "start")[0]["pid"]

    slow = socket.create_connection(("127.0.0.1", agent_port))  # never finishes its request
    slow.sendall(b"POST /plan HTTP/1.1\r\nContent-Length: 100\r\n")
    try:
        t0 = time.monotonic()
        other_key = plan.new_private_key()
        assert post(agent_port, signed("pod-a", 4, port=port, key=other_key))[0] == 403
        assert post(agent_port, signed("pod-b", 4, port=port))[0] == 403
        assert post(agent_port, signed("pod-a", 4, port=port, job_uid="job-2"))[0] == 403
        assert post(agent_port, signed("pod-a", 2, port=port))[0] == 409
        assert post(agent_port, signed("pod-a", 3, port=port)) == (200, {"attempt": 3, "state": "started"})
        assert post(agent_port, b'{"plan": 1}')[0] == 400
        with socket.create_connection(("127.0.0.1", agent_port), timeout=10) as big:  # refused unread
            big.sendall(b"POST /plan HTTP/1.1\r\nContent-Length: 100000\r\n\r\n")
            assert big.recv(100).startswith(b"HTTP/1.0 400")
        assert {k: v for k, v in (health(agent_port) or {}).items() if k != "prewarmed"} == {
            "attempt": 3, "state": agent.RUNNING}
        assert time.monotonic() - t0 < 20
    finally:
        slow.close()
    assert alive(worker) and len(events(tmp_path, "start")) == 1  # untouched

    t0 = time.monotonic()
    os.kill(run.ranks[0].pid, signal.SIGTERM)  # pod deletion
    assert run.wait(60) == [128 + signal.SIGTERM], run.tail()
    assert time.monotonic() - t0 < 40  # no linger after SIGTERM (torchrun's own stop, as today)
    assert not alive(worker)


@pytest.mark.multiproc
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("mode", "code", "message"), [("peer", 1, None)])
def test_a_lost_peer_lingers_then_exits_with_its_status(launcher: Launcher, tmp_path: Path, mode: str,
                                                        code: int, message: str | None) -> None:
    """No plan within the linger: the plain launcher's exit status and termination message, only later."""
    run, agent_port = start_pod(launcher, tmp_path, "pod-a", port=free_port(), AGENT_TEST_MODE_1=mode,
                                **{agent.LINGER_ENV: "2", progress.TIMEOUT_ENV: "4"})
    assert wait_for(lambda: (health(agent_port) or {}).get("state") == agent.LINGERING
                    or run.ranks[0].poll() is not None, 90), run.tail()
    lingering = time.monotonic()
    assert run.wait(60) == [code], run.tail()
    assert time.monotonic() - lingering > 1
    outcome = completion.read_termination_message(str(tmp_path / "termination-log-pod-a"))
    assert (outcome.kind if outcome else None) == message


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_a_script_error_ends_the_pod_at_once(launcher: Launcher, tmp_path: Path) -> None:
    """The script's own failure is not a lost peer: no linger, the plain launcher's status at once."""
    run, _ = start_pod(launcher, tmp_path, "pod-a", port=free_port(), AGENT_TEST_MODE_1="fail",
                       **{agent.LINGER_ENV: "120"})
    assert run.wait(60) == [1], run.tail()
    assert "waiting" not in run.output()


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_a_hang_keeps_the_pod_with_its_verdict_in_the_report_until_the_next_plan(launcher: Launcher,
                                                                                 tmp_path: Path) -> None:
    """The watchdog kills the hung generation and writes its verdict into the pod's progress report, where
    the operator reads it; the pod stays (lingers) and the next plan starts the next attempt in it."""
    run, agent_port = start_pod(launcher, tmp_path, "pod-a", port=free_port(), AGENT_TEST_MODE_1="hang",
                                HOSTNAME="pod-a", AGENT_TEST_FAST_EXIT="1",  # attempt 2 makes no step to watch
                                **{agent.LINGER_ENV: "120", progress.TIMEOUT_ENV: "4"})
    assert wait_for(lambda: (health(agent_port) or {}).get("state") == agent.LINGERING
                    or run.ranks[0].poll() is not None, 90), run.tail()
    assert run.ranks[0].poll() is None, run.tail()
    report = progress.read_report(str(tmp_path / "ckpt"), "pod-a")
    assert report is not None and report.hung is not None, report
    assert (report.attempt, report.hung.step, report.hung.rank, report.hung.timeout_seconds) == (1, 1, 0, 4)
    assert report.hung.stalled_seconds >= 4
    hung_worker = events(tmp_path, "start", attempt=1)[0]["pid"]
    assert not alive(hung_worker)
    assert post(agent_port, signed("pod-a", 2, port=free_port())) == (200, {"attempt": 2, "state": "started"})
    assert run.wait(90) == [0], run.tail()
    assert completion.read_termination_message(str(tmp_path / "termination-log-pod-a")) is None
    no_overlap(tmp_path)


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_a_hang_without_a_report_ends_the_pod_at_once(launcher: Launcher, tmp_path: Path) -> None:
    """When the verdict cannot reach the checkpoint root (here a file where the report directory goes; an
    s3:// root has no reports), the pod ends with RTJ_HUNG at once, without lingering: the operator's
    other way to learn of a hang."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / progress.DIRNAME).write_text("not a directory")
    run, _ = start_pod(launcher, tmp_path, "pod-a", port=free_port(), AGENT_TEST_MODE_1="hang", HOSTNAME="pod-a",
                       **{agent.LINGER_ENV: "120", progress.TIMEOUT_ENV: "4"})
    assert run.wait(90) == [launch.HUNG_EXIT_CODE], run.tail()
    outcome = completion.read_termination_message(str(tmp_path / "termination-log-pod-a"))
    assert outcome is not None and outcome.kind == completion.HUNG
    assert "waiting" not in run.output()


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_a_script_never_runs_twice_at_once(launcher: Launcher, tmp_path: Path) -> None:
    """Three plans in a row on a 2-process pod, one generation ignoring SIGTERM (so SIGKILL ends it), each
    sent as soon as the previous generation's workers started: no worker ever meets an earlier attempt's."""
    env = {"AGENT_TEST_MODE_1": "wait", "AGENT_TEST_MODE_2": "wait", "AGENT_TEST_IGNORE_TERM_2": "1",
           "AGENT_TEST_MODE_3": "wait"}
    run, agent_port = start_pod(launcher, tmp_path, "pod-a", port=free_port(), nproc=2, **env)
    for attempt in (2, 3, 4):
        assert wait_for(lambda a=attempt: len(events(tmp_path, "start", attempt=a - 1)) == 2, 90), run.tail()
        if attempt == 3:  # the SIGTERM-ignoring generation must be inside its loop, not still importing
            assert wait_for(lambda: len(events(tmp_path, "ready", attempt=2)) == 2, 90), run.tail()
        assert post(agent_port, signed("pod-a", attempt, port=free_port()))[0] == 200
    assert wait_for(lambda: len(events(tmp_path, "start", attempt=4)) == 2, 90), run.tail()
    no_overlap(tmp_path)
    assert sorted(e["attempt"] for e in events(tmp_path, "start")) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert run.wait(120) == [0], run.tail()
    assert [e["total"] for e in events(tmp_path, "done")] == [3, 3]


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_a_taken_port_leaves_the_training_running(launcher: Launcher, tmp_path: Path) -> None:
    """No plans can come (the operator will recreate instead), but the training is not the agent's to end."""
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        script = tmp_path / "script.py"
        script.write_text(SCRIPT)
        env = pod_env(tmp_path, "pod-a", port=free_port(), agent_port=taken.getsockname()[1])
        run = start_process(launcher, [*LAUNCH, str(script)], env, "pod-a")
        assert run.wait(90) == [0], run.tail()
    assert "cannot listen" in run.output() and [e["attempt"] for e in events(tmp_path, "done")] == [1]


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_redirected_workers_are_started_by_torchrun_itself(launcher: Launcher, tmp_path: Path) -> None:
    """Parked workers inherit the pod's output; with torchrun's own redirection it starts them as usual."""
    logs = tmp_path / "torchrun-logs"
    run, agent_port = start_pod(launcher, tmp_path, "pod-a", torchrun=("--log-dir", str(logs), "--redirects", "3"),
                                port=free_port(), AGENT_TEST_MODE_1="hang")
    assert wait_for(lambda: (health(agent_port) or {}).get("prewarmed"), 90), run.tail()
    assert wait_for(lambda: agent.PARKED_WARM_LOG in run.output(0), 10), run.tail()  # the log says so too
    assert post(agent_port, signed("pod-a", 2, port=free_port()))[0] == 200
    assert run.wait(90) == [0], run.tail()
    assert [e["attempt"] for e in events(tmp_path, "done")] == [2]
    assert list(logs.rglob("stdout.log"))  # torchrun redirected its workers' output, as asked


@pytest.mark.multiproc
@pytest.mark.timeout(120)
@pytest.mark.parametrize("imports", ["1", "0"])
def test_a_parked_worker_imports_the_library_not_the_script(tmp_path: Path, imports: str) -> None:
    """While parked, a worker imports torch and (unless turned off) the library's modules; the user's script
    and its own modules run only once the spawn comes, and see the library already imported."""
    import subprocess

    mine = tmp_path / "users_module.py"
    mine.write_text("import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('imported')\n")
    script = tmp_path / "train.py"
    report = tmp_path / "report.json"
    script.write_text("import json, sys\n"
                      f"seen = sorted(m for m in {agent.PREWARM_MODULES!r} if m in sys.modules)\n"
                      f"json.dump(seen, open({str(report)!r}, 'w'))\n"
                      "import users_module\n")
    read, write = os.pipe()
    env = {**os.environ, agent.READY_FD_ENV: str(write), agent.PREWARM_IMPORTS_ENV: imports,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-u", "-m", agent.MODULE, agent.WORKER_FLAG], env=env,
                            stdin=subprocess.PIPE, pass_fds=(write,))
    os.close(write)
    assert os.read(read, 1) == b"1"  # parked
    os.close(read)
    marker = tmp_path / "marker"
    assert not marker.exists() and not report.exists()
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"argv": [str(script), str(marker)], "environ": env}).encode() + b"\n")
    proc.stdin.close()
    assert proc.wait(60) == 0
    assert marker.read_text() == "imported"
    expected = sorted(agent.PREWARM_MODULES) if imports == "1" else []
    assert [m for m in json.loads(report.read_text()) if m.startswith("resilient_trainer")] == [
        m for m in expected if m.startswith("resilient_trainer")]
    if imports == "1":
        assert json.loads(report.read_text()) == expected


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_the_fsdp_warm_up_leaves_no_process_group_behind_and_warms_fully_shard(tmp_path: Path) -> None:
    """warm_fsdp ran FSDP2 in a one-rank group of its own while parked: the script finds no process group (its
    own init_process_group works) and its first fully_shard is warm."""
    import subprocess

    script = tmp_path / "train.py"
    report = tmp_path / "report.json"
    script.write_text("import json, time, torch, torch.distributed as dist\n"
                      "initialized = dist.is_initialized()\n"
                      "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
                      "from torch.distributed.device_mesh import init_device_mesh\n"
                      "from torch.distributed.fsdp import fully_shard\n"
                      "t = time.perf_counter()\n"
                      "fully_shard(torch.nn.Linear(8, 8), mesh=init_device_mesh('cpu', (1,)))\n"
                      "shard = time.perf_counter() - t\n"
                      "dist.destroy_process_group()\n"
                      f"json.dump(dict(initialized=initialized, shard=shard), open({str(report)!r}, 'w'))\n")

    def shard_in_parked_worker(fsdp: str) -> dict[str, Any]:
        read, write = os.pipe()
        env = {**os.environ, agent.READY_FD_ENV: str(write), agent.PREWARM_IMPORTS_ENV: "1",
               agent.PREWARM_FSDP_ENV: fsdp}
        proc = subprocess.Popen([sys.executable, "-u", "-m", agent.MODULE, agent.WORKER_FLAG], env=env,
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write,))
        os.close(write)
        assert os.read(read, 1) == b"1"  # parked (and warmed, if asked)
        os.close(read)
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(json.dumps({"argv": [str(script)], "environ": env}).encode() + b"\n")
        proc.stdin.close()
        assert proc.wait(60) == 0
        assert b"warm-up skipped" not in proc.stderr.read()
        return dict(json.loads(report.read_text()))

    warm, cold = shard_in_parked_worker("1"), shard_in_parked_worker("0")
    assert warm["initialized"] is False and cold["initialized"] is False
    assert warm["shard"] < cold["shard"] / 3, (warm, cold)  # ~0.01 s against ~0.6 s on an idle core


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_the_fsdp_warm_up_leaves_the_rng_state_as_it_found_it() -> None:
    """Exactness: whatever the script seeds or not, the warm-up's toy module and input draw nothing from the
    global generator."""
    import subprocess

    code = ("import torch, torch.distributed as dist\n"
            "from resilient_trainer import agent\n"
            "before = torch.get_rng_state()\n"
            "agent.warm_fsdp()\n"
            "print(torch.equal(before, torch.get_rng_state()), dist.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=90)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_config_needs_all_four_variables() -> None:
    assert agent.config({}) is None and agent.config({plan.AGENT_PORT_ENV: "0"}) is None
    full = {plan.AGENT_PORT_ENV: "29401", plan.PUBLIC_KEY_ENV: "k", plan.POD_UID_ENV: "p", environment.JOB_UID: "j",
            agent.LINGER_ENV: "5", agent.STOP_GRACE_ENV: "junk"}
    cfg = agent.config(full)
    assert cfg is not None and (cfg.port, cfg.linger, cfg.grace, cfg.prewarm) == (29401, 5.0, 1.0, True)
    with pytest.raises(environment.ContractError, match=plan.POD_UID_ENV):
        agent.config({**full, plan.POD_UID_ENV: ""})
    merged = agent.plan_environ({environment.RESUME_FROM: "/old", "X": "1"}, plan.Plan(
        job_uid="j", pod_uid="p", attempt=2, nnodes=1, node_rank=0, master_addr="m", master_port=1, resume_from=""))
    assert environment.RESUME_FROM not in merged and merged["X"] == "1" and merged[environment.ATTEMPT] == "2"


VARIANTS = {"cold": {agent.PREWARM_ENV: "0"}, "torchrun parked": {agent.PREWARM_WORKERS_ENV: "0"},
            "torchrun + workers parked": {}}


def measure(tmp: Path, variant: str) -> tuple[float, float, float]:
    """Seconds from POST to: the 200, the new worker's first line, its first collective done (its own torch
    import and the gloo rendezvous included) for one switch."""
    launcher = Launcher(tmp)
    try:
        run, agent_port = start_pod(launcher, tmp, f"pod-{tmp.name}", port=free_port(), AGENT_TEST_MODE_1="hang",
                                    **VARIANTS[variant])
        assert wait_for(lambda: events(tmp, "start"), 90), run.tail()
        if variant != "cold":
            assert wait_for(lambda: (health(agent_port) or {}).get("prewarmed"), 90), run.tail()
        t0 = time.time()
        assert post(agent_port, signed(f"pod-{tmp.name}", 2, port=free_port()))[0] == 200
        answered = time.time()
        assert wait_for(lambda: events(tmp, "start", attempt=2), 90), run.tail()
        assert run.wait(90) == [0], run.tail()
        ready = events(tmp, "ready", attempt=2)[0]["time"]
        return answered - t0, events(tmp, "start", attempt=2)[0]["time"] - t0, ready - t0
    finally:
        launcher.cleanup()


def main() -> None:
    """Plan -> new workers running, median of 5 per variant, interleaved (the machine may be loaded)."""
    import tempfile

    figures: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as root:
        for rep in range(5):
            for i, variant in enumerate(VARIANTS):
                tmp = Path(root) / f"{rep}-{i}"
                tmp.mkdir()
                figures[variant].append(measure(tmp, variant))
            loads.append(os.getloadavg()[0])
    print(f"1-min load average during the run: {min(loads):.1f} to {max(loads):.1f} (2 cores)")
    print(f"{'median of 5, seconds after the POST':<38}{'200':>6}{'worker running':>16}{'first collective':>18}")
    for variant, rows in figures.items():
        acked, running, ready = (statistics.median(col) for col in zip(*rows, strict=True))
        print(f"{variant:<38}{acked:6.2f}{running:16.2f}{ready:18.2f}")


if __name__ == "__main__":
    main()
