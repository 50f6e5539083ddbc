"""A parked worker's critical path after its plan: what the library's imports while parked save.

An in-place restart hands a kept pod's parked worker (resilient_trainer.agent's WorkerPool: torch already
imported) its spawn; the worker then imports the script and its modules, starts the process group, builds
the model, loads the checkpoint and steps. This runs that path for real, one worker (W=1, gloo), the example
script resuming from a checkpoint, with and without PREWARM_MODULES imported while parked
($RTJ_AGENT_PREWARM_IMPORTS), interleaved, and prints the medians from the spawn to each line.

    python bench/parked_worker_bench.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "trainer_image"), str(ROOT / "operator")]

from resilient_trainer import agent  # noqa: E402

SCRIPT = ["-m", "resilient_trainer.examples.tiny_gpt", "--steps=6", "--checkpoint-every=0"]
MARKS = ("RTJ_START", "RTJ_RESUMED", "RTJ_STEP")


def seed_checkpoint(root: Path) -> Path:
    """A checkpoint at step 5 of the example, written once."""
    subprocess.run([sys.executable, "-m", "resilient_trainer.examples.tiny_gpt", "--steps=5", "--checkpoint-every=5",
                    f"--checkpoint-root={root}"], check=True, capture_output=True, timeout=300)
    return next(root.glob("step-*"))


def one(prewarm: bool, seed: Path, work: Path) -> dict[str, float]:
    """Park a worker, wait until it is ready (and idle), hand it the spawn, time each mark from the hand-over."""
    root = work / f"root-{time.monotonic_ns()}"
    shutil.copytree(seed, root / seed.name)
    read, write = os.pipe()
    env = {**os.environ, agent.READY_FD_ENV: str(write), agent.PREWARM_IMPORTS_ENV: "1" if prewarm else "0"}
    env.pop("RANK", None)
    proc = subprocess.Popen([sys.executable, "-u", "-m", agent.MODULE, agent.WORKER_FLAG], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            pass_fds=(write,))
    os.close(write)
    os.read(read, 1)  # parked: its imports are done
    os.close(read)
    time.sleep(1.0)  # and settled
    spec = {"argv": [*SCRIPT, f"--checkpoint-root={root}", f"--resume-from={root / seed.name}"],
            "environ": {k: v for k, v in env.items() if k != agent.READY_FD_ENV}}
    assert proc.stdin is not None and proc.stdout is not None
    t0 = time.monotonic()
    proc.stdin.write(json.dumps(spec) + "\n")
    proc.stdin.close()
    seen: dict[str, float] = {}
    for line in proc.stdout:
        mark = line.split(" ", 1)[0]
        if mark in MARKS and mark not in seen:
            seen[mark] = time.monotonic() - t0
    proc.wait(timeout=120)
    shutil.rmtree(root, ignore_errors=True)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        seed = seed_checkpoint(work / "seed")
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for prewarm in (False, True):  # interleaved: a drifting load hits both alike
                runs[prewarm].append(one(prewarm, seed, work))
    print(f"seconds from the spawn handed to a parked worker (W=1, example script), medians of {args.repeats}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'line':<14}{'torch only':>12}{'+ library':>12}{'saved':>8}")
    for mark in MARKS:
        a = statistics.median(r[mark] for r in runs[False])
        b = statistics.median(r[mark] for r in runs[True])
        print(f"{mark:<14}{a:>12.2f}{b:>12.2f}{a - b:>8.2f}")


if __name__ == "__main__":
    main()
