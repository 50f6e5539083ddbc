"""A parked worker's critical path after its plan: what the library's imports while parked save.

An in-place restart hands a kept pod's parked worker (resilient_trainer.agent's WorkerPool: torch already
imported) its spawn; the worker then imports the script and its modules, starts the process group, builds
the model, loads the checkpoint and steps. This runs that path for real, one worker (W=1, gloo), the example
script resuming from a checkpoint, three ways, interleaved: torch alone, PREWARM_MODULES imported while parked
($RTJ_AGENT_PREWARM_IMPORTS), and those plus agent.warm_fsdp ($RTJ_AGENT_PREWARM_FSDP, the default). It prints
the medians from the spawn to each line.

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


VARIANTS = {"torch only": ("0", "0"), "+ library": ("1", "0"), "+ FSDP warm-up": ("1", "1")}


def one(variant: str, seed: Path, work: Path) -> dict[str, float]:
    """Park a worker, wait until it is ready (and idle), hand it the spawn, time each mark from the hand-over."""
    root = work / f"root-{time.monotonic_ns()}"
    shutil.copytree(seed, root / seed.name)
    read, write = os.pipe()
    imports, fsdp = VARIANTS[variant]
    env = {**os.environ, agent.READY_FD_ENV: str(write), agent.PREWARM_IMPORTS_ENV: imports,
           agent.PREWARM_FSDP_ENV: fsdp}
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
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for _ in range(args.repeats):
            for variant in VARIANTS:  # interleaved: a drifting load hits each alike
                runs[variant].append(one(variant, seed, work))
    print(f"seconds from the spawn handed to a parked worker (W=1, example script), medians of {args.repeats}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'line':<14}" + "".join(f"{v:>16}" for v in VARIANTS))
    for mark in MARKS:
        print(f"{mark:<14}" + "".join(f"{statistics.median(r[mark] for r in runs[v]):>16.2f}" for v in VARIANTS))


if __name__ == "__main__":
    main()
