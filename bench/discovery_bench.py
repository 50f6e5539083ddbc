"""How long checkpoint discovery takes on a root with many step directories.

Builds one real DCP checkpoint, copies it into N step directories (hard links keep it cheap), and
times `layout.discover` (median of repeats) in two cases: the newest is complete (the usual case),
and the newest K are partial saves that must be skipped first. Prints a table.

    python bench/discovery_bench.py [--dirs 10000] [--partial 100] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from resilient_contract import layout


def build(root: Path, dirs: int, partial: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    template = root / "template"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.randn(256, 256), "b": torch.randn(256)}, checkpoint_id=str(template))
    files = sorted(os.listdir(template))
    for step in range(1, dirs + 1):
        dest = root / layout.step_dir_name(step)
        dest.mkdir()
        for name in files:
            if step > dirs - partial and name == layout.METADATA_FILE:
                continue
            os.link(template / name, dest / name)
    shutil.rmtree(template)


def timed(uri: str, repeats: int) -> tuple[float, layout.Listing]:
    samples, found = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        found = layout.discover(uri)
        samples.append(time.perf_counter() - start)
    assert found is not None
    return statistics.median(samples), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=10_000)
    parser.add_argument("--partial", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"{'case':<42} {'dirs':>7} {'median s':>10} {'found':>16}")
    for partial in (0, args.partial):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            build(root, args.dirs, partial)
            median, found = timed(str(root), args.repeats)
            expected = args.dirs - partial
            assert found.latest is not None and found.latest.step == expected, found
            case = "newest complete" if not partial else f"newest {partial} partial, then complete"
            print(f"{case:<42} {args.dirs:>7} {median:>10.4f} {layout.step_dir_name(expected):>16}")


if __name__ == "__main__":
    main()
