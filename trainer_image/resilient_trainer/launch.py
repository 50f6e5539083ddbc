"""`python -m resilient_trainer.launch [torchrun options] -- script.py args` (or `rtj-launch`).

Maps the environment the operator injects (resilient_contract.environment) onto torch's elastic launcher,
so a plain torchrun script runs unchanged:

    --nnodes=$PET_NNODES --nproc-per-node=$PET_NPROC_PER_NODE --node-rank=$PET_NODE_RANK
    --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT --rdzv-backend=static --max-restarts=0

Why static rendezvous: the operator already fixed the membership of the attempt (pod i is node rank i,
all pods start together, a lost pod means a new attempt with a new world size). Static rendezvous maps
that exactly: no ranks shuffled by arrival order, no re-rendezvous, and the store lives on node 0
behind the headless Service name, reachable as soon as that pod runs. c10d rendezvous adds elasticity
the operator deliberately does not use (it would let a partial set of nodes proceed or re-form), and its
store host is whichever agent wins the race. `--max-restarts=0` because restarts are the operator's job:
an in-pod restart would rejoin a group whose peers may already be fenced.

Exit status: the launcher's, except that a run whose workers recorded success for this attempt in the
termination message (resilient_contract.completion) exits 0 even if a worker then died at interpreter
exit, and a recorded preemption exits 143. Options before `--` are passed to torchrun after ours.

Local runs (no operator environment: neither $PET_NNODES nor $RTJ_JOB_NAME is set) work like
`torchrun --standalone` on one node:

    python -m resilient_trainer.launch --nproc-per-node 2 --checkpoint-root ./ckpt [--resume latest] -- train.py

`--checkpoint-root` is exported to the workers as an absolute $RTJ_CHECKPOINT_ROOT; `--resume latest`
exports the newest complete checkpoint under it as $RTJ_RESUME_FROM (resilient_contract.storage's one
completeness rule; newer incomplete ones are reported and skipped). The termination message goes to a
temporary file unless $RTJ_TERMINATION_LOG is set, so the exit-status rule above holds locally too.

In both modes every worker runs through `resilient_trainer.worker`, which makes it die (SIGKILL) with
the launcher: an orphaned worker would keep training and saving under nobody's supervision.

Progress and hangs (resilient_contract.progress): each rank writes a tiny pod-local file after every step
($RTJ_PROGRESS_DIR, set here). A watchdog thread compares them once a second: it rewrites this pod's report
in the checkpoint root every few seconds (step, slowest rank and its step time: goodput and stragglers for
the operator, which has no other channel to the workers), and when $RTJ_PROGRESS_TIMEOUT_SECONDS passes
with some local rank making no step (before its first step, FIRST_STEP_TIMEOUTS times the timeout from
launch: imports, rendezvous, the checkpoint load), it
writes an RTJ_HUNG termination message naming the last step and the rank that stopped first, kills the
workers (a rank stuck in a collective never runs a SIGTERM handler) and exits HUNG_EXIT_CODE.

With $RTJ_AGENT_PORT set (and the plan's key, the pod's and the job's uid), the launcher is the pod's
long-lived agent instead: each attempt runs as a child process group and a signed plan from the operator
switches attempts in place (resilient_trainer.agent).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

from resilient_contract import completion, environment, progress, storage
from resilient_contract.storage.roots import FILE_SCHEME
from resilient_trainer.worker import LAUNCHER_PID_ENV

PREEMPTED_EXIT_CODE = 143
WORKER_MODULE = "resilient_trainer.worker"
USAGE = (
    "usage: python -m resilient_trainer.launch [--nproc-per-node N] [--checkpoint-root DIR] "
    "[--resume latest|DIR] [torchrun options] -- script.py [args]   (or -- -m module [args])"
)


HUNG_EXIT_CODE = 124  # timeout(1)'s convention; the operator reads the termination message, not this
REPORT_SECONDS = 3.0  # how often the pod's report in the checkpoint root is rewritten (when steps moved)
# Before a rank's first step (imports, rendezvous, the checkpoint load) it is allowed this many timeouts.
FIRST_STEP_TIMEOUTS = 4


class Watchdog:
    """Watches the local ranks' progress files; reports progress; ends the pod on a hang."""

    def __init__(self, env: environment.WorkerEnv, directory: str, timeout: float | None,
                 clock: Callable[[], float] = time.time, on_hang: Callable[[], None] | None = None) -> None:
        self.env, self.dir, self.timeout, self.clock = env, directory, timeout, clock
        self.started = clock()
        self.first_step_at: float | None = None
        self.hung: str | None = None  # the termination message, once a hang was declared
        self.verdict: progress.Hang | None = None  # the same, for the progress report (kept in every later one)
        self.hang_reported = False  # the verdict reached the checkpoint root (an agent may then keep its pod)
        self.on_hang = on_hang or kill_children
        self.workers_alive: Callable[[], bool] | None = None  # the agent's: is any worker still running?
        self._reported = (-1, 0.0)
        self._stop = threading.Event()

    def check(self) -> None:
        """One look: report, and declare a hang if due."""
        if self.workers_alive is not None and not self.workers_alive():
            return  # the workers are done: torchrun tearing down is no training hang
        now = self.clock()
        ranks = progress.read_ranks(self.dir)
        expected = [self.env.node_rank * self.env.nproc_per_node + i for i in range(self.env.nproc_per_node)]
        steps = {r: ranks[r][0] if r in ranks else self._resumed_step() for r in expected}
        last = {r: ranks[r][2] if r in ranks else self.started for r in expected}
        if ranks and self.first_step_at is None:
            self.first_step_at = min(t for _, _, t in ranks.values())
        slowest = max(ranks, key=lambda r: ranks[r][1]) if ranks else None
        low = min(steps.values())
        since = now - self._reported[1]
        due = since >= (REPORT_SECONDS if low != self._reported[0] else 4 * REPORT_SECONDS)
        if self._reports() and ranks and due:
            self._report(low, now, slowest, ranks[slowest][1] if slowest is not None else None)
        if self.timeout and self.hung is None:
            first = min(expected, key=lambda r: (steps[r], last[r]))
            stalled = now - last[first]
            limit = self.timeout if first in ranks else self.timeout * FIRST_STEP_TIMEOUTS
            if stalled >= limit and not self._stop.is_set():  # a stopped watchdog's generation is gone
                self.hung = completion.format_message(
                    completion.HUNG, step=steps[first], rank=first, stalled_s=f"{stalled:.1f}",
                    timeout_s=f"{self.timeout:g}", attempt=self.env.attempt)
                print(f"rtj-launch: {self.hung}", file=sys.stderr, flush=True)
                try:
                    completion.write_termination_message(completion.HUNG, step=steps[first], rank=first,
                                                         stalled_s=f"{stalled:.1f}", timeout_s=f"{self.timeout:g}",
                                                         attempt=self.env.attempt)
                except OSError as exc:
                    print(f"rtj-launch: cannot write termination message: {exc}", file=sys.stderr)
                self.verdict = progress.Hang(steps[first], first, round(stalled, 1), self.timeout)
                if self._reports():
                    self.hang_reported = self._report(low, now, slowest,
                                                      ranks[slowest][1] if slowest is not None else None)
                self.on_hang()

    def _resumed_step(self) -> int:
        name = os.path.basename((self.env.resume_from or "").rstrip("/"))
        return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else 0

    def _reports(self) -> bool:
        """Progress reports are files in a mounted root; an s3:// root has none yet (never a local "s3:" dir)."""
        return bool(self.env.checkpoint_root) and not storage.is_object_store(self.env.checkpoint_root)

    def _report(self, step: int, now: float, slowest: int | None, seconds: float | None) -> bool:
        """Rewrite this pod's report (with the hang verdict, once there is one); False when it could not."""
        pod = os.environ.get("HOSTNAME") or f"{self.env.job_name}-a{self.env.attempt}-{self.env.node_rank}"
        self._reported = (step, now)
        try:
            progress.write_report(self.env.checkpoint_root, progress.Report(
                pod=pod, attempt=self.env.attempt, step=step, time=now, first_step_at=self.first_step_at,
                step_seconds=seconds, slowest_rank=slowest, hung=self.verdict))
            return True
        except OSError as exc:  # advisory: a full or read-only volume must not end the training
            print(f"rtj-launch: cannot write progress report: {exc}", file=sys.stderr)
            return False

    def run(self, interval: float = 1.0) -> None:
        while not self._stop.wait(interval):
            try:
                self.check()
            except Exception as exc:  # never let the watchdog take the launcher down
                print(f"rtj-launch: watchdog: {exc!r}", file=sys.stderr)

    def start(self) -> None:
        threading.Thread(target=self.run, name="rtj-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc; the workers and anything they started)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_children() -> None:
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def worker_command(script: Sequence[str]) -> list[str]:
    """Run the user's script (or `-m module`) through the worker shim that dies with the launcher."""
    return ["-m", WORKER_MODULE, *script]


def torchrun_args(env: environment.WorkerEnv, extra: Sequence[str], script: Sequence[str]) -> list[str]:
    """The torchrun command line (without the program name) for this worker pod."""
    return [
        f"--nnodes={env.nnodes}",
        f"--nproc-per-node={env.nproc_per_node}",
        f"--node-rank={env.node_rank}",
        f"--master-addr={env.master_addr}",
        f"--master-port={env.master_port}",
        "--rdzv-backend=static",
        f"--rdzv-id={env.job_name}-{env.attempt}",
        "--max-restarts=0",
        *extra,
        *worker_command(script),
    ]


def local_torchrun_args(nproc: int, extra: Sequence[str], script: Sequence[str]) -> list[str]:
    """One node, a free port picked by torchrun (`--standalone`), no in-place restarts."""
    return ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc}", "--max-restarts=0", *extra,
            *worker_command(script)]


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(torchrun options, script and its args): split at the first `--`; no `--` means all script."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return [], argv


