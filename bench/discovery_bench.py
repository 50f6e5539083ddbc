"""Checkpoint discovery: latency on a big root, in-process versus through the sandbox; RSS under attack.

1. Builds one real DCP checkpoint, copies it into N step directories (hard links keep it cheap) under
   `<mount>/bench/job`, and times discovery (median of repeats) in two cases: the newest is complete,
   and the newest K are partial saves that must be skipped first. Each case is timed in-process
   (`layout.discover`, no sandbox: the old path) and through the operator's `DiscoveryPool` (a worker
   process with its limits), in the same run, from a process that has not imported torch (as the
   operator has not).
2. Plants every attack of tests/hostile in its own root, discovers them all from a torch-free process
   that holds the pool (as the operator does), and prints what each produced, how long it took, and
   that process's peak RSS (VmHWM).

    python bench/discovery_bench.py [--dirs 10000] [--partial 20] [--repeats 7]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_contract import layout
from resilient_operator.discovery import DiscoveryPool
from resilient_operator.settings import DiscoverySettings


def save_template(path: Path) -> None:
    """A real DCP checkpoint, written by a child process so this one (the timer) never imports torch."""
    script = ("import sys, warnings, torch, torch.distributed.checkpoint as dcp\n"
              "warnings.simplefilter('ignore')\n"
              "dcp.save({'w': torch.randn(256, 256), 'b': torch.randn(256)}, checkpoint_id=sys.argv[1])\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=300)


def build(root: Path, template: Path, dirs: int, partial: int) -> None:
    files = sorted(os.listdir(template))
    for step in range(1, dirs + 1):
        dest = root / layout.step_dir_name(step)
        dest.mkdir(parents=True)
        for name in files:
            if step > dirs - partial and name == layout.METADATA_FILE:
                continue
            os.link(template / name, dest / name)


def median_time(fn, repeats: int) -> tuple[float, layout.Listing]:  # type: ignore[no-untyped-def]
    samples, found = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        found = fn()
        samples.append(time.perf_counter() - start)
    assert found is not None
    return statistics.median(samples), found


def latency(args: argparse.Namespace, base: Path, template: Path) -> None:
    print(f"{'case':<38} {'dirs':>6} {'in-process s':>13} {'sandbox s':>10} {'found':>16}")
    for partial in (0, args.partial):
        mount = base / f"mount-{partial}"
        root = mount / "bench" / "job"
        build(root, template, args.dirs, partial)
        config = DiscoverySettings(checkpoint_mount=str(mount))
        pool = DiscoveryPool(config)
        pool.warm()
        limits = layout.ScanLimits(max_steps=config.max_steps)
        inproc, a = median_time(lambda: layout.discover(str(root), str(mount / "bench"), limits), args.repeats)  # noqa: B023
        sandboxed, b = median_time(lambda: pool.discover(str(root), "bench"), args.repeats)  # noqa: B023
        pool.close()
        expected = args.dirs - partial
        assert a == b and b.latest is not None and b.latest.step == expected, (a, b)
        case = "newest complete" if not partial else f"newest {partial} partial, then complete"
        print(f"{case:<38} {args.dirs:>6} {inproc:>13.4f} {sandboxed:>10.4f} {layout.step_dir_name(expected):>16}")
        shutil.rmtree(mount)


_OPERATOR_SIDE = """
import json, sys, time
from resilient_operator.discovery import DiscoveryPool
from resilient_operator.settings import DiscoverySettings
mount, roots = sys.argv[1], json.loads(sys.argv[2])
pool = DiscoveryPool(DiscoverySettings(checkpoint_mount=mount))
pool.warm()
rows = []
for name, root in roots:
    start = time.monotonic()
    listing = pool.discover(root, "tenant-a")
    took = time.monotonic() - start
    what = listing.reason or (listing.skipped[0].reason if listing.skipped else "")
    found = listing.latest.step if listing.latest else None
    rows.append([name, round(took, 2), found, what])
pool.close()
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) // 1024
print(json.dumps({"rows": rows, "peak_rss_mib": hwm}))
"""


def attacks_table(base: Path, template: Path) -> None:
    from tests.hostile import attacks
    from tests.hostile.test_hostile_discovery import STEP_ATTACKS

    mount = base / "attacks"
    roots = []
    for i, (name, planter, _) in enumerate(STEP_ATTACKS):
        root = mount / "tenant-a" / f"job{i}"
        root.mkdir(parents=True)
        attacks.plant_genuine(template, root)
        planter(template, root)
        roots.append((name, str(root)))
    slow = mount / "tenant-a" / "slow"
    slow.mkdir()
    attacks.plant_genuine(template, slow)
    attacks.bomb_metadata("million-containers")(template, slow)
    roots += [("bomb-million-containers", str(slow)), ("root-in-other-namespace", str(mount / "tenant-b" / "x")),
              ("root-/etc", "/etc"), ("root-with-NUL", str(mount / "tenant-a" / "a\x00b"))]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", _OPERATOR_SIDE, str(mount), json.dumps(roots)], check=True,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{'attack (genuine checkpoint = step 1)':<34} {'s':>5} {'found':>5}  what discovery reported")
    for name, took, found, what in result["rows"]:
        print(f"{name:<34} {took:>5} {found!s:>5}  {what[:90]}")
    print(f"\noperator-side peak RSS (VmHWM) over {len(roots)} hostile roots: {result['peak_rss_mib']} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=10_000)
    parser.add_argument("--partial", type=int, default=20, help="must stay below RTJ_DISCOVERY_MAX_STEPS (32)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        template = base / "template"
        save_template(template)
        latency(args, base, template)
        attacks_table(base, template)


if __name__ == "__main__":
    main()
