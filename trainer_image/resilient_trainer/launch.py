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
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from resilient_contract import completion, environment

PREEMPTED_EXIT_CODE = 143


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
    try:
        run(args)
        return 0
    except (ChildFailedError, SignalException) as exc:
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
