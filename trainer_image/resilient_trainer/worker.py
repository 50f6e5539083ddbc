"""`python -m resilient_trainer.worker [-m module | script.py] args`: run a training script that dies with
its launcher.

The launcher (resilient_trainer.launch) runs each worker through this module. It asks the kernel for
SIGKILL when the parent (the launcher, which is torchrun's agent) dies (prctl PR_SET_PDEATHSIG), then runs
the script as `python script.py` / `python -m module` would. Without it a SIGKILLed launcher leaves its
workers training: they keep saving checkpoints, and retention deletes older ones, under a run that
nobody supervises any more. In a container the runtime kills them; on a workstation, under the process
substrate, or when the launcher is not PID 1, nobody does.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
from collections.abc import Sequence

from resilient_contract import progress

LAUNCHER_PID_ENV = "_RTJ_LAUNCHER_PID"  # set by the launcher: the parent a worker must die with
_PR_SET_PDEATHSIG = 1
# A worker that failed because a peer went away leaves `<progress dir>/peer-lost-<rank>`: its pod's agent then
# waits for the operator's plan (that pod can carry on), while a pod whose own script failed ends at once.
PEER_LOST_PREFIX = "peer-lost-"
_PEER_LOST_WORDS = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
                    "socket timeout", "timed out", "nccl error", "ncclremoteerror", "heartbeat")


def lost_a_peer(exc: BaseException) -> bool:
    """Whether a worker's exception looks like a lost peer (a collective's transport failing), not the script:
    torch.distributed's DistError family, or the transport's words in a RuntimeError."""
    dist_error = getattr(sys.modules.get("torch.distributed"), "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    return isinstance(exc, (RuntimeError, ConnectionError)) and any(
        w in str(exc).lower() for w in _PEER_LOST_WORDS)


def note_peer_lost(exc: BaseException) -> None:
    """Leave the marker if `exc` looks like a lost peer (best effort: never masks the exception)."""
    directory, rank = os.environ.get(progress.RANK_DIR_ENV), os.environ.get("RANK", "0")
    if directory and lost_a_peer(exc):
        try:
            with open(os.path.join(directory, f"{PEER_LOST_PREFIX}{rank}"), "w", encoding="utf-8") as f:
                f.write(type(exc).__name__)
        except OSError:
            pass


def die_with_parent(expected_parent: int | None) -> bool:
    """SIGKILL this process when its parent exits; exit now if that already happened. False when the
    platform has no prctl (then nothing is arranged)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if expected_parent is not None and os.getppid() != expected_parent:  # died before prctl took effect
        os._exit(128 + signal.SIGKILL)
    return True


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] == "-m" and len(args) < 2):
        raise SystemExit("usage: python -m resilient_trainer.worker [-m module | script.py] [args]")
    parent = os.environ.get(LAUNCHER_PID_ENV)
    die_with_parent(int(parent) if parent else None)
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = args
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))  # what `python script.py` puts there
            runpy.run_path(args[0], run_name="__main__")
    except Exception as exc:
        note_peer_lost(exc)
        raise


if __name__ == "__main__":
    main()
