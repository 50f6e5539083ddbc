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

Progress and hangs (resilient_contract.progress): each rank writes a tiny pod-local file after every step
($RTJ_PROGRESS_DIR, set here). A watchdog thread compares them once a second: it rewrites this pod's report
in the checkpoint root every few seconds (step, slowest rank and its step time: goodput and stragglers for
the operator, which has no other channel to the workers), and when $RTJ_PROGRESS_TIMEOUT_SECONDS passes
with some local rank making no step (before its first step, FIRST_STEP_TIMEOUTS times the timeout from
launch: imports, rendezvous, the checkpoint load), it
writes an RTJ_HUNG termination message naming the last step and the rank that stopped first, kills the
workers (a rank stuck in a collective never runs a SIGTERM handler) and exits HUNG_EXIT_CODE.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

from resilient_contract import completion, environment, progress

PREEMPTED_EXIT_CODE = 143
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
        self.on_hang = on_hang or kill_children
        self._reported = (-1, 0.0)
        self._stop = threading.Event()

    def check(self) -> None:
        """One look: report, and declare a hang if due."""
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
        if self.env.checkpoint_root and ranks and due:
            self._report(low, now, slowest, ranks[slowest][1] if slowest is not None else None)
        if self.timeout and self.hung is None:
            first = min(expected, key=lambda r: (steps[r], last[r]))
            stalled = now - last[first]
            limit = self.timeout if first in ranks else self.timeout * FIRST_STEP_TIMEOUTS
            if stalled >= limit:
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
                self.on_hang()

    def _resumed_step(self) -> int:
        name = os.path.basename((self.env.resume_from or "").rstrip("/"))
        return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else 0

    def _report(self, step: int, now: float, slowest: int | None, seconds: float | None) -> None:
        pod = os.environ.get("HOSTNAME") or f"{self.env.job_name}-a{self.env.attempt}-{self.env.node_rank}"
        try:
            progress.write_report(self.env.checkpoint_root, progress.Report(
                pod=pod, attempt=self.env.attempt, step=step, time=now, first_step_at=self.first_step_at,
                step_seconds=seconds, slowest_rank=slowest))
            self._reported = (step, now)
        except OSError as exc:  # advisory: a full or read-only volume must not end the training
            print(f"rtj-launch: cannot write progress report: {exc}", file=sys.stderr)
            self._reported = (step, now)

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
        *script,
    ]


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(torchrun options, script and its args): split at the first `--`; no `--` means all script."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return [], argv


def _outcome_for(env: environment.WorkerEnv) -> completion.Outcome | None:
    outcome = completion.read_termination_message()
    if outcome is None or outcome.fields.get("attempt") != str(env.attempt):
        return None
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    extra, script = split_argv(sys.argv[1:] if argv is None else argv)
    if not script:
        print("usage: python -m resilient_trainer.launch [torchrun options] -- script.py [args]", file=sys.stderr)
        return 2
    try:
        env = environment.WorkerEnv.from_environ()
    except environment.ContractError as exc:
        print(f"rtj-launch: {exc}", file=sys.stderr)
        return 2
    # A stale message from an earlier container must not turn this run's failure into a success.
    path = completion.termination_log_path()
    if os.path.exists(path) and os.access(path, os.W_OK):
        open(path, "w").close()

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(torchrun_args(env, extra, script))
    os.environ[progress.RANK_DIR_ENV] = tempfile.mkdtemp(prefix="rtj-progress-")  # pod-local, inherited
    raw_timeout = os.environ.get(progress.TIMEOUT_ENV, "")
    timeout = float(raw_timeout) if raw_timeout.replace(".", "", 1).isdigit() and float(raw_timeout) > 0 else None
    watchdog = Watchdog(env, os.environ[progress.RANK_DIR_ENV], timeout)
    watchdog.start()
    try:
        run(args)
        return 0
    except (ChildFailedError, SignalException) as exc:
        if watchdog.hung:
            return HUNG_EXIT_CODE
        outcome = _outcome_for(env)
        if outcome is not None and outcome.succeeded:
            print(f"rtj-launch: workers recorded success ({completion.SUCCEEDED}) before failing at exit: "
                  f"{type(exc).__name__}; exiting 0", file=sys.stderr)
            return 0
        if outcome is not None and outcome.kind == completion.PREEMPTED:
            return PREEMPTED_EXIT_CODE
        if isinstance(exc, SignalException):
            return 128 + int(exc.sigval)
        return 1


if __name__ == "__main__":
    sys.exit(main())
