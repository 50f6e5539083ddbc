"""The pod's long-lived agent: runs one attempt's workers at a time and switches attempts in place.

Under the operator with `$RTJ_AGENT_PORT` (plus `$RTJ_PLAN_PUBLIC_KEY`, `$RTJ_POD_UID`, `$RTJ_JOB_UID`),
`resilient_trainer.launch` does not run torchrun in its own process: it runs each attempt ("generation")
as a child process group, `python -m resilient_trainer.agent`, which reads its environment and torchrun
arguments on stdin and then runs torchrun exactly as the plain launcher does (same exit-status rules).
The launcher stays, serves `POST /plan` (resilient_contract.plan: signed by the operator, for this job and
pod) and `GET /healthz`, and on a newer plan stops the running generation the way the hang path does
(SIGTERM, then SIGKILL after `$RTJ_AGENT_STOP_GRACE_SECONDS`), confirms every descendant is gone, clears
the termination message and only then starts the next generation with the plan's environment. So a user's
script never runs twice at once in one pod, and no worker of attempt N outlives the start of N+1.

A generation whose worker failed because a peer went away (it left resilient_trainer.worker's peer-lost
marker), or whose gang was stopped by a peer (a peer's agent took its plan first: every rank saved and exited
RTJ_PREEMPTED, though nobody stopped this pod), does not end the pod at once: that pod is one the operator
wants to keep, and its own plan may be a moment behind, so the agent lingers
`$RTJ_AGENT_LINGER_SECONDS` for a plan, then exits with that generation's status and termination message as
the plain launcher would. A hang lingers the same way once its verdict is in the pod's progress report
(resilient_contract.progress), where the operator reads it: the gang's pods stay, only the one whose rank
stopped first is replaced (or none, without a bad-node window). Without that report (an s3:// root) a hang
ends the pod with RTJ_HUNG. Any other failure (the script's own error) and success exit at once, as before;
SIGTERM (pod deletion) is passed to the generation, which stops its workers as today, and the launcher exits
with its status.

Start-up off the critical path: the next generation's process is started early and parks, torch's
launcher already imported, until a plan hands it its environment ($RTJ_AGENT_PREWARM=0 turns this off).

Every process dies with its parent (prctl PDEATHSIG: the generation with the launcher, the workers with
the generation, resilient_trainer.worker), and the launcher is a child subreaper, so a worker orphaned by
its torchrun is still below it, where `launch.descendants` finds it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import http.client
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from resilient_contract import completion, environment, plan, progress
from resilient_trainer import launch
from resilient_trainer.worker import LAUNCHER_PID_ENV, PEER_LOST_PREFIX, die_with_parent

LINGER_ENV = plan.LINGER_ENV  # after a lost peer, wait this long for a plan
DEFAULT_LINGER_SECONDS = 30.0
STOP_GRACE_ENV = "RTJ_AGENT_STOP_GRACE_SECONDS"  # SIGTERM, then SIGKILL after this
DEFAULT_STOP_GRACE_SECONDS = 1.0
PREWARM_ENV = "RTJ_AGENT_PREWARM"  # "0": no parked next generation (start-up on the critical path)
PREWARM_WORKERS_ENV = "RTJ_AGENT_PREWARM_WORKERS"  # "0": the parked generation starts no workers ahead
PREWARM_IMPORTS_ENV = "RTJ_AGENT_PREWARM_IMPORTS"  # "0": parked workers import torch only, not PREWARM_MODULES
PREWARM_FSDP_ENV = "RTJ_AGENT_PREWARM_FSDP"  # "0": parked workers skip the FSDP2 warm-up (warm_fsdp)
WORKER_FLAG = "--worker"
MODULE = "resilient_trainer.agent"  # not __name__: that is "__main__" in the processes it starts
# Logged once a parked generation and its workers have imported torch: the next plan starts without start-up.
PARKED_WARM_LOG = "next generation parked and warm"
PARK_DELAY_SECONDS = 10.0  # the next generation parks after the running one's first step, or this long
CONFIRM_SECONDS = 10.0  # killed processes must be gone within this, or the plan is answered 500
HOST_WAIT_SECONDS = 3.0  # a rank > 0 waits at most this long for the rendezvous host's agent (_await_host)
READ_TIMEOUT_SECONDS = 5.0  # every socket read of a request
REQUEST_SECONDS = 10.0  # a whole request, however slowly its bytes trickle in
MAX_CONNECTIONS = 16  # concurrent requests; more are closed unanswered
# What a parked worker imports besides torch: the torch modules this library's checkpointer, parallel wrappers
# and storage use (DCP, FSDP2, DTensor, DDP) and those library modules. No user code: a script's own imports
# still run after the plan. Each is optional (an older torch may lack one). bench/parked_worker_bench.py: the
# spawn -> first step of the example at W=1 goes from 1.37 s to 0.82 s on an idle machine.
PREWARM_MODULES = (
    "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict", "torch.distributed.device_mesh",
    "torch.distributed.fsdp", "torch.distributed.tensor", "torch.nn.parallel",
    "resilient_trainer.checkpointer", "resilient_trainer.parallel", "resilient_trainer.storage",
    "resilient_trainer.integrity", "resilient_trainer.preemption", "resilient_trainer.state",
)
READY_FD_ENV = "_RTJ_AGENT_READY_FD"  # a pipe: b"1" once torch is imported, b"2" once the parked workers are
HEALTH_PATH = "/healthz"
RUNNING, LINGERING, EXITING = "running", "lingering", "exiting"
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Config:
    port: int
    public_key: str
    pod_uid: str
    job_uid: str
    linger: float = DEFAULT_LINGER_SECONDS
    grace: float = DEFAULT_STOP_GRACE_SECONDS
    prewarm: bool = True


def config(environ: Mapping[str, str]) -> Config | None:
    """The agent's settings, or None when the pod runs no agent (no port, or port 0): the plain launcher.
    A port without the key, the pod's uid or the job's uid is a ContractError: the operator sets all four."""
    raw = environ.get(plan.AGENT_PORT_ENV, "")
    if raw in ("", "0"):
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise environment.ContractError(f"{plan.AGENT_PORT_ENV}={raw!r} is not a port")
    missing = [n for n in (plan.PUBLIC_KEY_ENV, plan.POD_UID_ENV, environment.JOB_UID) if not environ.get(n)]
    if missing:
        raise environment.ContractError(f"{plan.AGENT_PORT_ENV} is set but {', '.join(missing)} is not")
    return Config(port=int(raw), public_key=environ[plan.PUBLIC_KEY_ENV], pod_uid=environ[plan.POD_UID_ENV],
                  job_uid=environ[environment.JOB_UID],
                  linger=_seconds(environ, LINGER_ENV, DEFAULT_LINGER_SECONDS),
                  grace=_seconds(environ, STOP_GRACE_ENV, DEFAULT_STOP_GRACE_SECONDS),
                  prewarm=environ.get(PREWARM_ENV, "1") != "0")


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if 0 <= value < 86400 else default


def plan_environ(base: Mapping[str, str], next_plan: plan.Plan) -> dict[str, str]:
    """The pod's environment with the plan's variables over it (a fresh start has no resume variable)."""
    env = {**base, **next_plan.environ()}
    if not env.get(environment.RESUME_FROM):
        env.pop(environment.RESUME_FROM, None)
    return env


def _state(pid: int) -> str | None:
    """The process's state letter (`Z` for a zombie), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class _Child:
    """A generation process as started, parked or not, and what it said on its ready pipe."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.imported = threading.Event()  # torch's launcher is imported
        self.warm = threading.Event()  # ...and its WorkerPool's workers have imported torch

    def listen(self, read: int) -> None:
        try:
            if os.read(read, 1) == b"1":
                self.imported.set()
                os.read(read, 1)  # b"2", or the end: nothing more to wait for
                self.warm.set()
        except OSError:
            pass
        finally:
            os.close(read)


@dataclass
class Generation:
    """One attempt's torchrun process (its own process group) and the watchdog over its ranks."""

    attempt: int
    proc: subprocess.Popen[bytes]
    watchdog: launch.Watchdog
    rank_dir: str
    hung: bool = False
    saw_workers: bool = False
    started_at: float = field(default_factory=time.time)

    def workers_alive(self) -> bool:
        """False only once its workers ran and are all gone (torchrun tearing down: no hang to declare);
        before they start (torchrun's imports, its rendezvous) the watchdog's first-step clock runs."""
        alive = bool(launch.descendants(self.proc.pid))
        self.saw_workers |= alive
        return alive or not self.saw_workers

    def lost_a_peer(self) -> bool:
        """A worker failed because a peer went away (resilient_trainer.worker left its marker): this pod can
        carry on in the next attempt. A script's own error leaves none, and ends the pod at once."""
        try:
            return any(name.startswith(PEER_LOST_PREFIX) for name in os.listdir(self.rank_dir))
        except OSError:
            return False

    def wait(self) -> int:
        """Its exit status as the plain launcher's: HUNG after the watchdog, 128+N after signal N."""
        code = self.proc.wait()
        if self.hung:
            return launch.HUNG_EXIT_CODE
        return 128 - code if code < 0 else code