def is_local(environ: dict[str, str] | os._Environ[str]) -> bool:
    """No operator here: the operator always injects both the node count and the job name."""
    return not environ.get(environment.NNODES) and not environ.get(environment.JOB_NAME)


def parse_local(extra: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our local-run options; everything else goes to torchrun unchanged."""
    p = argparse.ArgumentParser(prog="rtj-launch", add_help=False, allow_abbrev=False)
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1)
    p.add_argument("--checkpoint-root", default=None)
    p.add_argument("--resume", default=None, help="'latest' (newest complete under the root) or a directory")
    return p.parse_known_args(list(extra))


def resolve_resume(resume: str, root: str | None) -> tuple[str | None, list[str]]:
    """(checkpoint to resume from or None, lines to tell the user). `latest` uses storage.discover."""
    if resume != "latest":
        return (resume if storage.is_object_store(resume) else os.path.abspath(resume)), []
    if not root:
        raise ValueError(f"--resume latest needs --checkpoint-root or ${environment.CHECKPOINT_ROOT}")
    listing = storage.discover(root)
    notes = [f"skipped {v.path}: {v.reason}" for v in listing.skipped]
    if listing.error and not listing.missing:
        raise ValueError(listing.error)
    if listing.latest is None:
        return None, [*notes, f"no complete checkpoint under {root}: starting fresh"]
    return listing.latest.path, [*notes, f"resuming from {listing.latest.path}"]


def _outcome_for(attempt: str, path: str | None = None) -> completion.Outcome | None:
    outcome = completion.read_termination_message(path)
    if outcome is None or outcome.fields.get("attempt") != attempt:
        return None
    return outcome


def run_torchrun(argv: list[str], attempt: str, log_path: str | None, watchdog: Watchdog | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the workers' parent: torchrun's agent runs in here
    args = parse_args(argv)
    if watchdog is not None:
        watchdog.start()
    try:
        run(args)
        return 0
    except (ChildFailedError, SignalException) as exc:
        if watchdog is not None and watchdog.hung:
            return HUNG_EXIT_CODE
        outcome = _outcome_for(attempt, log_path)
        if outcome is not None and outcome.succeeded:
            print(f"rtj-launch: workers recorded success ({completion.SUCCEEDED}) before failing at exit: "
                  f"{type(exc).__name__}; exiting 0", file=sys.stderr)
            return 0
        if outcome is not None and outcome.kind == completion.PREEMPTED:
            return PREEMPTED_EXIT_CODE
        if isinstance(exc, SignalException):
            return 128 + int(exc.sigval)
        return 1


def clear_termination_message(path: str | None) -> None:
    """A stale message from an earlier container must not turn this run's failure into a success."""
    if path and os.path.exists(path) and os.access(path, os.W_OK):
        open(path, "w").close()


def main_local(extra: Sequence[str], script: Sequence[str]) -> int:
    try:
        opts, rest = parse_local(extra)
        root = opts.checkpoint_root or os.environ.get(environment.CHECKPOINT_ROOT)
        if root:
            if not storage.is_object_store(root):
                root = os.path.abspath(root.removeprefix(FILE_SCHEME))
            os.environ[environment.CHECKPOINT_ROOT] = root
        if opts.resume:
            target, notes = resolve_resume(opts.resume, root)
            for line in notes:
                print(f"rtj-launch: {line}", file=sys.stderr)
            if target:
                os.environ[environment.RESUME_FROM] = target
            else:
                os.environ.pop(environment.RESUME_FROM, None)
    except (ValueError, SystemExit) as exc:
        print(f"rtj-launch: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    attempt = os.environ.get(environment.ATTEMPT) or "0"
    with contextlib.ExitStack() as stack:
        log_path = os.environ.get(completion.TERMINATION_LOG_ENV)
        if not log_path:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rtj-launch-"))
            log_path = os.environ[completion.TERMINATION_LOG_ENV] = os.path.join(tmp, "termination-log")
        clear_termination_message(log_path)
        return run_torchrun(local_torchrun_args(opts.nproc_per_node, rest, script), attempt, log_path)


HELP_FLAGS = ("-h", "--help")


def wants_help(argv: Sequence[str]) -> bool:
    """`--help` before any `--`, or as the only word: ours to answer (a script's own `--help` follows `--`)."""
    argv = list(argv)
    ours = argv[: argv.index("--")] if "--" in argv else argv[:1]
    return any(a in HELP_FLAGS for a in ours)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    extra, script = split_argv(argv)
    if not script:
        print(USAGE, file=sys.stderr)
        return 2
    if is_local(os.environ):
        return main_local(extra, script)
    try:
        env = environment.WorkerEnv.from_environ()
    except environment.ContractError as exc:
        print(f"rtj-launch: {exc}", file=sys.stderr)
        return 2
    if any(a.split("=", 1)[0] in ("--checkpoint-root", "--resume") for a in extra):
        print("rtj-launch: --checkpoint-root/--resume are for local runs; under the operator the job's "
              "spec.checkpoint and the operator's choice of checkpoint apply", file=sys.stderr)
        return 2
    from resilient_trainer import agent  # not at the top: agent imports this module

    try:
        agent_config = agent.config(os.environ)
    except environment.ContractError as exc:
        print(f"rtj-launch: {exc}", file=sys.stderr)
        return 2
    log_path = completion.termination_log_path()
    clear_termination_message(log_path)
    raw_timeout = os.environ.get(progress.TIMEOUT_ENV, "")
    timeout = float(raw_timeout) if raw_timeout.replace(".", "", 1).isdigit() and float(raw_timeout) > 0 else None
    if agent_config is not None:  # the pod's long-lived agent: generations as child processes
        return agent.main(agent_config, extra, script, timeout)
    rank_dir = os.environ[progress.RANK_DIR_ENV] = tempfile.mkdtemp(prefix="rtj-progress-")  # pod-local, inherited
    try:
        watchdog = Watchdog(env, rank_dir, timeout)
        return run_torchrun(torchrun_args(env, extra, script), str(env.attempt), log_path, watchdog)
    finally:  # the ranks' heartbeats: nobody reads them once torchrun is gone (a local run's /tmp keeps them)
        shutil.rmtree(rank_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