class Agent:
    """Runs generations one at a time; `offer` is the `POST /plan` logic, `run` the launcher's life."""

    def __init__(self, cfg: Config, extra: Sequence[str], script: Sequence[str], base: Mapping[str, str],
                 timeout: float | None, log: Callable[[str], None] | None = None) -> None:
        self.cfg, self.extra, self.script, self.timeout = cfg, list(extra), list(script), timeout
        self.base = dict(base)
        self.log = log or (lambda line: print(f"rtj-agent: {line}", file=sys.stderr, flush=True))
        self.cond = threading.Condition()
        self.current: Generation | None = None
        self.state = RUNNING
        self.terminating = False
        self.closed = False
        self._parked: _Child | None = None
        # PDEATHSIG follows the *thread* that forked: every child is started by this one long-lived thread,
        # never by a request's thread (its exit would kill the generation it just started).
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rtj-spawn")

    # -- generations ---------------------------------------------------------------------------------------
    def _spawn(self) -> _Child:
        """A generation process, which says on a pipe when torch is imported (b"1") and its WorkerPool is
        ready (b"2", or the pipe closes)."""
        read, write = os.pipe()
        env = {**self.base, LAUNCHER_PID_ENV: str(os.getpid()), READY_FD_ENV: str(write)}
        try:
            proc = self._spawner.submit(subprocess.Popen, [sys.executable, "-m", MODULE], env=env,
                                        stdin=subprocess.PIPE, start_new_session=True, pass_fds=(write,)).result()
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        child = _Child(proc)
        threading.Thread(target=child.listen, args=(read,), daemon=True).start()
        return child

    def _park_when_started(self, gen: Generation) -> None:
        """Park the next generation once `gen` is past its start-up (its first step, or PARK_DELAY_SECONDS),
        so that the imports do not compete with its own for the CPU."""
        deadline = time.monotonic() + PARK_DELAY_SECONDS
        while time.monotonic() < deadline and gen.watchdog.first_step_at is None:
            if self.current is not gen or gen.proc.poll() is not None:
                return
            time.sleep(0.2)
        with self.cond:
            if self.current is gen and gen.proc.poll() is None:
                self._park()

    def _park(self) -> None:
        """Start the next generation's process now, so a plan finds torch already imported (under cond)."""
        if not self.cfg.prewarm or self.closed or (self._parked is not None and self._parked.proc.poll() is None):
            return
        try:
            self._parked = child = self._spawn()
        except OSError as exc:
            self.log(f"cannot park the next generation: {exc}")
            return
        threading.Thread(target=self._report_warm, args=(child, time.monotonic()), daemon=True).start()

    def _report_warm(self, child: _Child, since: float) -> None:
        """Say when the parked generation is warm: a recovery before that pays the rest of its imports."""
        while not child.warm.wait(1.0):
            if child.proc.poll() is not None or self._parked is not child:
                return
        if self._parked is child and child.proc.poll() is None:  # (the pipe also closes when it dies)
            self.log(f"{PARKED_WARM_LOG} ({time.monotonic() - since:.1f} s): a plan starts it without start-up")

    @property
    def prewarmed(self) -> bool:
        """A parked generation (and its workers) imported torch and waits for the next plan."""
        parked = self._parked
        return parked is not None and parked.warm.is_set() and parked.proc.poll() is None

    def _start(self, env: dict[str, str]) -> Generation:
        """Hand `env` (the pod's environment for this attempt) to a parked or fresh generation process."""
        worker_env = environment.WorkerEnv.from_environ(env)
        rank_dir = tempfile.mkdtemp(prefix="rtj-progress-")
        env = {**env, progress.RANK_DIR_ENV: rank_dir}
        spec = json.dumps({"environ": env, "attempt": str(worker_env.attempt),
                           "argv": launch.torchrun_args(worker_env, self.extra, self.script)}).encode() + b"\n"
        child, self._parked = self._parked, None
        for _ in range(2):
            if child is None or child.proc.poll() is not None:
                child = self._spawn()
            try:
                assert child.proc.stdin is not None
                child.proc.stdin.write(spec)
                child.proc.stdin.close()
                break
            except OSError:  # the parked process died: start a fresh one
                child.proc.kill()
                child = None
        else:
            raise OSError("no generation process took the plan")
        assert child is not None
        gen = Generation(worker_env.attempt, child.proc, launch.Watchdog(worker_env, rank_dir, self.timeout),
                         rank_dir)
        gen.watchdog.on_hang = lambda: self._hung(gen)
        gen.watchdog.workers_alive = gen.workers_alive
        threading.Thread(target=self._watch_once_imported, args=(gen, child), daemon=True).start()
        self.log(f"attempt {gen.attempt} started: node rank {worker_env.node_rank} of {worker_env.nnodes} "
                 f"(pid {child.proc.pid}{', prewarmed' if child.imported.is_set() else ''})")
        return gen

    def _watch_once_imported(self, gen: Generation, child: _Child) -> None:
        """The hang watchdog's clock starts when torchrun can start the workers, as in the plain launcher
        (whose watchdog starts after torch's import): a cold start is not charged to the first step."""
        while not child.imported.wait(0.5):
            if gen.proc.poll() is not None or self.current is not gen:
                return
        gen.watchdog.started = gen.watchdog.clock()
        gen.watchdog.start()

    def _hung(self, gen: Generation) -> None:
        """The watchdog declared a hang (and wrote RTJ_HUNG): kill the generation; `run` lingers."""
        with self.cond:
            if self.current is gen and gen.proc.poll() is None:
                gen.hung = True
                self._signal(gen, signal.SIGKILL)

    def _others(self) -> set[int]:
        """The parked generation and its parked workers: not the running generation's."""
        parked = self._parked
        return {parked.proc.pid, *launch.descendants(parked.proc.pid)} if parked is not None else set()

    def _signal(self, gen: Generation, sig: int) -> None:
        """`sig` to the generation's group and to every process below the launcher but the parked one."""
        with contextlib.suppress(OSError):
            os.killpg(gen.proc.pid, sig)
        for pid in set(launch.descendants(os.getpid())) - self._others():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def _live(self) -> list[int]:
        """Processes below the launcher, other than the parked one, that are not yet gone. Zombies left to
        us (orphans, as subreaper) are reaped; the generation's own exit status is left to its Popen."""
        live, others = [], self._others()
        for pid in launch.descendants(os.getpid()):
            if pid in others:
                continue
            if _state(pid) == "Z":
                if _ppid(pid) == os.getpid() and (self.current is None or pid != self.current.proc.pid):
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)
                continue
            live.append(pid)
        return live

    def _stop(self, gen: Generation) -> bool:
        """Stop `gen` as the hang path does (SIGTERM, then SIGKILL after the grace) and confirm that nothing
        below the launcher but the parked process is left. False if something outlived CONFIRM_SECONDS."""
        gen.watchdog.stop()
        if self._live():
            self._signal(gen, signal.SIGTERM)
            deadline = time.monotonic() + self.cfg.grace
            # The grace is the workers' (a SIGTERM handler may save); torchrun's own orderly exit takes ~0.5 s
            # and is of no use here, so once the workers are gone it is killed with the rest.
            while set(self._live()) - {gen.proc.pid} and time.monotonic() < deadline:
                time.sleep(0.02)
        deadline = time.monotonic() + CONFIRM_SECONDS
        while True:
            left = self._live()
            if not left:
                break
            if time.monotonic() > deadline:
                self.log(f"attempt {gen.attempt}: processes {left} outlived SIGKILL")
                return False
            self._signal(gen, signal.SIGKILL)
            time.sleep(0.02)
        with contextlib.suppress(subprocess.TimeoutExpired):
            gen.proc.wait(CONFIRM_SECONDS)
        shutil.rmtree(gen.rank_dir, ignore_errors=True)
        return gen.proc.poll() is not None

    # -- the plan ------------------------------------------------------------------------------------------
    def offer(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """`POST /plan`: (HTTP status, JSON answer). 200 only once the old workers are gone and the new
        generation was started."""
        try:
            new = plan.verify(body, self.cfg.public_key, self.cfg.job_uid, self.cfg.pod_uid)
        except plan.NotForUs as exc:
            return 403, {"error": str(exc)}
        except plan.PlanError as exc:
            return 400, {"error": str(exc)}
        with self.cond:
            gen = self.current
            if self.closed or self.terminating or gen is None:
                return 503, {"error": "the agent is exiting"}
            if new.attempt < gen.attempt:
                return 409, {"error": f"attempt {new.attempt} is older than the running {gen.attempt}"}
            if new.attempt == gen.attempt:
                return 200, {"attempt": gen.attempt, "state": plan.STARTED}
            t0 = time.monotonic()
            if not self._stop(gen):
                return 500, {"error": f"the workers of attempt {gen.attempt} did not stop"}
            stopped = time.monotonic() - t0
            if new.node_rank and new.master_agent_port:
                self._await_host(new)
            if self.terminating:
                return 503, {"error": "the agent is exiting"}
            launch.clear_termination_message(completion.termination_log_path(self.base))
            try:
                self.current = self._start(plan_environ(self.base, new))
            except (OSError, environment.ContractError) as exc:
                self.log(f"cannot start attempt {new.attempt}: {exc}")
                return 500, {"error": f"cannot start attempt {new.attempt}"}
            if self.terminating:  # SIGTERM came while we started it: pass it on
                with contextlib.suppress(OSError):
                    os.kill(self.current.proc.pid, signal.SIGTERM)
            self.state = RUNNING
            self.cond.notify_all()
            self.log(f"plan: attempt {gen.attempt} -> {new.attempt} (old workers stopped in {stopped:.2f} s, "
                     f"started in {time.monotonic() - t0 - stopped:.2f} s)")
            threading.Thread(target=self._park_when_started, args=(self.current,), daemon=True).start()
        return 200, {"attempt": new.attempt, "state": plan.STARTED}

    def _await_host(self, new: plan.Plan) -> None:
        """torchrun's store is served by rank 0's torchrun. Until rank 0's agent has stopped its old generation,
        that generation's store may still listen on the master port; a torchrun of ours that connected to it
        fails when it goes ("Failed to recv ... Connection was likely closed": an application failure that
        spends the job's budget, seen when the plans reached rank 1 before rank 0). So wait until the host's
        agent says it runs this attempt (or a newer one), polling its /healthz, at most HOST_WAIT_SECONDS;
        then start anyway (the answer is another pod's, so it can only make this start sooner or later)."""
        host = f"[{new.master_addr}]" if ":" in new.master_addr else new.master_addr
        deadline = time.monotonic() + HOST_WAIT_SECONDS
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection(host, new.master_agent_port, timeout=0.5)  # no proxy, unlike urllib
            try:
                conn.request("GET", HEALTH_PATH)
                attempt = json.loads(conn.getresponse().read(4096)).get("attempt")
                if isinstance(attempt, int) and attempt >= new.attempt:
                    return
            except (OSError, ValueError, AttributeError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            time.sleep(0.05)
        self.log(f"the rendezvous host's agent did not report attempt {new.attempt} within "
                 f"{HOST_WAIT_SECONDS:g} s: starting anyway")

    def health(self) -> dict[str, Any]:
        gen = self.current
        return {"attempt": gen.attempt if gen else None, "state": self.state, "prewarmed": self.prewarmed}

    # -- the launcher's life -------------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame: object = None) -> None:
        """SIGTERM/SIGINT: the generation stops its workers as torchrun does, then the launcher exits."""
        self.terminating = True
        gen = self.current
        if gen is not None:
            with contextlib.suppress(OSError):
                os.kill(gen.proc.pid, signum)
        threading.Thread(target=self._wake, daemon=True).start()  # a lingering `run` must not wait it out

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def run(self) -> int:
        """Start the injected attempt; exit as the plain launcher would, except that a failed or hung
        generation first lingers for a plan."""
        with self.cond:
            self.current = self._start(dict(self.base))
            threading.Thread(target=self._park_when_started, args=(self.current,), daemon=True).start()
        while True:
            gen = self.current
            assert gen is not None
            code = gen.wait()
            with self.cond:
                if self.current is not gen:
                    continue  # a plan replaced it
                gen.watchdog.stop()
                why = self._may_carry_on(gen, code)
                if why:
                    self.state = LINGERING
                    self.log(f"attempt {gen.attempt} {why} (exit {code}): waiting {self.cfg.linger:g} s for a plan")
                    self._park()  # the CPU is free now
                    self.cond.wait_for(functools.partial(self._moved_on, gen), self.cfg.linger)
                    if self.current is not gen:
                        continue
                self.state, self.closed = EXITING, True
                return code

    def _may_carry_on(self, gen: Generation, code: int) -> str | None:
        """Why this pod should wait for a plan rather than end with its generation (None: end now).

        A peer gone (the worker's marker), or the gang stopped by a peer: a peer's agent took its plan and
        SIGTERMed its workers, whose preemption flag rides every step's all-reduce, so every rank here saved and
        exited 143 (RTJ_PREEMPTED) though nobody stopped this pod; its own plan may be a moment behind. A pod
        SIGTERMed itself (`terminating`) and a script's own error end the pod as before.

        A hang whose verdict reached the checkpoint root (the progress report) waits too: the operator reads it
        there, blames the rank that stopped first and hands the others their plans. Without that report (an
        s3:// root, a write that failed) the pod ends with RTJ_HUNG as before, the operator's other channel."""
        if code == 0 or self.terminating or self.cfg.linger <= 0:
            return None
        if gen.hung:
            return "hung (the verdict is in its progress report)" if gen.watchdog.hang_reported else None
        if gen.lost_a_peer():
            return "lost a peer"
        outcome = completion.read_termination_message(completion.termination_log_path(self.base))
        if outcome is not None and outcome.kind == completion.PREEMPTED:
            return "stopped with its gang (a peer was stopped)"
        return None

    def _moved_on(self, gen: Generation) -> bool:
        return self.current is not gen or self.terminating

    def close(self) -> None:
        """Nothing of ours outlives the launcher: the parked process, stray workers, the spawner thread."""
        with self.cond:
            self.closed = True
            parked, self._parked = self._parked, None
        if parked is not None:
            parked.proc.kill()
            parked.proc.wait()
        for pid in launch.descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.current is not None:
            shutil.rmtree(self.current.rank_dir, ignore_errors=True)
        self._spawner.shutdown(wait=False)


class _Server(ThreadingHTTPServer):
    """One thread per request, at most MAX_CONNECTIONS of them; more are closed unanswered."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], agent: Agent, family: socket.AddressFamily) -> None:
        self.address_family = family
        self.agent = agent
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:  # dual stack: IPv4 clients too
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    """`POST /plan` and `GET /healthz`. Every read times out, and reading a whole request is cut at
    REQUEST_SECONDS."""

    server: _Server
    timeout = READ_TIMEOUT_SECONDS
    server_version = "rtj-agent"

    def setup(self) -> None:
        super().setup()
        self._cut = threading.Timer(REQUEST_SECONDS, self._hang_up)
        self._cut.daemon = True
        self._cut.start()

    def _hang_up(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self._cut.cancel()
        with contextlib.suppress(OSError):
            super().finish()

    def _answer(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != HEALTH_PATH:
            self._answer(404, {"error": "not found"})
            return
        self._answer(200, self.server.agent.health())

    def do_POST(self) -> None:
        self.close_connection = True
        if self.path != plan.PATH:
            self._answer(404, {"error": "not found"})
            return
        raw = self.headers.get("Content-Length", "")
        if not raw.isdigit():
            self._answer(411, {"error": "a Content-Length is required"})
            return
        if int(raw) > plan.MAX_BODY_BYTES:  # refused unread
            self._answer(400, {"error": f"plan: body over {plan.MAX_BODY_BYTES} bytes"})
            return
        body = self.rfile.read(int(raw))
        if len(body) != int(raw):
            self._answer(400, {"error": "plan: body shorter than its Content-Length"})
            return
        self._cut.cancel()  # read in time: the switch may take longer, and its answer is the acknowledgement
        status, answer = self.server.agent.offer(body)
        self.log_message("POST %s -> %d %s", self.path, status, json.dumps(answer))
        self._answer(status, answer)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Probes and refusals are not worth a log line each; `do_POST` logs what a plan did."""

    def log_message(self, format: str, *args: Any) -> None:
        print(f"rtj-agent: {self.address_string()} {format % args}", file=sys.stderr, flush=True)


def serve(agent: Agent, port: int) -> _Server:
    """Listen on every interface (IPv6 dual stack where the pod has it, else IPv4) in a daemon thread."""
    try:
        server = _Server(("::", port), agent, socket.AF_INET6)
    except OSError:
        server = _Server(("", port), agent, socket.AF_INET)
    threading.Thread(target=server.serve_forever, name="rtj-agent-http", daemon=True).start()
    return server


def main(cfg: Config, extra: Sequence[str], script: Sequence[str], timeout: float | None) -> int:
    """The launcher in agent mode (called by launch.main once the injected contract parsed)."""
    if sys.platform.startswith("linux"):  # orphaned workers stay below us, where descendants() sees them
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    agent = Agent(cfg, extra, script, os.environ, timeout)
    previous = {s: signal.signal(s, agent.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    server = None
    try:
        try:
            server = serve(agent, cfg.port)
            agent.log(f"listening on port {cfg.port} for plans (pod {cfg.pod_uid})")
        except OSError as exc:  # the training matters more: unacknowledged plans make the operator recreate
            agent.log(f"cannot listen on port {cfg.port} ({exc}): running without plans")
        return agent.run()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        agent.close()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _take_spec() -> dict[str, Any] | None:
    """The one JSON line a parked process waits for on stdin (None: nobody needed it); stdin is then
    /dev/null, as the processes it starts expect."""
    line = sys.stdin.buffer.readline()
    if not line:
        return None
    spec = dict(json.loads(line))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(spec["environ"])
    return spec


def _signal_ready(fd: str, after: Sequence[int] = (), what: bytes = b"1") -> None:
    """Write `what` to the pipe `fd` (`$READY_FD_ENV`, if set) once every pipe in `after` said something,
    and close it."""
    for other in after:
        with contextlib.suppress(OSError):
            os.read(other, 1)
        with contextlib.suppress(OSError):
            os.close(other)
    if fd.isdigit():
        with contextlib.suppress(OSError):
            os.write(int(fd), what)
        with contextlib.suppress(OSError):
            os.close(int(fd))


class WorkerPool:
    """This generation's workers, started while it is parked: each imports torch and waits for the spawn
    that torchrun would make (argv and environment, on stdin), then runs as `resilient_trainer.worker`.
    torchrun adopts one instead of starting a process (SubprocessHandler._popen) when the command is the
    plain `python -u -m resilient_trainer.worker ...` with no output redirection; otherwise it starts its
    own as usual."""

    def __init__(self, count: int) -> None:
        env = {**os.environ, LAUNCHER_PID_ENV: str(os.getpid())}
        if count > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun exports for nproc > 1
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ready: list[int] = []
        for _ in range(count):
            read, write = os.pipe()
            self.procs.append(subprocess.Popen(
                [sys.executable, "-u", "-m", MODULE, WORKER_FLAG], env={**env, READY_FD_ENV: str(write)},
                stdin=subprocess.PIPE, start_new_session=True, pass_fds=(write,)))
            os.close(write)
            self.ready.append(read)

    def adopt(self, args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        if tuple(args[:4]) != (sys.executable, "-u", "-m", launch.WORKER_MODULE):
            return None
        while self.procs:
            proc = self.procs.pop(0)
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"argv": list(args[4:]), "environ": dict(env)}).encode() + b"\n")
                proc.stdin.close()
                return proc
            except OSError:  # it died while parked
                proc.kill()
        return None

    def discard(self) -> None:
        while self.procs:
            proc = self.procs.pop()
            proc.kill()
            proc.wait()

    def install(self) -> bool:
        """Make torchrun adopt from this pool; False (nothing changed) if torch's internals moved."""
        try:
            from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
        except ImportError:
            return False
        handler = getattr(subprocess_handler, "SubprocessHandler", None)
        original = getattr(handler, "_popen", None)
        if handler is None or original is None:
            return False
        pool = self

        def _popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
            if self._stdout is None and self._stderr is None:
                adopted = pool.adopt(args, env)
                if adopted is not None:
                    return adopted
            pool.discard()  # a command or redirection it cannot serve: no idle workers left behind
            return original(self, args, env)

        handler._popen = _popen
        return True


def warm_fsdp() -> None:
    """Run FSDP2 once on a toy module in a throwaway one-rank gloo group (an in-memory store, no socket to a
    peer), then destroy the group: the first `fully_shard` of a process pays for DTensor's and FSDP's lazy
    set-up (sharding rules, op schemas, hooks), ~0.6 s on an idle core, ~1 s on a loaded one, which a parked
    worker pays here, before its plan. No user code runs, and the global RNG state is left as it was. Any
    failure is ignored: the worker then pays that cost after its plan, as before."""
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        with torch.random.fork_rng(devices=[]):
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            try:
                toy = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
                mesh = init_device_mesh("cpu", (1,))
                fully_shard(toy[0], mesh=mesh)
                fully_shard(toy, mesh=mesh)
                toy(torch.randn(2, 8)).sum().backward()
                torch.optim.AdamW(toy.parameters()).step()
            finally:
                dist.destroy_process_group()
    except Exception as exc:  # a torch without these, a gloo that cannot start here: pay it later
        print(f"rtj-agent: parked worker: FSDP warm-up skipped ({type(exc).__name__}: {exc})", file=sys.stderr,
              flush=True)


def parked_worker_main() -> int:
    """`python -m resilient_trainer.agent --worker`: one of a WorkerPool's processes."""
    parent = os.environ.get(LAUNCHER_PID_ENV)
    die_with_parent(int(parent) if parent and parent.isdigit() else None)
    torch = importlib.import_module("torch")
    importlib.import_module("torch.distributed")
    library = os.environ.get(PREWARM_IMPORTS_ENV, "1") != "0"
    for module in PREWARM_MODULES if library else ():
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    if library and os.environ.get(PREWARM_FSDP_ENV, "1") != "0":
        warm_fsdp()
    _signal_ready(os.environ.pop(READY_FD_ENV, ""))
    spec = _take_spec()
    if spec is None:
        return 0
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # read when torch loaded; the spawn's value wins
        torch.set_num_threads(int(threads))
    from resilient_trainer import worker

    worker.main(list(spec["argv"]))
    return 0


def generation_main() -> int:
    """`python -m resilient_trainer.agent`: one generation. Dies with the launcher, imports torch's launcher
    (and starts its WorkerPool) while parked, then takes its environment and torchrun arguments from one
    JSON line on stdin."""
    parent = os.environ.get(LAUNCHER_PID_ENV)
    die_with_parent(int(parent) if parent and parent.isdigit() else None)
    # Imported while parked, so a plan does not wait for them (run_torchrun imports them again, for free).
    for module in ("torch.distributed.run", "torch.distributed.elastic.multiprocessing.errors"):
        importlib.import_module(module)
    ready = os.environ.pop(READY_FD_ENV, "")
    if ready.isdigit():
        with contextlib.suppress(OSError):
            os.write(int(ready), b"1")
    nproc = os.environ.get(environment.NPROC_PER_NODE, "1")
    pool = None
    waited_for = not select.select([sys.stdin.buffer], [], [], 0)[0]  # no spec yet: parked, not a cold start
    if waited_for and os.environ.get(PREWARM_WORKERS_ENV, "1") != "0" and nproc.isdigit() and 0 < int(nproc) <= 64:
        pool = WorkerPool(int(nproc))
    threading.Thread(target=_signal_ready, args=(ready, pool.ready if pool else (), b"2"), daemon=True).start()
    spec = _take_spec()
    if spec is None:
        return 0  # a parked process nobody needed (its pool dies with it)
    if pool is not None:
        pool.install()
    log_path = completion.termination_log_path()
    return launch.run_torchrun(list(spec["argv"]), spec["attempt"], log_path)


if __name__ == "__main__":
    sys.exit(parked_worker_main() if sys.argv[1:] == [WORKER_FLAG] else generation_main())
